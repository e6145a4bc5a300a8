"""Knowledge distillation of an encoder: DistilBERT's triple loss, and MiniLM's attention and value relations.

Shape legend: B batch, T length, D model dim, H heads, V vocabulary, N predicted (masked) tokens, M real tokens.

DistilBERT (Sanh et al. 2019, section 2; the weights and temperature of their released training script):

    L = alpha_ce * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))     at the masked positions (N items)
      + alpha_mlm * CE(z_s, x)                                         the student's own masked LM (N items)
      + alpha_cos * (1 - cos(h_s, h_t))                                last hidden states, real tokens (M items)

with T = 2 and weights 5 / 2 / 1. The paper calls the first term a cross-entropy against the soft targets; the KL
used here differs from it by the teacher's entropy, a constant, so the gradients are the same and a perfect student
scores 0. Scaling by T^2 keeps the soft term's gradient magnitude independent of T (Hinton et al. 2015).

A teacher without an MLM head (a sentence encoder such as the embedded MiniLM) gives no soft targets. The student
then learns from the teacher's self-attention (MiniLM, Wang et al. 2020, section 3.1), on its last layer:

      + alpha_att * KL(A_t || A_s)          A = softmax(Q K^T / sqrt(d_k)), per head and real query token
      + alpha_val * KL(VR_t || VR_s)        VR = softmax(V V^T / sqrt(d_k)), the value relation, likewise

each averaged over heads and real query tokens (H * M items); padded keys have probability 0 in both. MiniLM needs
teacher and student to have the same number of heads (their head sizes may differ).

MiniLMv2 (Wang et al. 2021, "MiniLMv2: Multi-Head Self-Attention Relation Distillation") lifts that restriction:
the queries, keys and values of a layer (each (B, T, D), all heads concatenated) are split again into A_r
*relation heads* of width D / A_r, whatever the model's own head count, and the student learns the teacher's
query-query, key-key and value-value relations

      + alpha_rel * sum_{X in Q, K, V} KL(R_t^X || R_s^X)     R^X = softmax(X_a X_a^T / sqrt(D / A_r)) per head a

each averaged over relation heads and real query tokens (A_r * M items), the teacher's from one chosen layer
(``teacher_layer``: the last by default; the paper takes an upper-middle layer of a large teacher) and the
student's from its last layer. A_r must divide both widths; teacher and student may differ in heads and width.

Every term is returned with its weight already applied (the Trainer adds the terms), and each unweighted value is
also a metric (``distill_<term>``), so the log shows both.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput, unwrapped

__all__ = [
    "DistillationObjective", "attention_kl", "hidden_cosine_loss", "layer_projections", "layer_values",
    "self_attention_relation", "soft_target_loss", "value_relation",
]

IGNORE = -100


def soft_target_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """``T^2 * sum_i KL(softmax(t_i / T) || softmax(s_i / T))`` over the rows (summed, not averaged).

    Args:
        student_logits, teacher_logits: (N, V).
        temperature: T > 0.
    """
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (N, V)
    log_p_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)  # (N, V)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum()
    return kl * temperature ** 2


def hidden_cosine_loss(student: Tensor, teacher: Tensor, mask: Tensor | None) -> tuple[Tensor, int]:
    """``sum (1 - cos(h_s, h_t))`` over the real tokens, and their number.

    Args:
        student, teacher: (B, T, D) hidden states of the same width.
        mask: (B, T) bool, True = real token; None = all real.
    """
    cos = F.cosine_similarity(student.float(), teacher.float(), dim=-1)  # (B, T)
    if mask is None:
        return (1.0 - cos).sum(), cos.numel()
    return (1.0 - cos)[mask].sum(), int(mask.sum())


def attention_kl(teacher: Tensor, student: Tensor, mask: Tensor | None) -> tuple[Tensor, int]:
    """``sum KL(p_t || p_s)`` over heads and real query tokens of two (B, H, T, T) attention distributions, and the
    number of (head, real query) items.

    Padded keys have probability 0 in the teacher and contribute nothing (``xlogy(0, 0) = 0``); padded queries are
    left out.
    """
    t, s = teacher.float(), student.float()
    kl = (torch.xlogy(t, t) - t * torch.log(s.clamp_min(1e-30))).sum(-1)  # (B, H, T)
    H = kl.shape[1]
    if mask is None:
        return kl.sum(), kl.numel()
    return kl.transpose(1, 2)[mask].sum(), int(mask.sum()) * H


def layer_values(layer: nn.Module, x: Tensor) -> Tensor:
    """The values of an ``EncoderLayer``'s self-attention for the layer input ``x`` (B, T, D): (B, H, T, d_head).

    Runs the layer's own value projection on what its attention reads (``x``, or LayerNorm(x) in a pre-LN layer).
    """
    attn = layer.self_attn
    h = layer.self_attn_norm(x) if layer.norm_first else x
    v = attn.v_proj(h)  # (B, T, D)
    B, T, D = v.shape
    return v.view(B, T, attn.n_heads, D // attn.n_heads).transpose(1, 2)  # (B, H, T, d_head)


def layer_projections(layer: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The queries, keys and values of an ``EncoderLayer``'s self-attention for the layer input ``x`` (B, T, D), each
    (B, T, D) with the heads concatenated (MiniLMv2 splits them again into its relation heads)."""
    attn = layer.self_attn
    h = layer.self_attn_norm(x) if layer.norm_first else x
    return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)


