"""What every Hugging Face parity test does: build a tiny model with random weights on one side, convert it, run both
sides on the same padded batch and compare their outputs on the real (unpadded) tokens.

Each family's test module keeps only its own sizes, its layouts and its quirks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.heads import build_head
from lmforge.heads.base import TaskModel
from lmforge.models.encoder import Encoder

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")

B, T = 3, 7  # a batch of three rows of seven tokens, two of them padded
TOL, RTOL = 1e-5, 1e-4  # float32 through a few layers with another library's kernels


def close(a: torch.Tensor, b: torch.Tensor, *, rtol: float = RTOL, atol: float = TOL) -> None:
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random init leaves LayerNorms at 1/0 and biases at 0; shake every parameter so each one matters. In eval."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def hf_model(cls: str, config: Any, seed: int) -> torch.nn.Module:
    """transformers' ``cls`` built from ``config`` (torch seeded 0 first), perturbed with ``seed``."""
    torch.manual_seed(0)
    return perturb(getattr(transformers, cls)(config), seed)


def padded_batch(vocab: int, seed: int = 1, segments: int = 0) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` (row 1 padded from 5 on, row 2 from 3 on), and ``token_type_ids`` drawn
    from ``segments`` types when there are any."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    inputs = dict(input_ids=torch.randint(0, vocab, (B, T), generator=g))
    if segments:
        inputs["token_type_ids"] = torch.randint(0, segments, (B, T), generator=g)
    inputs["attention_mask"] = mask
    return inputs


def run_both(ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict[str, torch.Tensor], **kwargs: Any
             ) -> tuple[Any, Any]:
    """(our outputs, Hugging Face's) on ``inputs``, without gradients; ours takes them positionally (ids, mask and
    segments when present), transformers by name."""
    args = [inputs["input_ids"], inputs["attention_mask"]]
    if "token_type_ids" in inputs:
        args.append(inputs["token_type_ids"])
    with torch.no_grad():
        return ours(*args, **kwargs), hf(**inputs, **kwargs)


def real(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The real (unpadded) tokens of a batch, (B, T) bool."""
    return inputs["attention_mask"].bool()


def check_encoder(ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict[str, torch.Tensor], *,
                  pooled: str | None = "pooler", attentions: bool = False) -> None:
    """Same hidden states (every layer's) on the real tokens, and the same pooled output: Hugging Face's
    ``pooler_output`` (``pooled="pooler"``), its h_[CLS] (``"cls"``: no pooler on either side) or none."""
    out, ref = run_both(ours, hf, inputs, output_hidden_states=True, output_attentions=attentions)
    mask = real(inputs)
    close(out.last_hidden_state[mask], ref.last_hidden_state[mask])
    assert len(out.hidden_states) == len(ref.hidden_states)
    for ours_h, ref_h in zip(out.hidden_states, ref.hidden_states, strict=True):
        close(ours_h[mask], ref_h[mask])
    if attentions:
        for ours_a, ref_a in zip(out.attentions, ref.attentions, strict=True):  # (B, H, T, T), real queries only
            close(ours_a.transpose(1, 2)[mask], ref_a.transpose(1, 2)[mask])
    if pooled == "pooler":
        close(out.pooled_output, ref.pooler_output)
    elif pooled == "cls":
        close(out.pooled_output, ref.last_hidden_state[:, 0])


def check_heads(ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict[str, torch.Tensor],
                pairs: Mapping[str, str]) -> None:
    """Same head outputs: ``pairs`` maps our output's field to Hugging Face's (``{"mlm_logits": "logits"}``).
    Fields with a token axis are compared on the real tokens, others whole."""
    out, ref = run_both(ours, hf, inputs)
    mask = real(inputs)
    for mine, theirs in pairs.items():
        a, b = getattr(out, mine), getattr(ref, theirs)
        if a.dim() >= 2 and a.shape[:2] == mask.shape:
            a, b = a[mask], b[mask]
        close(a, b)


def split_task_state(state: Mapping[str, torch.Tensor], head: str = "") -> tuple[dict, dict]:
    """(backbone, head) state dicts of a ``TaskModel``'s, without their prefixes; ``head`` keeps only the head keys
    under ``head.<head>``."""
    backbone = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    heads = {k[len("head."):]: v for k, v in state.items() if k.startswith(f"head.{head}")}
    return backbone, heads


def same_state(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    """The same keys and bit-identical tensors."""
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def export_cli(model_dir: Path, out: Path) -> dict[str, Any]:
    """``lmforge convert --to-hf``: the written ``config.json``."""
    assert main(["-q", "convert", "--to-hf", str(model_dir), "--out", str(out)]) == 0
    return json.loads((out / "config.json").read_text())


def import_cli(hf_dir: Path, out: Path) -> dict[str, Any]:
    """``lmforge convert --from-hf``: the written ``config.json`` (an lmforge folder's)."""
    assert main(["-q", "convert", "--from-hf", str(hf_dir), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "lmforge"
    return config


def ours_encoder(config: Any, head: str | None, seed: int) -> torch.nn.Module:
    """Our ``Encoder`` of ``config`` (torch seeded ``seed`` first), with a ``head`` of that type when given (a
    ``TaskModel``), perturbed with ``seed``."""
    torch.manual_seed(seed)
    enc = Encoder(config)
    return perturb(enc if head is None else TaskModel(enc, build_head({"type": head}, config, enc)), seed)


def hf_config_of(cls: str, exported: Mapping[str, Any]) -> Any:
    """transformers' config class ``cls`` holding an exported ``config.json`` dict."""
    return getattr(transformers, cls)(**{k: v for k, v in exported.items() if k not in ("architectures", "model_type")})


def parameter_counts(build_ours: Any, build_hf: Any) -> tuple[int, int]:
    """The parameters of the models the two functions build, both built on the meta device (no memory)."""
    with torch.device("meta"):
        ours, hf = build_ours(), build_hf()
    return sum(p.numel() for p in ours.parameters()), sum(p.numel() for p in hf.parameters())


def save_old_layout(hf: torch.nn.Module, directory: Path, buffers: Mapping[str, torch.Tensor],
                    **config: Any) -> dict[str, torch.Tensor]:
    """Save ``hf`` in ``directory`` as transformers 4 did: every entry of its state dict, the tied repeats as tensors
    of their own, plus ``buffers`` (``position_ids`` ...); its config with ``config`` on top. Returns the tensors."""
    from safetensors.torch import save_file

    tensors = {**{k: v.clone().contiguous() for k, v in hf.state_dict().items()}, **buffers}
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**hf.config.to_dict(), **config}))
    return tensors


def check_untied_refused(convert: Any, tensors: Mapping[str, torch.Tensor], tied: str) -> None:
    """``convert`` refuses ``tensors`` once their tied repeat ``tied`` holds other values than its original."""
    with pytest.raises(LmforgeError, match="untied"):
        convert({**tensors, tied: tensors[tied] + 1.0})
