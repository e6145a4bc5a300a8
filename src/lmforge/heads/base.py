"""``TaskModel``: a backbone (an encoder or a decoder) with a small task head on top."""

from __future__ import annotations

import inspect
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.models import PretrainedMixin
from lmforge.nn.kernels.linear_ce import linear_cross_entropy


class TaskModel(PretrainedMixin, nn.Module):
    """Compose any backbone with any head: ``head(backbone(inputs), **head_inputs)``; a head whose
    ``drives_backbone`` is true is called as ``head(backbone, input_ids, **inputs)`` and runs the backbone itself
    (ELECTRA's discriminator reads the text its generator corrupted).

    State-dict keys are ``backbone.*`` and ``head.*``, so a backbone can be taken out of a task checkpoint
    (``lmforge.persistence.load_backbone``) and put under another head.

    Args:
        backbone: e.g. ``lmforge.models.Encoder``; called with ``input_ids`` and the optional masks.
        head: a module whose ``forward`` takes the backbone's output first.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        from lmforge.models import architecture

        parameters = inspect.signature(backbone.forward).parameters
        self._takes_segments = "token_type_ids" in parameters  # a GPT has none
        # a head that reads only the pooled output lets an encoder compute the last layer at [CLS] alone
        self._pooled_only = getattr(head, "reads_pooled_only", False) and "pooled_only" in parameters
        # a head that names the positions it reads (``rows_read``) lets an encoder compute its last layer there alone
        self._reads_rows = callable(getattr(head, "rows_read", None)) and "read_rows" in parameters
        config = getattr(backbone, "config", None)
        # a GPT (the gpt_inputs capability): its vocabulary projection runs only for the auxiliary LM loss
        self._optional_logits = config is not None and architecture(config.arch).gpt_inputs

    @classmethod
    def from_pretrained(cls, path: Any) -> TaskModel:
        """The task model saved in ``path`` (a folder with a head: fine-tuned, or a pretraining folder), head rebuilt.

        Raises:
            LmforgeError: the folder holds a bare backbone (no head), or anything ``load_folder`` refuses.
        """
        from lmforge.heads import build_model
        from lmforge.models.loading import as_module, load_folder

        return as_module(load_folder(path, with_head=True, build=build_model), path, expect=cls)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, *, return_lm_loss: bool = False, rows_only: bool = False,
                **head_inputs: Any) -> Any:
        """The head's output; with ``return_lm_loss`` (a language-model backbone, GPT-1's auxiliary objective)
        ``(head output, (sum, count))`` of the next-token cross-entropy over the real tokens of ``input_ids``.

        ``rows_only``: the caller reads nothing but the head's outputs (not its ``token_states``): a head that names
        the positions it reads for these inputs (``head.rows_read(**head_inputs)``, e.g. the MLM heads: the masked
        positions, and [CLS] for NSP) has an encoder compute its last layer at those rows alone
        (``Encoder.forward(read_rows=...)``); the same outputs, up to float rounding. Ignored by other heads and
        backbones."""
        inputs: dict[str, Any] = {"attention_mask": attention_mask}
        if token_type_ids is not None and self._takes_segments:
            inputs["token_type_ids"] = token_type_ids
        if self._pooled_only and not return_lm_loss:
            inputs["pooled_only"] = True
        if rows_only and self._reads_rows and not return_lm_loss:
            read_rows = self.head.rows_read(**head_inputs)  # (B, T) bool or None
            if read_rows is not None:
                inputs["read_rows"] = read_rows
        # the auxiliary LM loss straight from the final states when the backbone exposes its output projection
        # (lmforge.nn.kernels.linear_ce: the (B, T, V) logits are never held); else from the backbone's logits
        weight = getattr(self.backbone, "output_weight", None) if return_lm_loss else None
        if self._optional_logits:
            inputs["return_logits"] = return_lm_loss and not isinstance(weight, Tensor)
        if getattr(self.head, "drives_backbone", False):
            # a head that makes the backbone's input itself (ELECTRA: the generator's samples replace the masked
            # tokens) is handed the backbone, so that one call of the whole module runs the step
            return self.head(self.backbone, input_ids, **inputs, **head_inputs)
        out = self.backbone(input_ids, **inputs)
        if getattr(self.head, "wants_attention_mask", False):  # a head that pools over the real tokens
            head_inputs["attention_mask"] = attention_mask
        result = self.head(out, **head_inputs)
        if not return_lm_loss:
            return result
        if isinstance(weight, Tensor):
            hidden = out.last_hidden_state[:, :-1]  # (B, T-1, D): each position predicts the next token
            targets = next_token_targets(input_ids, attention_mask)  # (B, T-1)
            loss, _ = next_token_cross_entropy(targets, hidden=hidden, weight=weight)
            return result, (loss, (targets != -100).sum())
        if getattr(out, "logits", None) is None:
            raise TypeError(f"{type(self.backbone).__name__} returns no LM logits; the auxiliary LM loss needs a "
                            "language-model backbone")
        return result, next_token_loss(out.logits, input_ids, attention_mask)


def next_token_loss(logits: Tensor, input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(sum, count)`` of -log p(x_{t+1} | x_<=t) over positions where x_t and x_{t+1} are both real tokens.

    Args:
        logits: (B, T, V) next-token scores at every position.
        input_ids: (B, T).
        attention_mask: (B, T) 1 = real token (any padding side), or None.
    """
    targets = next_token_targets(input_ids, attention_mask)  # (B, T-1)
    loss, _ = next_token_cross_entropy(targets, logits=logits[:, :-1])
    return loss, (targets != -100).sum()


