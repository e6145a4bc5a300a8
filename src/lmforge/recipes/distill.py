"""The distillation recipe: a small student encoder learns from a frozen teacher (DistilBERT, MiniLM).

A run is a ``DistillRun``; ``build_trainer`` loads the teacher and its tokenizer, reads the prepared corpus (made with
the teacher's tokenizer: ``lmforge data prepare --tokenizer TEACHER``), builds the student, and returns the one
Trainer (resume, DDP, metrics, progress bar) with a ``DistillationObjective``. ``lmforge distill`` is its command line.

The student (``student``):

- ``"from-teacher"`` (default): DistilBERT's student (Sanh et al. 2019, section 3): the teacher's architecture with
  one layer in two (``student_layers``; default 0, 2, 4, ... of the teacher), no segment embedding and no pooler.
  Every weight starts as the teacher's: embeddings, the chosen layers, the MLM head. The teacher's segment-0 vector
  is added to the position table, so the student's embeddings equal the teacher's for single-segment input.
- a preset name: a new encoder of that size (the teacher's vocabulary), randomly initialised;
- a model folder: its encoder (and MLM head, when it has one).

Examples are RoBERTa's full-sentence packing with dynamic token masking (DistilBERT trained without NSP).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.config import DataConfig, TrainConfig, from_dict, to_dict
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

FROM_TEACHER = "from-teacher"
DISTILL_STEPS = 1000  # train.max_steps when the run sets neither it nor a budget


@dataclass
class DistillRun:
    """Everything one distillation run needs (see the module docstring).

    Weights left at None take their default from the teacher: with an MLM head, DistilBERT's 5 / 2 / 1 (soft targets,
    student MLM, cosine) and no attention terms; without one, the cosine and MiniLM's attention and value-relation
    terms at 1 each, and no MLM (the inputs are then the original text, unmasked). MiniLM compares head by head, so
    a student with another head count gets MiniLMv2's query / key / value relations (``alpha_rel`` 1, over
    ``relation_heads``, from ``teacher_layer``) instead.
    """

    teacher: str = ""
    student: str = FROM_TEACHER
    student_layers: list[int] | None = None
    out: str = ""
    temperature: float = 2.0
    alpha_ce: float | None = None
    alpha_mlm: float | None = None
    alpha_cos: float = 1.0
    alpha_att: float | None = None
    alpha_val: float | None = None
    alpha_rel: float | None = None
    relation_heads: int | None = None
    teacher_layer: int = -1
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=lambda: DataConfig(objective="mlm"))
    train: TrainConfig = field(default_factory=TrainConfig)

    def weights(self, teacher_has_mlm: bool, same_heads: bool = True) -> dict[str, float]:
        """The six weights, the defaults filled in for a teacher with or without an MLM head, and a student with the
        teacher's head count or another (MiniLMv2's relations then stand in for MiniLM's per-head terms)."""
        if teacher_has_mlm:
            defaults = dict(ce=5.0, mlm=2.0, att=0.0, val=0.0, rel=0.0)
        elif same_heads or any(v is not None for v in (self.alpha_att, self.alpha_val, self.alpha_rel)):
            defaults = dict(ce=0.0, mlm=0.0, att=1.0, val=1.0, rel=0.0)
        else:
            defaults = dict(ce=0.0, mlm=0.0, att=0.0, val=0.0, rel=1.0)
        given = dict(ce=self.alpha_ce, mlm=self.alpha_mlm, att=self.alpha_att, val=self.alpha_val,
                     rel=self.alpha_rel)
        out = {k: defaults[k] if v is None else float(v) for k, v in given.items()}
        return {**out, "cos": float(self.alpha_cos)}


def every_other_layer(n_layers: int) -> list[int]:
    """DistilBERT's choice, one layer in two from the first: 0, 2, 4, ..."""
    return list(range(0, n_layers, 2))


