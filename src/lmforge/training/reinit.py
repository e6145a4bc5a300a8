"""Re-initialising the top of a pretrained backbone before fine-tuning (``--reinit-layers K``).

Zhang et al. (ICLR 2021), "Revisiting Few-sample BERT Fine-tuning", section 5.2: the top layers of a pretrained BERT
are specialised to its pretraining objective and transfer worse than fresh weights; re-initialising the pooler and
the top K layers before fine-tuning fixes most few-sample failures (they use K = 1..6 on BERT-large). Here the top
K layers (``backbone.layers.{L-K} ... layers.{L-1}``), and the pooler when the backbone has one, are drawn again the
way the family draws new weights: ``lmforge.nn.init.normal_init`` with the model's ``init_std`` (Linear and
embedding weights N(0, init_std), biases 0, LayerNorm 1 and 0). Nothing else changes: embeddings, lower layers, a
pre-LN model's final norm and the task head keep their weights.
"""

from __future__ import annotations

from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models import architecture
from lmforge.nn.init import normal_init


def reinit_top_layers(model: nn.Module, k: int) -> list[str]:
    """Re-initialise the top ``k`` layers and the pooler of ``model.backbone`` in place (a ``TaskModel``; see the module
    docstring); returns the names of the modules re-initialised (``backbone.layers.11``, ``backbone.pooler``).

    Raises:
        LmforgeError: ``k`` beyond the number of layers, a backbone whose family does not draw its weights from
            N(0, init_std) (the RNNs, the AWD-LSTM: their own schemes), or layers shared across depths (ALBERT: a
            shared layer is also every lower one).
    """
    if k == 0:
        return []
    backbone = getattr(model, "backbone", model)
    config = getattr(backbone, "config", None)
    layers = getattr(backbone, "layers", None)
    if config is None or not isinstance(layers, nn.ModuleList) or not architecture(config.arch).uses_init_std:
        family = getattr(config, "arch", type(backbone).__name__)
        raise LmforgeError(f"--reinit-layers re-draws Transformer layers from N(0, init_std); a {family} backbone has "
                           "no such layers (use it on an encoder, a GPT or an XLNet)")
    n = len(layers)
    if not 0 <= k <= n:
        raise LmforgeError(f"--reinit-layers {k}: the backbone has {n} layers")
    if len({id(layer) for layer in layers}) < n:
        raise LmforgeError("--reinit-layers: this backbone shares its layers across depths (ALBERT's share_layers), "
                           "so re-initialising a top layer would re-initialise the lower ones too")
    done = []
    for i in range(n - k, n):
        layers[i].apply(lambda m: normal_init(m, config.init_std))
        done.append(f"backbone.layers.{i}")
    pooler = getattr(backbone, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.apply(lambda m: normal_init(m, config.init_std))
        done.append("backbone.pooler")
    return done
