"""Left-to-right log-probabilities of answers after prompts, and contextual calibration.

Shape legend: B rows of a batch, W padded width, N answer tokens in a batch, D model dim, V vocab, P prompts,
C candidates.

The log-likelihood of an answer a = (a_1..a_m) after a prompt x is

    log P(a | x) = sum_j log P(a_j | x, a_<j)

read from ONE forward pass over x + a: the state at the position of token t predicts token t + 1, so the states
at the positions of x_last, a_1 .. a_{m-1} give the m answer tokens. Rows of a batch are padded (left for a
Transformer ``Decoder``, whose positions come from the mask so a left-padded row gives the logits of the row
alone; right for the recurrent LMs, which read packed sequences), and only the N answer positions are projected
to the vocabulary (a (B, W, V) logits tensor of a GPT-2 prompt batch would be gigabytes).

Scorings of a candidate (Brown et al. 2020, "Language Models are Few-Shot Learners", section 2.4):
    sum            log P(a | x)
    mean           log P(a | x) / m                   (per-token; favours long answers less)
    unconditional  log P(a | x) - log P(a | context)  (context = start token + "Answer:", without the input)

Contextual calibration (Zhao et al. 2021, "Calibrate Before Use: Improving Few-Shot Performance of Language
Models", section 5): p = softmax over the labels of the scores; p_cf = the mean of p over content-free inputs
("N/A", "", "[MASK]") with the same demonstrations; the prediction is argmax W p with W = diag(p_cf)^-1, b = 0
(``calibrate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lmforge.errors import LmforgeError
from lmforge.models import architecture

__all__ = ["SUPPORTED_FAMILIES", "CandidateScores", "CausalLM", "calibrate", "causal_lm_for", "label_probabilities",
           "score_candidates", "score_continuations"]

SUPPORTED_FAMILIES = ("decoder", "awd_lstm", "bilm")


@dataclass
class CausalLM:
    """One model family's left-to-right pass, as scoring needs it.

    Attributes:
        model: the module (put in eval mode while scoring).
        hidden: ``(ids (B, W), mask (B, W) or None) -> states (B, W, D)``; the state at t predicts token t + 1.
        logits: ``states (..., D) -> scores (..., V)``.
        pad_side: "left" (Transformer) or "right" (recurrent).
        max_len: positions the model reads (None: unlimited).
    """

    model: Any
    hidden: Callable[[Tensor, Tensor | None], Tensor]
    logits: Callable[[Tensor], Tensor]
    pad_side: str
    max_len: int | None


def _family_name(model: Any) -> str | None:
    arch = getattr(getattr(model, "config", None), "arch", None)
    return arch if isinstance(arch, str) else None


def causal_lm_for(model: Any, name: str | None = None, *, scoring: bool = True) -> CausalLM:
    """The ``CausalLM`` of a model, or a clear refusal.

    Supported for scoring: lmforge's GPT ``Decoder`` (and Hugging Face GPT-2 loaded into it), the ``AWDLSTM``
    (forward) and ELMo's ``BiLM`` (its forward LM). ``scoring=False`` (generate mode) accepts every causal family
    that generates (XLNet too).

    Args:
        name: how messages name the model (its folder); default its class.

    Raises:
        LmforgeError: a bidirectional encoder, an encoder-decoder, a backward LM, or a family without scoring.
    """
    from lmforge.models.awd_lstm import AWDLSTM
    from lmforge.models.decoder import Decoder
    from lmforge.models.elmo import BiLM

    shown = name or f"the {type(model).__name__}"
    if getattr(model, "logits_in_graph", False) and _family_name(model) == "decoder":
        # a GPT run by ONNX Runtime (--runtime onnx): the vocabulary projection is inside its graph, so the pass
        # returns the scores themselves and ``logits`` passes the selected rows through
        return CausalLM(model, lambda ids, mask: model(ids, attention_mask=mask).logits, lambda scores: scores,
                        "left", model.config.max_seq_len)
    if isinstance(model, Decoder):
        return CausalLM(model, lambda ids, mask: model(ids, attention_mask=mask, return_logits=False)
                        .last_hidden_state, model.lm_logits, "left", model.config.max_seq_len)
    if isinstance(model, AWDLSTM):
        if model.config.reverse:
            raise LmforgeError(f"{shown} is a backward AWD-LSTM (reverse=true): it reads right to left; fewshot "
                               "scores text left to right, so give the forward model")
        return CausalLM(model, lambda ids, mask: model(ids, attention_mask=mask).last_hidden_state,
                        model.lm_logits, "right", None)
    if isinstance(model, BiLM):
        return CausalLM(model, lambda ids, mask: model.forward_lm(ids, attention_mask=mask).last_hidden_state,
                        model.lm_logits, "right", None)
    arch = _family_name(model)
    family = None
    if arch is not None:
        try:
            family = architecture(arch)
        except (KeyError, LmforgeError, ValueError):
            family = None
    supported = ", ".join(SUPPORTED_FAMILIES)
    if family is not None and family.is_causal_lm:
        if not scoring and family.generates:
            return CausalLM(model, _no_scoring, _no_scoring, "left", None)
        raise LmforgeError(f"{shown} is a {arch!r} model: fewshot cannot yet score its left-to-right "
                           f"log-probabilities (families supported: {supported}); --mode generate works with it")
    if family is not None and family.has_encoder_decoder:
        raise LmforgeError(f"fewshot scores text left to right with a causal language model; {shown} is an "
                           f"encoder-decoder ({arch!r}), which writes a separate output from a source. Give a "
                           f"GPT decoder folder (lmforge pretrain --objective clm) or one of: {supported}")
    what = f"a bidirectional encoder ({arch!r})" if family is not None else f"not a causal language model " \
        f"({type(model).__name__})"
    raise LmforgeError(f"fewshot scores text left to right with a causal language model; {shown} is {what}, whose "
                       "tokens see the words after them, so it gives no probability of a continuation. Give a GPT "
                       f"decoder folder (lmforge pretrain --objective clm, or Hugging Face GPT-2) or one of: "
                       f"{supported}")


def _no_scoring(*_: Any) -> Tensor:
    raise LmforgeError("this model family has no left-to-right scoring in fewshot; use --mode generate")


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def score_continuations(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, batch_size: int = 16,
                        on_batch: Callable[[int], None] | None = None, lm: CausalLM | None = None) -> list[float]:
    """log P(answer | context) for each (context ids, answer ids) pair, from one forward pass over context + answer.

    Args:
        model: a supported causal LM (see ``causal_lm_for``); run in eval mode, its modes restored afterwards.
        pairs: (context, answer); the context must hold at least one token (a prompt starts with the start
            token), the answer at least one.
        batch_size: sequences per forward pass (pairs are sorted by length, so a batch holds similar lengths).
        on_batch: called with the number of pairs after each batch (progress bars).

    Returns:
        One sum of log-probabilities per pair, in the input order.

    Raises:
        LmforgeError: an empty context or answer, a sequence longer than the model's context, an unsupported model.
    """
    lm = lm if lm is not None else causal_lm_for(model)
    if batch_size < 1:
        raise LmforgeError(f"batch_size={batch_size} must be >= 1")
    for i, (context, answer) in enumerate(pairs):
        if not context or not answer:
            raise LmforgeError(f"pair {i}: the context and the answer each need at least one token (a prompt starts "
                               "with the document start token)")
        if lm.max_len is not None and len(context) + len(answer) > lm.max_len:
            raise LmforgeError(f"pair {i}: {len(context) + len(answer)} tokens exceed the model's context "
                               f"(max_seq_len={lm.max_len}); shorten the prompt")
    device = _device(lm.model)
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    out = [0.0] * len(pairs)
    was_training = getattr(lm.model, "training", False)
    lm.model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                for i, value in zip(chunk, _score_batch(lm, [pairs[i] for i in chunk], device), strict=True):
                    out[i] = value
                if on_batch is not None:
                    on_batch(len(chunk))
    finally:
        lm.model.train(was_training)
    return out


def _score_batch(lm: CausalLM, pairs: list[tuple[Sequence[int], Sequence[int]]], device: torch.device) -> list[float]:
    lengths = [len(c) + len(a) for c, a in pairs]
    width = max(lengths)
    ids = torch.zeros((len(pairs), width), dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    rows, cols, targets = [], [], []
    for r, ((context, answer), n) in enumerate(zip(pairs, lengths, strict=True)):
        offset = width - n if lm.pad_side == "left" else 0
        ids[r, offset:offset + n] = torch.tensor([*context, *answer], dtype=torch.long)
        mask[r, offset:offset + n] = 1
        first = offset + len(context)  # column of the first answer token
        rows += [r] * len(answer)
        cols += range(first - 1, first - 1 + len(answer))  # the states that predict them
        targets += list(answer)
    full = bool(mask.all())
    hidden = lm.hidden(ids.to(device), None if full else mask.to(device))  # (B, W, D)
    rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
    logits = lm.logits(hidden[rows_t, cols_t])  # (N, V)
    logits = logits.double() if logits.dtype == torch.float64 else logits.float()
    token_lp = logits.log_softmax(-1).gather(1, torch.tensor(targets, device=device)[:, None])[:, 0]  # (N,)
    sums = torch.zeros(len(pairs), dtype=token_lp.dtype, device=device).index_add_(0, rows_t, token_lp)
    return sums.tolist()


@dataclass
class CandidateScores:
    """Candidate log-likelihoods after each prompt.

    Attributes:
        log_probs: (P, C) float64, log P(candidate c | prompt p), summed over the candidate's tokens.
        n_tokens: (C,) the candidates' token counts.
    """

    log_probs: Tensor
    n_tokens: Tensor

    def mean(self) -> Tensor:
        """(P, C) per-token log-likelihoods."""
        return self.log_probs / self.n_tokens.to(self.log_probs.dtype)


def score_candidates(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]],
                     candidates: Sequence[Sequence[int]], *, batch_size: int = 16,
                     on_batch: Callable[[int], None] | None = None) -> CandidateScores:
    """The primitive of likelihood classification: every candidate answer scored after every prompt.

    Args:
        model: a supported causal LM (``causal_lm_for``).
        tokenizer: accepted for symmetry with the rest of the API (prompts and candidates are already ids).
        prompts: P id lists (each starting with the document start token, ``document_start_ids``).
        candidates: C id lists, each the continuation exactly as a demonstration holds it (" positive").
        batch_size: sequences per forward pass.

    Returns:
        ``CandidateScores`` with (P, C) sums and (C,) token counts.
    """
    del tokenizer
    pairs = [(p, c) for p in prompts for c in candidates]
    flat = score_continuations(model, pairs, batch_size=batch_size, on_batch=on_batch)
    log_probs = torch.tensor(flat, dtype=torch.float64).reshape(len(prompts), len(candidates))
    return CandidateScores(log_probs, torch.tensor([len(c) for c in candidates], dtype=torch.long))


def label_probabilities(scores: Tensor) -> Tensor:
    """(N, C) scores -> (N, C) probabilities normalised over the labels (a softmax: exp(score) / sum)."""
    return torch.softmax(scores.double(), dim=-1)


def calibrate(probs: Tensor, p_cf: Tensor) -> Tensor:
    """Contextual calibration (Zhao et al. 2021): q = W p with W = diag(p_cf)^-1 and b = 0, renormalised.

    Args:
        probs: (N, C) label probabilities of the inputs.
        p_cf: (C,) mean label probabilities of the content-free inputs, or (N, C) one per input (demonstrations
            drawn per example).

    Returns:
        (N, C) calibrated probabilities; their argmax is the calibrated prediction.
    """
    q = probs.double() / p_cf.double()
    return q / q.sum(-1, keepdim=True)