def student_from_teacher(teacher_backbone, teacher_config, layers: list[int] | None = None,
                         teacher_head=None):
    """DistilBERT's student: the teacher's chosen layers, no segment embedding, no pooler; returns
    (backbone, config, head state dict or None). Equal to the teacher, layer by layer, before training.

    Args:
        teacher_backbone: the teacher ``Encoder``.
        teacher_config: its ``ModelConfig``.
        layers: the teacher layers the student keeps, in order (default: every other one from 0).
        teacher_head: the teacher's MLM heads module (its state is returned for the student's head), or None.
    """
    import torch

    from lmforge.models.encoder import Encoder

    L = teacher_config.n_layers
    layers = every_other_layer(L) if layers is None else list(layers)
    if not layers or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < L for i in layers):
        raise LmforgeError(f"student_layers={layers}: give teacher layer indices in 0 .. {L - 1} (e.g. "
                           f"{','.join(map(str, every_other_layer(L)))})")
    repeated = sorted({i for i in layers if layers.count(i) > 1})
    if repeated:
        raise LmforgeError(f"student_layers={layers} (--student-layers): layer {repeated[0]} is listed twice; each "
                           "teacher layer can start one student layer (e.g. 0,2,4)")
    if teacher_config.arch != "encoder":
        raise LmforgeError(f"the teacher is a {teacher_config.arch!r} model; distillation takes an encoder teacher "
                           "(a BERT-style model folder)")
    values = {**to_dict(teacher_config), "n_layers": len(layers), "type_vocab_size": 0, "pooler": False}
    from lmforge.config import ModelConfig

    config = from_dict(ModelConfig, values, where="the student")
    student = Encoder(config)
    teacher_state = teacher_backbone.state_dict()
    state = {}
    for key in student.state_dict():
        if key.startswith("layers."):
            j, rest = key.split(".", 2)[1:]
            state[key] = teacher_state[f"layers.{layers[int(j)]}.{rest}"]
        else:
            state[key] = teacher_state[key]
    segments = teacher_state.get("embeddings.segments.weight")
    if segments is not None:  # fold segment A's vector into the positions (exact for single-segment input)
        if "embeddings.positions.weight" not in state:
            raise LmforgeError("the teacher has segment embeddings but no position table to fold them into "
                               f"(positional={teacher_config.positional!r}); distil from a learned-position teacher")
        state["embeddings.positions.weight"] = state["embeddings.positions.weight"] + segments[0]
    with torch.no_grad():
        student.load_state_dict(state)
    head_state = None if teacher_head is None else {k: v.clone() for k, v in teacher_head.state_dict().items()}
    return student, config, head_state


def build_student(run: DistillRun, teacher) -> tuple[Any, Any]:
    """The student encoder and its ModelConfig, with the MLM head state to start from (or None)."""
    import torch

    from lmforge.config import ModelConfig, model_config_from_preset
    from lmforge.persistence import build_backbone, load_pretrained

    t_config = teacher.config
    teacher_head = getattr(teacher.model, "head", None)
    if run.student == FROM_TEACHER:
        if run.model:
            raise LmforgeError("--model.* settings change a preset student; a student taken from the teacher keeps "
                               "the teacher's sizes (choose the layers with --student-layers)")
        return student_from_teacher(_backbone(teacher.model), t_config, run.student_layers, teacher_head)
    if run.student_layers is not None:
        raise LmforgeError(f"--student-layers picks layers of the teacher for --student {FROM_TEACHER}; it does not "
                           f"apply to --student {run.student}")
    if Path(run.student).is_dir():
        loaded = load_pretrained(run.student)
        values = {**to_dict(loaded.config), **run.model}
        config = from_dict(ModelConfig, values, where=f"--student {run.student}")
        if config.arch != "encoder":
            raise LmforgeError(f"--student {run.student} holds a {config.arch!r} model; distillation trains an "
                               "encoder (a BERT, ALBERT or DistilBERT folder, or a preset such as bert-mini)")
        backbone = _backbone(loaded.model)
        if run.model:  # the folder's weights in a model of the changed config (n_heads, dropouts: same shapes)
            rebuilt = build_backbone(config)
            try:
                rebuilt.load_state_dict(backbone.state_dict())
            except RuntimeError:
                changed = ", ".join(f"--model.{k}={v}" for k, v in run.model.items())
                raise LmforgeError(f"--student {run.student}: {changed} changes the shape of its weights; a folder "
                                   "student takes settings that keep them (n_heads, dropouts): use a preset student "
                                   "for other sizes") from None
            backbone = rebuilt
        head = getattr(loaded.model, "head", None)
        head_state = head.state_dict() if head is not None and hasattr(head, "mlm") else None
        if config.vocab_size != t_config.vocab_size:
            raise LmforgeError(f"--student {run.student}: its vocabulary has {config.vocab_size} tokens but the "
                               f"teacher's {t_config.vocab_size}; teacher and student must share the tokenizer")
        return backbone, config, head_state
    torch.manual_seed(run.train.seed)
    config = model_config_from_preset(run.student, **{**run.model, "vocab_size": t_config.vocab_size})
    if config.arch != "encoder":
        raise LmforgeError(f"--student {run.student} is a {config.arch!r} preset; distillation trains an encoder "
                           "(bert-*, albert-*, distilbert-base)")
    return build_backbone(config), config, None


def _backbone(model):
    return getattr(model, "backbone", model)


