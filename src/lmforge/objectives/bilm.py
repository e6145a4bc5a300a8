"""The biLM objective (ELMo, Peters et al. 2018, section 3.1): maximise the log-likelihood of both directions,

    sum_k [ log p(t_k | t_1..t_{k-1}) + log p(t_k | t_{k+1}..t_N) ]

Stream batches (plan ``"stream"``, ``lmforge.data.lm_stream.LMStreamData`` with ``bidirectional``; what the
pretraining recipe gives): the documents joined by [SEP] form one stream cut into B rows, and consecutive batches
are consecutive windows of those rows, as bilm-tf trains. The forward LM reads each row left to right
(``input_ids`` -> ``labels``, the next tokens); the backward LM reads each row right to left, so its windows come
from the row's end towards its start (``backward_input_ids`` -> ``backward_labels``, the previous tokens, given in
text order): the window after a backward window is the text to its LEFT, which is where the backward LSTM, having
stopped at the window's first token, must continue. Both directions carry their LSTM states (per layer (h, c))
from batch to batch, detached (the gradient is truncated at the window's start, bilm-tf's unroll), and start from
zeros when the batch says ``reset`` (a new pass over the stream) or the number of rows changes. With
``carry_states=False`` (``--loss.carry_states=false``) every window starts from zeros (what lmforge did before).
The windows have a fixed length ``seq_len`` (bilm-tf's ``unroll_steps``; the recipe turns the AWD-LSTM's variable
lengths off).

Training and evaluation keep separate states (the Trainer evaluates between training steps; the eval stream
restarts at its first window each time). The training state is the objective's ``state_dict`` (what a checkpoint
keeps beside the data position), so a run killed and resumed with ``--resume auto`` continues from the exact state.

Block batches (the causal-LM batch of plan ``"causal"``: ``input_ids`` = block[:-1], ``labels`` = block[1:]; what
runs before stream batches existed used, and a caller may still pass): the biLM reads the whole block
``[input_ids[:, 0], labels]`` from zero states and each direction predicts ``seq_len`` tokens.

One loss term ``lm`` = the mean of the forward and backward per-token NLLs (its ``eval_ppl_lm`` is the geometric mean
of the two perplexities); the metrics ``forward_nll`` and ``backward_nll`` give each direction's per-token NLL, which
the Trainer also reports as ``forward_ppl`` / ``backward_ppl`` (exp of the NLL), in training and evaluation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


def _block(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The whole blocks (B, T + 1) and their mask (1 = real) from a causal-LM batch."""
    labels = batch["labels"]
    first_real = batch.get("attention_mask", torch.ones_like(labels))[:, :1]
    tokens = torch.cat([batch["input_ids"][:, :1], labels.clamp(min=0)], dim=1)
    mask = torch.cat([first_real.bool(), labels != IGNORE], dim=1)
    return tokens, mask


def _to(state: Any, device: torch.device) -> Any:
    """``state`` ({direction: [(h, c), ...]}) with its tensors on ``device``."""
    return {k: [(h.to(device), c.to(device)) for h, c in v] for k, v in state.items()}


class BiLMObjective:
    """``objective(model, batch)`` for a ``BiLM`` (see the module docstring)."""

    def __init__(self, carry_states: bool = True) -> None:
        self.carry_states = bool(carry_states)
        self._states: dict[bool, dict[str, Any]] = {}  # model.training -> the state the last windows ended with

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"lm": int((batch["labels"] != IGNORE).sum())}

    # ------------------------------------------------------------------ state (checkpointed)
    def state_dict(self) -> dict[str, Any]:
        """The training state (per direction, per layer (h, c) on the CPU), or None: what a checkpoint keeps."""
        state = self._states.get(True)
        return {"train_state": None if state is None else _to(state, torch.device("cpu"))}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the training state ``state_dict`` gave (moved to the batches' device on first use)."""
        saved = (state or {}).get("train_state")
        self._states.pop(True, None)
        if saved is not None:
            self._states[True] = {k: [(h, c) for h, c in v] for k, v in saved.items()}

    def state(self, training: bool) -> dict[str, Any] | None:
        """The state the next training (or evaluation) windows would start from, or None (zeros)."""
        return self._states.get(training)

    # ------------------------------------------------------------------ loss
    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        if "backward_input_ids" in batch:
            forward_nll, backward_nll, n = self._stream(model, batch)
        else:
            tokens, mask = _block(batch)
            out = model(tokens, attention_mask=mask, lm_loss=True)
            forward_nll, backward_nll, n = out.forward_nll, out.backward_nll, out.n_predictions
        return ObjectiveOutput({"lm": ((forward_nll + backward_nll) / 2, n)},
                               {"forward_nll": (forward_nll.detach(), n), "backward_nll": (backward_nll.detach(), n)})

    def _stream(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        input_ids = batch["input_ids"]
        B = input_ids.shape[0]
        key = bool(model.training)
        state = self._states.get(key) if self.carry_states else None
        reset = batch.get("reset")
        if state is not None and ((reset is not None and bool(reset.any()))
                                  or state["forward"][0][0].shape[1] != B):
            state = None
        if state is not None:
            state = _to(state, input_ids.device)
        out = model(input_ids, stream={"labels": batch["labels"], "backward_input_ids": batch["backward_input_ids"],
                                       "backward_labels": batch["backward_labels"], "state": state})
        if self.carry_states:  # truncated BPTT: the next windows start from these values, without their graph
            self._states[key] = {k: [(h.detach(), c.detach()) for h, c in v] for k, v in out.state.items()}
        return out.forward_nll, out.backward_nll, out.n_predictions
