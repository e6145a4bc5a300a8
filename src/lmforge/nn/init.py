"""Weight initialisation shared by the model families."""

from __future__ import annotations

from torch import nn

from lmforge.nn.positional import LearnedPositional


def normal_init(module: nn.Module, std: float) -> None:
    """BERT's and GPT-2's initialisation of one module: Linear/Embedding/learned-position weights N(0, std), biases
    0, LayerNorm weight 1 and bias 0. Meant for ``model.apply(lambda m: normal_init(m, std))``."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding | LearnedPositional):
        nn.init.normal_(module.weight, std=std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
