"""``TaskModel``: a backbone (an encoder or a decoder) with a small task head on top."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


class TaskModel(nn.Module):
    """Compose any backbone with any head: ``head(backbone(inputs), **head_inputs)``.

    State-dict keys are ``backbone.*`` and ``head.*``, so a backbone can be taken out of a task checkpoint
    (``lmforge.models.pretrained.load_backbone``) and put under another head.

    Args:
        backbone: e.g. ``lmforge.models.Encoder``; called with ``input_ids`` and the optional masks.
        head: a module whose ``forward`` takes the backbone's output first.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, **head_inputs: Any) -> Any:
        inputs = {"attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        return self.head(self.backbone(input_ids, **inputs), **head_inputs)
