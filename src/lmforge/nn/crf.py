"""Linear-chain conditional random field over per-position tag scores (emissions).

Shape legend: B batch, N sequence length (words), L number of tags.

A tag path y_1 .. y_n of a sequence with emissions E (n, L) scores

    s(y) = start[y_1] + sum_t E[t, y_t] + sum_{t>1} transitions[y_{t-1}, y_t] + end[y_n]

and has probability exp(s(y)) / Z with Z = sum over all L^n paths. ``log_partition`` computes log Z with the
forward algorithm, ``viterbi`` the best path; both are vectorised over the batch and loop over positions only.

Masks: ``mask`` (B, N) bool, True = real position; the real positions of a row are a prefix (the row's length),
and a row may be empty (length 0: log Z = 0, score 0, empty path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError

__all__ = ["FORBIDDEN", "LinearChainCRF"]

# Added to the score of a forbidden start/transition/end. Finite (not -inf) so that logsumexp never sees a row
# of -inf (NaN gradients) and a sequence whose gold path is forbidden still gets a finite (huge) loss; exp(-1e4)
# is exactly 0 in fp32, so forbidden paths get zero probability and Viterbi never prefers one.
FORBIDDEN = -1e4


class LinearChainCRF(nn.Module):
    """Linear-chain CRF (Lafferty, McCallum & Pereira, 2001), the tagging layer of Lample et al. (2016),
    "Neural Architectures for Named Entity Recognition", section 2.2, with start and end scores.

    Parameters (state-dict keys): ``start`` (L,), ``transitions`` (L, L) indexed [from, to], ``end`` (L,), all
    initialised to zero, so an untrained CRF without constraints gives every position the softmax of its
    emissions (its NLL equals the summed per-position cross-entropy); Lample et al. initialise randomly.

    Constraints (e.g. BIO: ``I-X`` only after ``B-X`` or ``I-X``) are bool masks, True = allowed. They are stored
    as non-persistent buffers (rebuilt from the options, not saved) and added as ``FORBIDDEN`` to the scores in
    both training and decoding, so forbidden paths have zero probability and Viterbi never returns one. A gold
    path that breaks a constraint gets a loss near 1e4 (fix the data or the scheme).
    """

    def __init__(self, num_tags: int, *, allowed_start: Sequence[bool] | Tensor | None = None,
                 allowed_transitions: Sequence[Sequence[bool]] | Tensor | None = None,
                 allowed_end: Sequence[bool] | Tensor | None = None) -> None:
        """
        Args:
            num_tags: L >= 1.
            allowed_start: (L,) bool, which tags may begin a sequence; None = all.
            allowed_transitions: (L, L) bool [from, to], which tag may follow which; None = all.
            allowed_end: (L,) bool, which tags may end a sequence; None = all.
        """
        super().__init__()
        if num_tags < 1:
            raise LmforgeError(f"a CRF needs at least one tag; got num_tags={num_tags}")
        self.num_tags = num_tags
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))
        self.register_buffer("start_penalty", _penalty(allowed_start, (num_tags,), "allowed_start"),
                             persistent=False)
        self.register_buffer("transition_penalty",
                             _penalty(allowed_transitions, (num_tags, num_tags), "allowed_transitions"),
                             persistent=False)
        self.register_buffer("end_penalty", _penalty(allowed_end, (num_tags,), "allowed_end"), persistent=False)

    # ------------------------------------------------------------------ scores with constraints applied
    def _scores(self) -> tuple[Tensor, Tensor, Tensor]:
        return (self.start.float() + self.start_penalty, self.transitions.float() + self.transition_penalty,
                self.end.float() + self.end_penalty)  # (L,), (L, L), (L,)

    def _check(self, emissions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        if emissions.dim() != 3 or emissions.shape[-1] != self.num_tags:
            raise LmforgeError(f"CRF emissions must be (batch, length, num_tags={self.num_tags}); got "
                               f"{tuple(emissions.shape)}")
        B, N, _ = emissions.shape
        if mask is None:
            mask = torch.ones(B, N, dtype=torch.bool, device=emissions.device)
        if tuple(mask.shape) != (B, N):
            raise LmforgeError(f"CRF mask must be (batch={B}, length={N}); got {tuple(mask.shape)}")
        mask = mask.bool()
        if N > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise LmforgeError("the CRF mask must mark a prefix of each row as real (True...True False...False); "
                               "a real position follows a padded one")
        return emissions.float(), mask  # fp32: the forward algorithm sums many terms

    # ------------------------------------------------------------------ training
    def log_partition(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """log Z per sequence by the forward algorithm (in fp32).

        Args:
            emissions: (B, N, L) tag scores.
            mask: (B, N) bool, True = real position (a prefix of each row); None = all real.

        Returns:
            (B,) log Z; 0 for an empty row.
        """
        emissions, mask = self._check(emissions, mask)
        B, N, _ = emissions.shape
        if N == 0:
            return emissions.new_zeros(B)
        start, trans, end = self._scores()
        alpha = start + emissions[:, 0]  # (B, L) log-sum of the paths ending in each tag at position 0
        for t in range(1, N):
            step = torch.logsumexp(alpha.unsqueeze(2) + trans, dim=1) + emissions[:, t]  # (B, L) [from] summed
            alpha = torch.where(mask[:, t, None], step, alpha)  # padded positions carry alpha through
        log_z = torch.logsumexp(alpha + end, dim=1)  # (B,)
        return log_z.masked_fill(~mask[:, 0], 0.0)

    def score(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
        """Unnormalised score s(y) of given tag paths.

        Args:
            emissions: (B, N, L).
            tags: (B, N) integer tags in [0, L) at real positions; anything (e.g. -100) at padding.
            mask: (B, N) bool, True = real position; None = all real.

        Returns:
            (B,) path scores; 0 for an empty row.
        """
        emissions, mask = self._check(emissions, mask)
        B, N, L = emissions.shape
        if tuple(tags.shape) != (B, N):
            raise LmforgeError(f"CRF tags must be (batch={B}, length={N}) like the mask; got {tuple(tags.shape)}")
        if N == 0:
            return emissions.new_zeros(B)
        real = tags[mask]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= L):
            raise LmforgeError(f"CRF tags at real positions must lie in [0, {L}); got values from {int(real.min())} "
                               f"to {int(real.max())} (is a real word labelled -100?)")
        start, trans, end = self._scores()
        y = tags.masked_fill(~mask, 0).long()  # (B, N) padding -> tag 0, then masked out below
        m = mask.float()
        emit = emissions.gather(2, y.unsqueeze(2)).squeeze(2)  # (B, N)
        total = start[y[:, 0]] * m[:, 0] + (emit * m).sum(1)  # (B,)
        if N > 1:
            total = total + (trans[y[:, :-1], y[:, 1:]] * m[:, 1:]).sum(1)  # (B,) pairs inside the row
        last = (mask.sum(1) - 1).clamp(min=0)  # (B,) index of the last real position
        return total + end[y.gather(1, last.unsqueeze(1)).squeeze(1)] * m[:, 0]

    def nll(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
        """Negative log-likelihood ``log Z - s(y)`` per sequence (>= 0).

        Args:
            emissions: (B, N, L).
            tags: (B, N) gold tags; ignored (e.g. -100) at padding.
            mask: (B, N) bool, True = real position; None = all real.

        Returns:
            (B,) fp32 NLL; 0 for an empty row.
        """
        return self.log_partition(emissions, mask) - self.score(emissions, tags, mask)

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def viterbi(self, emissions: Tensor, mask: Tensor | None = None) -> list[list[int]]:
        """The highest-scoring path of each row (Viterbi), respecting the constraints.

        Args:
            emissions: (B, N, L).
            mask: (B, N) bool, True = real position; None = all real.

        Returns:
            B lists of tag ids, each as long as its row's real prefix.
        """
        emissions, mask = self._check(emissions, mask)
        B, N, L = emissions.shape
        if N == 0:
            return [[] for _ in range(B)]
        start, trans, end = self._scores()
        keep = torch.arange(L, device=emissions.device).expand(B, L)  # back-pointer "stay" for padded steps
        delta = start + emissions[:, 0]  # (B, L) best score of a path ending in each tag
        pointers = []
        for t in range(1, N):
            best, arg = (delta.unsqueeze(2) + trans).max(dim=1)  # (B, L) over the previous tag
            real = mask[:, t, None]
            delta = torch.where(real, best + emissions[:, t], delta)
            pointers.append(torch.where(real, arg, keep))  # (B, L); identity through padding
        tag = (delta + end).argmax(dim=1)  # (B,) last tag of the best path
        path = [tag]
        for arg in reversed(pointers):  # padded steps map a tag to itself, so every row backtracks at once
            tag = arg.gather(1, tag.unsqueeze(1)).squeeze(1)
            path.append(tag)
        rows = torch.stack(path[::-1], dim=1).tolist()  # (B, N); a row's padded tail repeats its last tag
        lengths = mask.sum(1).tolist()
        return [row[:n] for row, n in zip(rows, lengths, strict=True)]

    def extra_repr(self) -> str:
        constrained = bool((self.transition_penalty < 0).any() or (self.start_penalty < 0).any()
                           or (self.end_penalty < 0).any())
        return f"num_tags={self.num_tags}, constrained={constrained}"


def _penalty(allowed: Sequence | Tensor | None, shape: tuple[int, ...], name: str) -> Tensor:
    """A bool allowed-mask -> additive float penalty (0 allowed, FORBIDDEN otherwise)."""
    if allowed is None:
        return torch.zeros(shape)
    mask = torch.as_tensor(allowed)
    if tuple(mask.shape) != shape:
        raise LmforgeError(f"{name} must have shape {shape} (one entry per tag); got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or bool(((mask != 0) & (mask != 1)).any()):
            raise LmforgeError(f"{name} must be booleans (True = allowed); got dtype {mask.dtype}")
        mask = mask != 0
    return torch.where(mask, 0.0, FORBIDDEN)
