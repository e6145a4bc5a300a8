"""The pretraining recipe: BERT (MLM + NSP), RoBERTa (MLM), SpanBERT (MLM + SBO) and GPT (causal LM).

A run is a ``PretrainRun`` (model preset and overrides, ``DataConfig``, ``TrainConfig``); ``build_trainer`` reads the
prepared corpus and its tokenizer, builds the model and its head, and returns the Trainer. Distributed runs need
nothing more than ``torchrun`` (see ``lmforge.training.distributed``). ``lmforge pretrain`` is its command line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.config import (
    DataConfig,
    TrainConfig,
    from_dict,
    to_dict,
)
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")


PRETRAIN_STEPS = 1000  # train.max_steps when the run does not set it


@dataclass
class PretrainRun:
    """Everything one pretraining run needs. ``model`` holds overrides of the preset's ModelConfig."""

    preset: str = "bert-mini"
    out: str = ""
    tokenizer: str = ""
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def build_pretraining_model(run: PretrainRun, vocab_size: int):
    """The model for a run: ``TaskModel(backbone, head)`` when the objective has a head (the MLM objectives), else
    the backbone with its own LM head (GPT); returns (model, ModelConfig, head spec or None)."""
    import torch

    from lmforge.config import model_config_from_preset
    from lmforge.heads import TaskModel, build_head
    from lmforge.models import ARCHITECTURES, architecture
    from lmforge.models.pretrained import build_backbone
    from lmforge.objectives.registry import get_objective

    objective = get_objective(run.data.objective)
    config = model_config_from_preset(run.preset, **{**run.model, "vocab_size": vocab_size})
    # An objective names the one family it trains (its head and data plan are made for it), so this compares
    # families rather than asking a capability.
    if config.arch != objective.arch:
        hint = architecture(objective.arch).presets if objective.arch in ARCHITECTURES else objective.arch
        raise LmforgeError(f"objective {objective.name!r} trains a {objective.arch}, but preset {run.preset!r} is a "
                           f"{config.arch}; use a {hint} preset")
    if run.data.seq_len > config.max_seq_len:
        raise LmforgeError(f"data.seq_len={run.data.seq_len} exceeds the model's max_seq_len={config.max_seq_len}; "
                           "lower --seq-len or raise --model.max_seq_len")
    torch.manual_seed(run.train.seed)  # a reproducible initialisation
    backbone = build_backbone(config)  # after checking that it fits in memory
    head = objective.head_spec(run.data)
    if head is None:
        return backbone, config, None
    return TaskModel(backbone, build_head(head, config, backbone)), config, head


def build_trainer(run: PretrainRun, *, resume: str = "never", overwrite: bool = False, progress: bool = True):
    """Everything of a pretraining run up to the Trainer: tokenizer, data, model, objective."""
    from lmforge.data.instances import TooFewDocumentsError
    from lmforge.data.pretraining import PretrainingData
    from lmforge.data.shards import ShardedCorpus
    from lmforge.objectives.registry import get_objective
    from lmforge.tokenizers import WordPieceTokenizer
    from lmforge.training.distributed import init_distributed
    from lmforge.training.trainer import Trainer
    from lmforge.utils.io import check_not_input

    changes = {k: v for k, v in (("max_steps", PRETRAIN_STEPS), ("eval_every", 0), ("save_every", 0))
               if getattr(run.train, k) is None}
    if changes:  # what pretraining derives: a fixed number of steps, no evaluation or checkpoint unless asked
        run.train = from_dict(TrainConfig, {**to_dict(run.train), **changes})
    tokenizer_dir = Path(run.tokenizer) if run.tokenizer else Path(run.data.path) / "tokenizer"
    check_not_input(run.out, [run.data.path, run.tokenizer])
    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    corpus = ShardedCorpus(run.data.path, tokenizer)
    info = init_distributed()

    def data(split: str) -> PretrainingData:
        objective = get_objective(run.data.objective)
        return PretrainingData(corpus, run.data, tokenizer, plan=objective.plan,
                               masking=objective.masking_for(run.data), split=split, seed=run.train.seed,
                               rank=info.rank, world_size=info.world_size)

    get_objective(run.data.objective)  # an unknown name fails before the corpus is read
    try:
        train = data("train")
    except TooFewDocumentsError as err:
        fallback = get_objective(run.data.objective).fallback
        if fallback is None:
            raise
        log.warning("%s; falling back to objective %r", err, fallback)
        run.data = from_dict(DataConfig, {**to_dict(run.data), "objective": fallback})
        train = data("train")
    evaluation = data("eval") if run.data.eval_fraction > 0 else None
    model, _, _ = build_pretraining_model(run, tokenizer.vocab_size)  # its config and head travel with it
    objective = get_objective(run.data.objective).loss(run.data)
    return Trainer(model, objective, train, run.train, run.out, eval_data=evaluation, tokenizer=tokenizer,
                   run_config=to_dict(run), resume=resume, overwrite=overwrite, progress=progress)
