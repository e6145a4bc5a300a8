"""``generate``: greedy search, beam search and sampling over any model adapter.

Shape legend: B inputs, k beams, N live rows (inputs, inputs x samples, or inputs x beams), V vocab, L context.

Every search runs the same loop: the adapter gives the first new token's logits, the logits processors adjust them
(``lmforge.generation.processors``), a token is chosen per row, and the adapter steps with the chosen tokens.
A row ends when it emits a stop token (``eos_id`` or one of ``stop_ids``) or reaches ``max_new_tokens``. Finished
rows leave the batch (the adapter's state is reordered without them), so they cost nothing afterwards and emit
nothing (``GenerationOutput.padded`` fills their tail with ``pad_id``); the loop ends when no row is left.

Beam search (Wu et al. 2016, section 7; fairseq's formulation). Per input, k live hypotheses with their sums of
log-probabilities S (the first step starts from one hypothesis). At each step every live hypothesis is extended
by every token; of the k x V candidates (S + log p), the best 2k are examined in order:
    * a candidate ending in a stop token, if it is among the best k, is finished: it moves to the input's
      finished list with score S / lp(|Y|) (``config.length_penalty``; |Y| counts the stop token);
    * other candidates become the new live hypotheses, until k are kept (2k candidates always hold k that do not
      end in a stop token, unless tokens were forbidden).
At the last step (``max_new_tokens``) the live hypotheses are finished as they are. An input stops earlier when
it has t finished hypotheses and no live one can still beat the t-th best of them, so stopping early never
changes the result. The bound: extending a hypothesis only lowers S (log p <= 0), so a live hypothesis of length
l with sum S, and every hypothesis descending from it, can at best finish with score S / lp(l') for some l' in
[l + 1, max_new_tokens]; as S <= 0 and lp is monotone in l', the best is S / max(lp(l + 1), lp(max_new_tokens)).
With ``none`` that is S itself (the next token only lowers it); with ``average`` or ``gnmt`` (alpha > 0), whose lp
grows with the length, it is S / lp(max_new_tokens), so inputs often run to ``max_new_tokens``: the price of never
cutting off a hypothesis that the penalty would rank higher (Hugging Face's default ``early_stopping=False``
uses the current length instead, a heuristic that can stop too early). The t best finished hypotheses are
returned, best first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.generation.adapters import GenerationAdapter, adapter_for, scratch_rows
from lmforge.generation.config import GenerationConfig, GenerationOutput, length_penalty
from lmforge.generation.processors import LogitsProcessor, apply_processors, build_processors, build_warpers

__all__ = ["argmax_rows", "beam_search", "generate", "greedy_or_sample", "length_normalizer", "row_topk"]

NEG_INF = float("-inf")


def generate(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    config: GenerationConfig | None = None,
    generator: torch.Generator | None = None,
    **overrides: Any,
) -> GenerationOutput:
    """Generate continuations (decoder-only) or targets (encoder-decoder) for a batch of inputs.

    Args:
        model: a ``Decoder``, an ``EncoderDecoder``, an ``RNNSeq2Seq`` (or any model with ``encode`` /
            ``decode_step`` / ``reorder_state``), or an adapter (``start`` / ``step`` / ``reorder``); see
            ``lmforge.generation.adapters``. It runs in eval mode (its modes are restored afterwards).
        input_ids: (B, W) the prompts (decoder-only) or the sources (encoder-decoder).
        attention_mask: (B, W) 1 = real token, 0 = padding; any padding layout (decoder-only prompts are
            re-packed to left padding). None = no padding.
        config: the decoding settings (default ``GenerationConfig()``: greedy, 20 new tokens).
        generator: random generator for sampling (default: one seeded with ``config.seed``).
        **overrides: fields of ``GenerationConfig`` to change, e.g. ``strategy="beam", num_beams=4``.

    Returns:
        GenerationOutput: per input its best hypotheses (new tokens only, without the stop token), their scores,
        log-probabilities and stop tokens.

    Raises:
        LmforgeError: invalid options (unknown names, k < t, top_p outside (0, 1], ...), an empty prompt, a prompt
            longer than the model's context, token ids outside the vocabulary.
    """
    config = config if config is not None else GenerationConfig()
    if not isinstance(config, GenerationConfig):
        raise LmforgeError(f"config must be a GenerationConfig; got {type(config).__name__}")
    if overrides:
        config = config.replace(**overrides)
    if not isinstance(input_ids, Tensor):
        raise LmforgeError(f"input_ids must be a (batch, length) tensor of token ids; got {type(input_ids).__name__}")
    adapter = adapter_for(model, use_cache=config.use_cache, bos_id=config.bos_id)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif not isinstance(attention_mask, Tensor):
        raise LmforgeError(f"attention_mask must be a tensor like input_ids; got {type(attention_mask).__name__}")
    input_ids, attention_mask, max_new_tokens = adapter.prepare(input_ids, attention_mask, config.max_new_tokens)
    processors = build_processors(config)
    module = model if isinstance(model, nn.Module) else getattr(adapter, "model", None)
    with torch.inference_mode(), _eval_mode(module):
        if config.strategy == "beam":
            return beam_search(adapter, input_ids, attention_mask, config, processors, max_new_tokens)
        if config.strategy == "sample" and generator is None:
            generator = torch.Generator(input_ids.device)
            if config.seed is None:
                generator.seed()
            else:
                generator.manual_seed(config.seed)
        return greedy_or_sample(adapter, input_ids, attention_mask, config, processors, max_new_tokens,
                                generator if config.strategy == "sample" else None, build_warpers(config))


@contextmanager
def _eval_mode(module: nn.Module | None) -> Iterator[None]:
    # Dropout would make generation random; restore each submodule's own mode afterwards.
    modes = [(m, m.training) for m in module.modules()] if isinstance(module, nn.Module) else []
    if not any(training for _, training in modes):
        yield
        return
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _check_token_ids(config: GenerationConfig, vocab_size: int) -> None:
    named = [("eos_id", config.eos_id), ("bos_id", config.bos_id)] + [("stop_ids", s) for s in config.stop_ids]
    bad = [f"{name}={value}" for name, value in named if value is not None and value >= vocab_size]
    if bad:
        raise LmforgeError(f"{', '.join(bad)} outside the model's vocabulary (size {vocab_size}; valid ids are "
                           f"0..{vocab_size - 1})")


def argmax_rows(x: Tensor) -> Tensor:
    """``x.argmax(dim=-1)`` of a (N, V) tensor (the first index of the maximum, as torch).

    On CPU this goes through NumPy: torch 2.x's CPU argmax reduction is not vectorised and took 0.9 ms on (8, 50257)
    float32 where NumPy's took 0.06 ms (measured on the benchmark machine), a visible share of a greedy step.
    """
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() == 2:
        return torch.from_numpy(x.numpy().argmax(axis=-1)).long()  # (N,)
    return x.argmax(dim=-1)


TOPK_BLOCK = 256  # elements per block of ``row_topk``'s first pass


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=-1)`` of a (N, V) tensor with V much larger than k, in two cheap passes.

    The rows are cut into blocks of ``TOPK_BLOCK``; every one of a row's k largest entries lies in one of the k
    blocks with the largest maxima, so the top k of those k blocks' entries is the row's top k. One ``amax`` over
    the row and a top-k over k x ``TOPK_BLOCK`` entries replace a top-k over all V: on a 50,257-token vocabulary,
    about a fifth of the time. Exact: the same values and indices as ``topk`` (values sorted, best first), except
    the order among exactly equal values, which ``topk`` does not define either. Where two blocks tie for the k-th
    largest maximum, or a row holds NaN, or V is small, it is ``topk`` itself.
    """
    N, V = x.shape
    k = min(k, V)
    blocks = V // TOPK_BLOCK
    if blocks <= 4 * k or x.device.type != "cpu":
        return x.topk(k, dim=-1)
    body = blocks * TOPK_BLOCK
    maxima = x[:, :body].reshape(N, blocks, TOPK_BLOCK).amax(-1)  # (N, blocks)
    if body < V:  # the tail, a shorter last block
        maxima = torch.cat((maxima, x[:, body:].amax(-1, keepdim=True)), dim=1)
    best, chosen = maxima.topk(k + 1, dim=-1)  # (N, k + 1): one more, to see a tie at the boundary
    if bool((best[:, k - 1] == best[:, k]).any()) or bool(torch.isnan(best[:, 0]).any()):
        return x.topk(k, dim=-1)
    columns = (chosen[:, :k, None] * TOPK_BLOCK + torch.arange(TOPK_BLOCK, device=x.device)).reshape(N, -1)
    columns = columns.clamp_(max=V - 1)  # the tail block is shorter: its overhang repeats the last entry
    values, where = x.gather(1, columns).topk(k, dim=-1)  # (N, k)
    return values, columns.gather(1, where)


