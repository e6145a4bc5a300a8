"""LinearChainCRF against brute-force enumeration of all paths, constraints, padding invariance, gradients."""

from __future__ import annotations

import itertools

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn.crf import LinearChainCRF

L, N = 3, 4
LENGTHS = [4, 1, 0, 3]


def random_crf(seed: int = 0, **constraints) -> LinearChainCRF:
    torch.manual_seed(seed)
    crf = LinearChainCRF(L, **constraints)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_(0, 1)
    return crf


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emissions = torch.randn(len(LENGTHS), N, L, generator=g) * 2
    mask = torch.arange(N) < torch.tensor(LENGTHS)[:, None]
    return emissions, mask


@torch.no_grad()
def path_score(crf: LinearChainCRF, emissions: torch.Tensor, path: tuple[int, ...]) -> float:
    """s(y) written out from the definition, one term at a time (no constraints)."""
    if not path:
        return 0.0
    s = crf.start[path[0]] + crf.end[path[-1]]
    for t, y in enumerate(path):
        s = s + emissions[t, y]
        if t:
            s = s + crf.transitions[path[t - 1], y]
    return float(s)


def allowed_path(path, start, trans, end) -> bool:
    return not path or (start[path[0]] and end[path[-1]] and all(trans[a][b] for a, b in itertools.pairwise(path)))


# Start only in tag 0 or 1; tag 2 only after tag 1 or 2 (like O, B-X, I-X); end anywhere but tag 1.
START = [True, True, False]
TRANS = [[True, True, False], [True, True, True], [True, True, True]]
END = [True, False, True]


@pytest.mark.parametrize("constrained", [False, True])
def test_partition_and_viterbi_equal_brute_force(constrained: bool) -> None:
    kw = dict(allowed_start=START, allowed_transitions=TRANS, allowed_end=END) if constrained else {}
    crf = random_crf(**kw)
    emissions, mask = batch()
    log_z = crf.log_partition(emissions, mask).detach()
    best = crf.viterbi(emissions, mask)
    for b, n in enumerate(LENGTHS):
        paths = list(itertools.product(range(L), repeat=n))
        if constrained:
            paths = [p for p in paths if allowed_path(p, START, TRANS, END)]
        scores = torch.tensor([path_score(crf, emissions[b], p) for p in paths], dtype=torch.float64)
        expected = float(torch.logsumexp(scores, 0)) if n else 0.0
        assert float(log_z[b]) == pytest.approx(expected, abs=1e-4)
        assert tuple(best[b]) == paths[int(scores.argmax())]
        assert len(best[b]) == n


def test_score_matches_definition_and_ignores_padding_tags() -> None:
    crf = random_crf()
    emissions, mask = batch()
    g = torch.Generator().manual_seed(3)
    tags = torch.randint(0, L, (len(LENGTHS), N), generator=g).masked_fill(~mask, -100)
    got = crf.score(emissions, tags, mask).detach()
    for b, n in enumerate(LENGTHS):
        assert float(got[b]) == pytest.approx(path_score(crf, emissions[b], tuple(tags[b, :n].tolist())), abs=1e-5)


def test_viterbi_never_returns_a_forbidden_path() -> None:
    crf = random_crf(seed=5, allowed_start=START, allowed_transitions=TRANS, allowed_end=END)
    g = torch.Generator().manual_seed(0)
    # Emissions that strongly favour forbidden moves (tag 2 first, tag 1 last) must still be overridden.
    emissions = torch.randn(50, 6, L, generator=g) * 5
    emissions[:, 0, 2] += 20
    emissions[:, -1, 1] += 20
    lengths = torch.randint(0, 7, (50,), generator=g)
    mask = torch.arange(6) < lengths[:, None]
    for path, n in zip(crf.viterbi(emissions, mask), lengths.tolist(), strict=True):
        assert len(path) == n
        assert allowed_path(path, START, TRANS, END), path


def test_nll_is_non_negative_and_gradients_flow() -> None:
    crf = random_crf(allowed_start=START, allowed_transitions=TRANS, allowed_end=END)
    emissions, mask = batch()
    emissions.requires_grad_(True)
    tags = torch.tensor([[0, 1, 2, 0], [1, -100, -100, -100], [-100] * 4, [1, 2, 2, -100]])
    nll = crf.nll(emissions, tags, mask)
    assert nll.shape == (len(LENGTHS),)
    assert bool((nll.detach()[[0, 1, 3]] > 0).all())
    assert float(nll.detach()[2]) == 0.0  # the empty row
    nll.sum().backward()
    for p in (emissions, crf.start, crf.transitions, crf.end):
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and float(p.grad.abs().sum()) > 0
    assert float(emissions.grad[~mask].abs().sum()) == 0.0  # padding gets no gradient


def test_zero_parameters_without_constraints_equal_softmax_cross_entropy() -> None:
    crf = LinearChainCRF(L)
    emissions, mask = batch()
    tags = torch.randint(0, L, mask.shape).masked_fill(~mask, -100)
    ce = torch.nn.functional.cross_entropy(emissions.reshape(-1, L), tags.reshape(-1), reduction="none")
    per_row = ce.reshape(mask.shape).sum(1)
    torch.testing.assert_close(crf.nll(emissions, tags, mask), per_row)


def test_padding_invariance() -> None:
    crf = random_crf(allowed_start=START, allowed_transitions=TRANS, allowed_end=END)
    emissions, mask = batch()
    tags = torch.tensor([[0, 1, 2, 0], [1, 0, 0, 0], [0] * 4, [1, 2, 2, 0]])
    noisy = emissions.masked_fill(~mask[..., None], 1e3)  # huge scores at padding must not matter
    wider = torch.cat([noisy, torch.randn(len(LENGTHS), 2, L) * 50], dim=1)
    wider_mask = torch.cat([mask, torch.zeros(len(LENGTHS), 2, dtype=torch.bool)], dim=1)
    wider_tags = torch.cat([tags, torch.full((len(LENGTHS), 2), -100)], dim=1)
    torch.testing.assert_close(crf.nll(wider, wider_tags, wider_mask), crf.nll(emissions, tags, mask))
    assert crf.viterbi(wider, wider_mask) == crf.viterbi(emissions, mask)
    for b, n in enumerate(LENGTHS):  # each row alone, unpadded
        alone = crf.log_partition(emissions[b:b + 1, :n], None) if n else torch.zeros(1)
        batched = crf.log_partition(emissions, mask).detach()[b]
        assert float(alone.detach()[0]) == pytest.approx(float(batched), abs=1e-5)


def test_constraints_are_not_saved_and_errors_are_clear() -> None:
    crf = LinearChainCRF(L, allowed_transitions=TRANS)
    assert set(crf.state_dict()) == {"start", "transitions", "end"}
    with pytest.raises(LmforgeError, match="allowed_start must have shape"):
        LinearChainCRF(L, allowed_start=[True, False])
    emissions, mask = batch()
    with pytest.raises(LmforgeError, match="prefix"):
        crf.log_partition(emissions, torch.tensor([[True, False, True, False]] * len(LENGTHS)))
    with pytest.raises(LmforgeError, match=r"\[0, 3\)"):
        crf.nll(emissions, torch.full(mask.shape, -100), mask)