def build_trainer(run: DistillRun, *, resume: str = "never", overwrite: bool = False, progress: bool = True):
    """Teacher, tokenizer, data, student and objective, up to the Trainer."""
    import torch

    from lmforge.data.pretraining import PretrainingData
    from lmforge.data.shards import ShardedCorpus
    from lmforge.heads import build_head
    from lmforge.objectives.distill import DistillationObjective, DistillationStudent
    from lmforge.persistence import load_pretrained
    from lmforge.training.distributed import init_distributed
    from lmforge.training.trainer import RunOutput, Trainer
    from lmforge.utils.io import check_not_input

    # save_every stays unset: the Trainer's default cadence (steps or minutes) keeps checkpoints for --resume auto
    # with a budget (train.budget) max_steps stays unset unless given: the budget ends the run
    changes = {k: v for k, v in (("max_steps", None if run.train.budget else DISTILL_STEPS), ("eval_every", 0))
               if getattr(run.train, k) is None and v is not None}
    if changes:
        run.train = from_dict(TrainConfig, {**to_dict(run.train), **changes})
    if not run.teacher or not Path(run.teacher).is_dir():
        raise LmforgeError(f"--teacher {run.teacher!r}: not a folder; give a model folder (lmforge, or a Hugging Face "
                           "BERT/ALBERT/DistilBERT folder)")
    check_not_input(run.out, [run.data.path, run.teacher, run.student])
    teacher = load_pretrained(run.teacher)
    if teacher.tokenizer is None:
        raise LmforgeError(f"--teacher {run.teacher}: no vocab.txt; the teacher's tokenizer is what the corpus and the "
                           "student share")
    teacher_head = getattr(teacher.model, "head", None)
    has_mlm = teacher_head is not None and hasattr(teacher_head, "mlm")
    if teacher_head is not None and not has_mlm:
        raise LmforgeError(f"--teacher {run.teacher}: a fine-tuned {teacher.head.get('type')!r} model; distil from a "
                           "pretrained encoder (with or without its MLM head)")
    backbone, config, head_state = build_student(run, teacher)
    weights = run.weights(has_mlm, same_heads=config.n_heads == teacher.config.n_heads)
    masked = bool(weights["ce"] or weights["mlm"])
    if not has_mlm and weights["rel"]:
        log.info("the teacher has no MLM head: distilling from its hidden states (cosine, weight %g) and, as "
                 "MiniLMv2, its layer %d's query, key and value relations over %d relation heads (weight %g; "
                 "attention %g, value relation %g); %s", weights["cos"], run.teacher_layer % teacher.config.n_layers,
                 run.relation_heads or teacher.config.n_heads, weights["rel"], weights["att"], weights["val"],
                 "the student also trains its own MLM" if masked else "inputs are unmasked text")
    elif not has_mlm:
        log.info("the teacher has no MLM head: distilling from its hidden states (cosine, weight %g) and its last "
                 "layer's self-attention distributions (weight %g) and value relations (weight %g), as MiniLM; "
                 "%s", weights["cos"], weights["att"], weights["val"],
                 "the student also trains its own MLM" if masked else "inputs are unmasked text")
    else:
        log.info("DistilBERT's triple loss: soft targets at T=%g (weight %g), student MLM (weight %g), cosine "
                 "(weight %g)", run.temperature, weights["ce"], weights["mlm"], weights["cos"])
    tokenizer = teacher.tokenizer
    corpus = ShardedCorpus(run.data.path, tokenizer)
    info = init_distributed()

    def data(split: str) -> PretrainingData:
        return PretrainingData(corpus, run.data, tokenizer, plan="packed", masking=run.data.masking, split=split,
                               seed=run.train.seed, rank=info.rank, world_size=info.world_size)

    train = data("train")
    evaluation = data("eval") if run.data.eval_fraction > 0 else None
    if run.data.seq_len > min(config.max_seq_len, teacher.config.max_seq_len):
        raise LmforgeError(f"data.seq_len={run.data.seq_len} exceeds the max_seq_len of the teacher "
                           f"({teacher.config.max_seq_len}) or the student ({config.max_seq_len}); lower --seq-len")
    if masked:
        torch.manual_seed(run.train.seed)
        head = build_head({"type": "mlm"}, config, backbone)
        if head_state is not None:
            head.load_state_dict({k: v for k, v in head_state.items() if k.startswith("mlm.")})
        student = DistillationStudent(backbone, head)
    else:
        student = backbone
    objective = DistillationObjective(
        teacher.model, n_heads=config.n_heads, temperature=run.temperature, alpha_ce=weights["ce"],
        alpha_mlm=weights["mlm"], alpha_cos=weights["cos"], alpha_att=weights["att"], alpha_val=weights["val"],
        alpha_rel=weights["rel"], masked_inputs=masked, relation_heads=run.relation_heads,
        teacher_layer=run.teacher_layer)
    n_student = sum(p.numel() for p in student.parameters())
    n_teacher = sum(p.numel() for p in teacher.model.parameters())
    log.info("student: %d layers, %.1fM parameters (teacher: %d layers, %.1fM)", config.n_layers, n_student / 1e6,
             teacher.config.n_layers, n_teacher / 1e6)
    output = RunOutput(run.out, resume=resume, overwrite=overwrite, progress=progress, tokenizer=tokenizer,
                       run_config=to_dict(run), run_kind=f"distill (teacher {run.teacher}, student {run.student})",
                       model_config=config)
    return Trainer(student, objective, train, run.train, output, eval_data=evaluation)