def _expand(index: Tensor, *tensors: Tensor) -> list[Tensor]:
    return [t.index_select(0, index) for t in tensors]


def _no_token_allowed(rows: list[int]) -> LmforgeError:
    return LmforgeError(f"every token is forbidden for row(s) {rows} (no_repeat_ngram_size forbids all of the "
                        "vocabulary); use a smaller no_repeat_ngram_size or fewer new tokens")


# ---------------------------------------------------------------------------------------------- greedy, sample
def greedy_or_sample(
    adapter: GenerationAdapter,
    input_ids: Tensor,
    attention_mask: Tensor,
    config: GenerationConfig,
    processors: list[LogitsProcessor],
    max_new_tokens: int,
    generator: torch.Generator | None,
    warpers: list[LogitsProcessor] | None = None,
) -> GenerationOutput:
    """Greedy search (``generator`` None) or sampling: one token per row per step.

    Sampling draws ``config.num_return_sequences`` independent hypotheses per input (rows i * t .. i * t + t - 1
    follow input i), from the softmax of the processed and warped logits.

    Args:
        adapter: see ``lmforge.generation.adapters``; input_ids / attention_mask as its ``prepare`` returned them.
        processors: from ``build_processors(config)``: they define the scores.
        generator: the random generator of sampling; None = greedy search.
        warpers: from ``build_warpers(config)``: temperature, top-k, top-p (sampling only).

    Returns:
        GenerationOutput with t hypotheses per input (1 for greedy), in sampling order.
    """
    B = input_ids.shape[0]
    t = config.num_return_sequences if generator is not None else 1
    context, context_mask = adapter.context(input_ids, attention_mask)
    logits, state = adapter.start(input_ids, attention_mask, max_new_tokens)  # (B, V)
    _check_token_ids(config, logits.shape[-1])
    if t > 1:
        index = torch.arange(B, device=logits.device).repeat_interleave(t)
        state = adapter.reorder(state, index)
        logits, context, context_mask = _expand(index, logits, context, context_mask)
    n_rows = B * t
    alive = list(range(n_rows))  # output row of each live batch row
    tokens: list[list[int]] = [[] for _ in range(n_rows)]
    sums = [0.0] * n_rows
    stops: list[int | None] = [None] * n_rows
    stop_set = set(config.stop_set)
    track_context = bool(processors)
    logp_buffer: Tensor | None = None
    for step in range(max_new_tokens):
        if processors:
            logits = apply_processors(processors, logits, context, context_mask)
        logp_buffer = scratch_rows(logp_buffer, *logits.shape, logits)
        logp = torch.log_softmax(logits, dim=-1, out=logp_buffer[:logits.shape[0]])  # (N, V), see beam_search
        if processors:
            blocked = torch.isneginf(logits).all(dim=-1)  # (N,) rows with every token forbidden
            if bool(blocked.any()):
                raise _no_token_allowed([alive[r] for r in blocked.nonzero().flatten().tolist()])
        if generator is None:
            next_ids = argmax_rows(logp)  # (N,)
        else:
            warped = apply_processors(warpers, logits, context, context_mask) if warpers else logits
            next_ids = torch.multinomial(warped.softmax(dim=-1), 1, generator=generator).squeeze(1)  # (N,)
        chosen = logp.gather(1, next_ids[:, None]).squeeze(1).tolist()
        next_list = next_ids.tolist()
        finished = []
        for r, (row, token, lp) in enumerate(zip(alive, next_list, chosen, strict=True)):
            sums[row] += lp
            if token in stop_set:
                stops[row] = token
                finished.append(r)
            else:
                tokens[row].append(token)
        if step == max_new_tokens - 1:
            break
        if finished:
            gone = set(finished)
            keep = [r for r in range(len(alive)) if r not in gone]
            if not keep:
                break
            index = torch.tensor(keep, device=next_ids.device)
            state = adapter.reorder(state, index)
            next_ids, context, context_mask = _expand(index, next_ids, context, context_mask)
            alive = [alive[r] for r in keep]
        if track_context:
            context = torch.cat((context, next_ids[:, None]), dim=1)  # (N, L + 1)
            context_mask = torch.cat((context_mask, context_mask.new_ones((len(alive), 1))), dim=1)
        logits, state = adapter.step(state, next_ids)
    group = range(0, n_rows, t)
    return GenerationOutput(
        sequences=[tokens[i:i + t] for i in group],
        scores=[sums[i:i + t] for i in group],
        log_probs=[sums[i:i + t] for i in group],
        stop_tokens=[stops[i:i + t] for i in group],
        pad_id=config.pad_id,
    )