def self_attention_relation(x: Tensor, n_heads: int, mask: Tensor | None) -> Tensor:
    """MiniLMv2's relation ``softmax(X_a X_a^T / sqrt(d_r))`` of (B, T, D) vectors split into ``n_heads`` relation
    heads of width d_r = D / n_heads: (B, n_heads, T, T); padded keys get 0."""
    B, T, D = x.shape
    heads = x.float().view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, A, T, d_r)
    return value_relation(heads, mask)


def value_relation(values: Tensor, mask: Tensor | None) -> Tensor:
    """MiniLM's value relation ``softmax(V V^T / sqrt(d_head))`` per head: (B, H, T, T); padded keys get 0."""
    v = values.float()
    scores = v @ v.transpose(-1, -2) / math.sqrt(v.shape[-1])  # (B, H, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return scores.softmax(-1)


def _backbone_of(model: nn.Module) -> nn.Module:
    model = unwrapped(model)  # DistributedDataParallel, torch.compile
    return getattr(model, "backbone", model)


class DistillationObjective:
    """The distillation loss of a student (the Trainer's model) against a frozen teacher (held here).

    The student is a ``DistillationStudent`` (backbone + MLM head) or a bare encoder; it is called once per batch,
    as a whole, with ``output_hidden_states`` and (for the MiniLM terms) the last layer's attention weights.

    Args:
        teacher: the teacher: a ``TaskModel`` with an MLM head (``head.mlm``), or an encoder; frozen and kept in eval
            mode here.
        n_heads: the student's heads (for ``counts``).
        temperature: T of the soft targets.
        alpha_ce, alpha_mlm, alpha_cos, alpha_att, alpha_val, alpha_rel: the weights; a term with weight 0 is not
            computed.
        masked_inputs: feed both models the masked inputs (needed by the soft targets and the student MLM); False
            feeds the original text (the masked positions are put back).
        relation_heads: MiniLMv2's relation heads A_r (None: the teacher's attention heads); must divide the
            teacher's and the student's d_model.
        teacher_layer: the teacher layer whose relations the student's last layer learns (MiniLMv2; negative
            indices count from the last, -1).
    """

    def __init__(self, teacher: nn.Module, *, n_heads: int, temperature: float = 2.0, alpha_ce: float = 5.0,
                 alpha_mlm: float = 2.0, alpha_cos: float = 1.0, alpha_att: float = 0.0, alpha_val: float = 0.0,
                 alpha_rel: float = 0.0, masked_inputs: bool = True, relation_heads: int | None = None,
                 teacher_layer: int = -1) -> None:
        if not temperature > 0:
            raise LmforgeError(f"temperature={temperature} must be > 0 (DistilBERT: 2)")
        weights = dict(ce=alpha_ce, mlm=alpha_mlm, cos=alpha_cos, att=alpha_att, val=alpha_val, rel=alpha_rel)
        bad = [f"alpha_{k}={v}" for k, v in weights.items() if not 0.0 <= v < math.inf]
        if bad:
            raise LmforgeError(f"distillation weights must be finite and >= 0: {', '.join(bad)}")
        if not any(weights.values()):
            raise LmforgeError("every distillation weight is 0: nothing to learn from; set at least one of "
                               "--alpha-ce, --alpha-mlm, --alpha-cos, --alpha-att, --alpha-val, --alpha-rel")
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher_head = getattr(getattr(teacher, "head", None), "mlm", None)
        if alpha_ce and self.teacher_head is None:
            raise LmforgeError("alpha_ce > 0 needs a teacher with an MLM head (soft targets); this teacher has none: "
                               "set --alpha-ce 0 and distil from hidden states and attention (--alpha-att, "
                               "--alpha-val)")
        if (alpha_ce or alpha_mlm) and not masked_inputs:
            raise LmforgeError("the soft targets and the student MLM are read at masked positions: they need "
                               "masked_inputs=True")
        self.weights = {k: float(v) for k, v in weights.items() if v}
        self.n_heads, self.temperature, self.masked_inputs = n_heads, float(temperature), masked_inputs
        t_config = _backbone_of(self.teacher).config
        self.relation_heads = t_config.n_heads if relation_heads is None else relation_heads
        L = t_config.n_layers
        if not -L <= teacher_layer < L:
            raise LmforgeError(f"teacher_layer={teacher_layer} (--teacher-layer): the teacher has {L} layers; give "
                               f"0 .. {L - 1}, or -1 for the last")
        self.teacher_layer = teacher_layer % L
        if "rel" in self.weights:
            if not isinstance(self.relation_heads, int) or self.relation_heads < 1 or t_config.d_model % \
                    self.relation_heads:
                raise LmforgeError(f"relation_heads={self.relation_heads} (--relation-heads) must divide the "
                                   f"teacher's d_model {t_config.d_model}")
        self._device: torch.device | None = None

    @property
    def terms(self) -> list[str]:
        return list(self.weights)

    @property
    def term_weights(self) -> dict[str, float]:
        """The weight on each term: the Trainer reports ``eval_ppl_mlm`` of the unweighted masked-LM loss."""
        return dict(self.weights)

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        predicted = int((batch["mlm_labels"] != IGNORE).sum())
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        items = {"ce": predicted, "mlm": predicted, "cos": real, "att": real * self.n_heads,
                 "val": real * self.n_heads, "rel": real * self.relation_heads}
        return {k: items[k] for k in self.weights}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        labels = batch["mlm_labels"]
        selected = labels != IGNORE  # (B, T)
        ids = batch["input_ids"] if self.masked_inputs else torch.where(selected, labels, batch["input_ids"])
        mask = batch.get("attention_mask")
        real = None if mask is None else mask.bool()  # (B, T)
        if self._device != ids.device:
            self.teacher.to(ids.device)
            self._device = ids.device
        w = self.weights
        want_attention = "att" in w
        need_student_head = "ce" in w or "mlm" in w
        layer_options = dict(output_hidden_states=True, output_attentions=[-1] if want_attention else False)
        with torch.no_grad():
            t_backbone = _backbone_of(self.teacher)
            t_out = t_backbone(ids, attention_mask=mask, **layer_options)
            t_logits = self.teacher_head(t_out.last_hidden_state[selected]) if "ce" in w else None  # (N, V)
        student_inputs: dict[str, Any] = dict(attention_mask=mask, **layer_options)
        if need_student_head:
            student_inputs["masked_positions"] = selected
        out = model(ids, **student_inputs)
        s_out, s_logits = (out if need_student_head else (out, None))

        losses: dict[str, tuple[Tensor, int]] = {}
        metrics: dict[str, tuple[Any, Any]] = {}
        n = int(selected.sum())

        def add(term: str, value: Tensor, count: int) -> None:
            losses[term] = (w[term] * value, count)
            metrics[f"distill_{term}"] = (value.detach(), count)

        if "ce" in w:
            add("ce", soft_target_loss(s_logits, t_logits, self.temperature), n)
            agree = (s_logits.argmax(-1) == t_logits.argmax(-1)).sum()
            metrics["teacher_agreement"] = (agree, n)
        if "mlm" in w:
            targets = labels[selected]
            add("mlm", F.cross_entropy(s_logits.float(), targets, reduction="sum"), n)
            metrics["mlm_accuracy"] = ((s_logits.argmax(-1) == targets).sum(), n)
        if "cos" in w:
            s_h, t_h = s_out.last_hidden_state, t_out.last_hidden_state
            if s_h.shape[-1] != t_h.shape[-1]:
                raise LmforgeError(f"the cosine loss compares hidden states, but the student's are {s_h.shape[-1]} "
                                   f"wide and the teacher's {t_h.shape[-1]}; use a student of the teacher's d_model "
                                   "or set --alpha-cos 0")
            add("cos", *hidden_cosine_loss(s_h, t_h, real))
        if "att" in w or "val" in w:
            self._check_heads(t_backbone, _backbone_of(model))
        if "att" in w:
            add("att", *attention_kl(t_out.attentions[-1], s_out.attentions[-1], real))
        if "val" in w:
            s_backbone = _backbone_of(model)
            with torch.no_grad():
                t_vr = value_relation(layer_values(t_backbone.layers[-1], t_out.hidden_states[-2]), real)
            s_vr = value_relation(layer_values(s_backbone.layers[-1], s_out.hidden_states[-2]), real)
            add("val", *attention_kl(t_vr, s_vr, real))
        if "rel" in w:
            add("rel", *self._relations(t_backbone, t_out, _backbone_of(model), s_out, real))
        return ObjectiveOutput(losses, metrics)

    def _relations(self, t_backbone: nn.Module, t_out: Any, s_backbone: nn.Module, s_out: Any,
                   real: Tensor | None) -> tuple[Tensor, int]:
        """MiniLMv2's loss: the three relation KLs summed, each over relation heads and real queries; the count
        of (relation head, real query) items, so that the mean is the sum of the three means."""
        A = self.relation_heads
        width = s_backbone.config.d_model
        if width % A:
            raise LmforgeError(f"relation_heads={A} (--relation-heads) must divide the student's d_model {width} as "
                               "well as the teacher's")
        with torch.no_grad():  # the input of layer i is hidden_states[i]
            t_qkv = layer_projections(t_backbone.layers[self.teacher_layer], t_out.hidden_states[self.teacher_layer])
            t_rel = [self_attention_relation(x, A, real) for x in t_qkv]
        s_qkv = layer_projections(s_backbone.layers[-1], s_out.hidden_states[-2])
        total, count = None, 0
        for t_r, s_x in zip(t_rel, s_qkv, strict=True):
            kl, count = attention_kl(t_r, self_attention_relation(s_x, A, real), real)
            total = kl if total is None else total + kl
        return total, count

    @staticmethod
    def _check_heads(teacher: nn.Module, student: nn.Module) -> None:
        ht, hs = teacher.config.n_heads, student.config.n_heads
        if ht != hs:
            raise LmforgeError(f"MiniLM's attention and value-relation losses compare head by head, but the teacher "
                               f"has {ht} heads and the student {hs}; give the student {ht} heads or set "
                               "--alpha-att 0 --alpha-val 0")


class DistillationStudent(nn.Module):
    """A student encoder with its MLM head, returning both what the losses read.

    State-dict keys are ``backbone.*`` and ``head.*`` as in ``TaskModel`` (the saved folder is an ordinary MLM model:
    ``load_pretrained`` / ``load_backbone`` read it).
    """

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                masked_positions: Tensor | None = None, **backbone_options: Any) -> tuple[Any, Tensor]:
        """Returns (the backbone's output, the MLM logits at ``masked_positions``: (N, V))."""
        out = self.backbone(input_ids, attention_mask=attention_mask, **backbone_options)
        return out, self.head(out, masked_positions=masked_positions).mlm_logits