def next_token_cross_entropy(labels: Tensor, *, logits: Tensor | None = None, hidden: Tensor | None = None,
                             weight: Tensor | None = None, ignore_index: int = -100,
                             accuracy: bool = False) -> tuple[Tensor, Tensor | None]:
    """The next-token loss, one implementation for ``TaskModel``'s auxiliary LM loss and
    ``lmforge.objectives.CausalLMObjective``: the summed cross-entropy of the prediction at each position against
    ``labels`` (the next token there), and the number of correct argmax predictions.

    From the final states and the output projection (``hidden`` and ``weight``) it is
    ``lmforge.nn.kernels.linear_ce``: the projection, the loss, the count and the projection's gradient in one pass
    over row chunks, so the (N, V) logits are never held. From ``logits`` it is ``F.cross_entropy`` in fp32.

    Args:
        labels: (B, T) target ids, ``ignore_index`` where nothing is predicted.
        logits: (B, T, V) scores; or
        hidden: (B, T, D) final states, with ``weight``: (V, D) the output projection.
        ignore_index: the label of positions without a target.
        accuracy: also count the correct predictions from ``logits`` (one more pass over them; from ``hidden`` the
            count is always returned, it costs nothing there).

    Returns:
        (loss sum () fp32, correct () int64, or None from logits without ``accuracy``).
    """
    if weight is not None:
        if hidden is None:
            raise ValueError("next_token_cross_entropy: the output projection weight needs the final states hidden")
        return linear_cross_entropy(hidden.flatten(0, 1), weight, labels.flatten(), ignore_index=ignore_index)
    if logits is None:
        raise ValueError("next_token_cross_entropy needs logits, or hidden states and the output projection weight")
    # ignore_index instead of gathering the valid rows: a gather would copy the whole (N, V) logits
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ignore_index,
                           reduction="sum")
    if not accuracy:
        return loss, None
    return loss, ((logits.detach().argmax(-1) == labels) & (labels != ignore_index)).sum()


def next_token_targets(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(B, T-1) the token after each position, -100 where it or the position itself is padding."""
    targets = input_ids[:, 1:].clone()  # (B, T-1)
    if attention_mask is not None:
        mask = attention_mask.bool()
        targets[~(mask[:, 1:] & mask[:, :-1])] = -100
    return targets