# ---------------------------------------------------------------------------------------------------- beam
def length_normalizer(spec: str) -> Any:
    """lp(n) for a length-penalty name (see ``lmforge.generation.config``): score = S / lp(|Y|)."""
    name, alpha = length_penalty(spec)
    if name == "none":
        return lambda n: 1.0
    if name == "average":
        return lambda n: float(n)
    return lambda n: ((5.0 + n) / 6.0) ** alpha


def beam_search(
    adapter: GenerationAdapter,
    input_ids: Tensor,
    attention_mask: Tensor,
    config: GenerationConfig,
    processors: list[LogitsProcessor],
    max_new_tokens: int,
) -> GenerationOutput:
    """Beam search with ``config.num_beams`` beams, returning ``config.num_return_sequences`` hypotheses per input
    (see the module docstring for the formulation and the stopping rule).

    Args:
        adapter: see ``lmforge.generation.adapters``; input_ids / attention_mask as its ``prepare`` returned them.
        processors: from ``build_processors(config)``: applied to every beam's logits before the log-softmax.

    Returns:
        GenerationOutput with the best t finished hypotheses per input, best first (fewer only when forbidden
        tokens left fewer than t hypotheses).
    """
    B = input_ids.shape[0]
    k, t = config.num_beams, config.num_return_sequences
    lp = length_normalizer(config.length_penalty)
    stop_set = set(config.stop_set)
    context, context_mask = adapter.context(input_ids, attention_mask)
    logits, state = adapter.start(input_ids, attention_mask, max_new_tokens)  # (B, V)
    V = logits.shape[-1]
    _check_token_ids(config, V)
    index = torch.arange(B, device=logits.device).repeat_interleave(k)
    state = adapter.reorder(state, index)
    logits, context, context_mask = _expand(index, logits, context, context_mask)  # (B k, ...)
    # Only the first beam of each input is live at the start; the others would duplicate it.
    beam_scores = torch.full((B, k), NEG_INF, dtype=logits.dtype, device=logits.device)
    beam_scores[:, 0] = 0.0
    active = list(range(B))  # input of each group of k rows
    finished: list[list[tuple[float, float, list[int], int | None]]] = [[] for _ in range(B)]
    generated = input_ids.new_zeros((B * k, 0))  # (N, step)
    n_cand = min(2 * k, k * V)
    logp_buffer: Tensor | None = None
    for step in range(max_new_tokens):
        length, last = step + 1, step == max_new_tokens - 1
        if processors:
            full = torch.cat((context, generated), dim=1)
            full_mask = torch.cat((context_mask, context_mask.new_ones(generated.shape)), dim=1)
            logits = apply_processors(processors, logits, full, full_mask)
        # into one buffer kept across steps: a fresh (A k, V) tensor every step is, under glibc malloc, a fresh
        # mapping whose pages fault in again (measured: log_softmax 1.8x slower that way at batch 8 x 4 beams)
        logp_buffer = scratch_rows(logp_buffer, *logits.shape, logits)
        logp = torch.log_softmax(logits, dim=-1, out=logp_buffer[:logits.shape[0]])  # (A k, V)
        if processors:  # a row whose tokens are all forbidden has log_softmax NaN; it has no candidate
            logp = logp.masked_fill(torch.isneginf(logits).all(dim=-1, keepdim=True), NEG_INF)
        A = len(active)
        # the best 2k of each beam's row first (adding the beam's S keeps a row's order), then the best 2k of those:
        # the same candidates as the best 2k of all k x V, without forming the (A, k V) sums
        per_row = min(n_cand, V)
        row_values, row_tokens = row_topk(logp, per_row)  # (A k, per_row)
        candidates = (beam_scores.reshape(-1, 1) + row_values).reshape(A, k * per_row)
        values, flat = candidates.topk(n_cand, dim=1)  # (A, 2k), best first
        tokens = row_tokens.reshape(A, k * per_row).gather(1, flat)
        values_l, beams_l, tokens_l = values.tolist(), (flat // per_row).tolist(), tokens.tolist()
        rows: list[int] = []
        next_tokens: list[int] = []
        next_scores: list[float] = []
        keep_groups: list[int] = []
        for a in range(A):
            b = active[a]
            live: list[tuple[float, int, int]] = []  # (S, source row, token)
            for j in range(n_cand):
                value, beam, token = values_l[a][j], beams_l[a][j], tokens_l[a][j]
                if value == NEG_INF:
                    break
                if token in stop_set:
                    if j < k:
                        _add_finished(finished[b], k, value, lp(length), generated[a * k + beam].tolist(), token)
                    continue
                live.append((value, a * k + beam, token))
                if len(live) == k:
                    break
            if not live:  # forbidden tokens left nothing to extend: done if anything finished, else an error
                if not finished[b]:
                    raise _no_token_allowed([b])
                continue
            if last:
                for value, row, token in live:
                    _add_finished(finished[b], k, value, lp(length), generated[row].tolist() + [token], None)
                continue
            if _input_done(finished[b], t, live[0][0], max(lp(length + 1), lp(max_new_tokens))):
                continue
            while len(live) < k:  # placeholders that can never win (score -inf)
                live.append((NEG_INF, live[0][1], live[0][2]))
            keep_groups.append(a)
            for value, row, token in live:
                rows.append(row)
                next_tokens.append(token)
                next_scores.append(value)
        if not keep_groups:
            break
        index = torch.tensor(rows, device=logits.device)
        next_ids = torch.tensor(next_tokens, device=logits.device)
        if rows != list(range(A * k)):  # skip the copy when every beam continues in place (e.g. k = 1)
            state = adapter.reorder(state, index)
            generated, context, context_mask = _expand(index, generated, context, context_mask)
        generated = torch.cat((generated, next_ids[:, None]), dim=1)
        beam_scores = torch.tensor(next_scores, dtype=logits.dtype, device=logits.device).reshape(-1, k)
        active = [active[a] for a in keep_groups]
        logits, state = adapter.step(state, next_ids)

    out = GenerationOutput([], [], [], [], pad_id=config.pad_id)
    for hyps in finished:
        best = hyps[:t]
        out.sequences.append([h[2] for h in best])
        out.scores.append([h[0] for h in best])
        out.log_probs.append([h[1] for h in best])
        out.stop_tokens.append([h[3] for h in best])
    return out


def _add_finished(hyps: list[tuple[float, float, list[int], int | None]], k: int, log_prob: float, norm: float,
                  tokens: list[int], stop: int | None) -> None:
    # Kept sorted by score, best first; ties keep the earlier one first. At most k are ever needed (t <= k).
    score = log_prob / norm
    at = len(hyps)
    while at > 0 and hyps[at - 1][0] < score:
        at -= 1
    hyps.insert(at, (score, log_prob, tokens, stop))
    del hyps[k:]


def _input_done(hyps: list[tuple[float, float, list[int], int | None]], t: int, best_live: float,
                largest_norm: float) -> bool:
    # t finished hypotheses, and the best live one cannot beat the t-th even at its most favourable length.
    if len(hyps) < t:
        return False
    return hyps[t - 1][0] >= best_live / largest_norm  # best_live <= 0, largest_norm > 0
