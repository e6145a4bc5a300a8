"""The fine-tuning recipe: a task head on a pretrained encoder or decoder (sequence, pair, token, span, qa, choice).

``load_encoder`` takes an lmforge model folder (its head is dropped), a Hugging Face BERT folder, or a preset name (a
new encoder, with a tokenizer); ``build_finetune_trainer`` reads the data, builds ``TaskModel(encoder, head)`` and
returns the Trainer; ``load_task_model`` rebuilds a fine-tuned folder for evaluation, prediction and serving.
``lmforge finetune`` / ``evaluate`` / ``predict`` are its command line.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.config import (
    PRESETS,
    ModelConfig,
    TaskConfig,
    TrainConfig,
    from_dict,
    to_dict,
)
from lmforge.errors import InputFileError, LmforgeError

log = logging.getLogger("lmforge")


# Fine-tuning defaults of Devlin et al. (2019, appendix A.3: lr 5e-5 / 3e-5 / 2e-5, batch 16 / 32, 2-4 epochs) with
# 10% linear warm-up as in google-research/bert's run_classifier.py. The learning rate is BERT's only for a pretrained
# Transformer: see DEFAULT_LR and default_lr.
FINETUNE_DEFAULTS: dict[str, Any] = {"train": {"lr": 5e-5, "batch_size": 32, "warmup_ratio": 0.1, "log_every": 10,
                                               "eps": 1e-8}}

# The learning rate a run gets when none is given, by backbone. 5e-5 moves pretrained Transformer weights gently
# (Devlin et al.); weights that start random need larger steps: 5e-4 for a Transformer from a preset and 2e-3 for a
# recurrent model (an RNN from a preset, a pretrained AWD-LSTM under ULMFiT's new head, ELMo's task BiLSTM), the rates
# configs/compare-bbc.toml found for its from-scratch classifiers (5e-5 left them near chance in its epochs).
DEFAULT_LR = {"pretrained transformer": 5e-5, "random transformer": 5e-4, "recurrent": 2e-3}
DEFAULT_LR_HELP = ("default: 5e-5 for a pretrained Transformer folder (BERT's), 5e-4 for a preset (random "
                   "weights), 2e-3 for a recurrent model (RNN presets, AWD-LSTM, ELMo)")

# A CRF tagger's head (emission layer and transition scores) starts from nothing; at a pretrained encoder's 5e-5 it
# learns too slowly to leave "all O" within a few epochs of a small data set. Measured on 300 tweets of the Twitter
# NER data (MiniLM, 3 epochs, dev = the next 200 tweets), entity F1 after each epoch: head at 5e-5 or 1e-3, 0 / 0 / 0;
# at 1e-2, 0 / 0.37 / 0.38; at 3e-2, 0.25 / 0.42 / 0.42. Its default learning rate is at least this (BERT-CRF taggers
# commonly give the CRF its own, much larger rate; flair trains its CRF taggers at 0.1); --head-lr sets it.
CRF_HEAD_LR = 3e-2

# Small training sets. BERT's 3 epochs of batch 32 give a pretrained encoder 96 updates on 1,000 examples, too few for
# its new head: MiniLM on 1,000 TREC questions scored 0.832 on dev with them, against 0.926 with batch 16 and 10
# epochs (630 updates) at the same lr; the best of a small grid on dev (lr 2e-5 to 2e-4, batch 16 or 32, 3 to 10
# epochs) was 0.928 (benchmarks/bench_finetune_defaults.py; BENCHMARKS.md, issue 37). Mosbach et al. (ICLR 2021) find
# the same: few-sample fine-tuning fails from too few iterations, not from the lr. So when the user gives none of
# --epochs, --batch-size and --max-steps and the default schedule would make fewer than MIN_UPDATES updates, a
# pretrained Transformer trains with batch SMALL_DATA_BATCH for as many epochs as MIN_UPDATES needs (at most
# MAX_DEFAULT_EPOCHS); the best dev epoch is kept as always.
MIN_UPDATES = 600
SMALL_DATA_BATCH = 16
MAX_DEFAULT_EPOCHS = 20

# ModelConfig fields a pretrained model folder may change when fine-tuned (--model.NAME=VALUE): the dropout rates,
# which shape no weight (e.g. ULMFiT's classifier dropouts, fastai's drop_mult, against the LM's own).
DROPOUT_SETTINGS = ("dropout", "attention_dropout", "embed_p", "input_p", "hidden_p", "weight_p", "output_p")


@dataclass
class FinetuneRun:
    """Everything one fine-tuning run needs."""

    model: str = ""
    tokenizer: str = ""
    preset_options: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides for a preset --model
    train_file: str = ""
    dev_file: str = ""
    out: str = ""
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# ---------------------------------------------------------------------------------------------- the model
def load_encoder(source: str, tokenizer_dir: str = "", seed: int = 0, preset_options: dict[str, Any] | None = None):
    """(backbone, ModelConfig, tokenizer) from a model folder or a preset name (see the module docstring)."""
    import torch

    from lmforge.config import model_config_from_preset
    from lmforge.models import architecture, architectures_with
    from lmforge.persistence import build_backbone, load_backbone
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else None
    path = Path(source)
    if path.is_dir():
        loaded = load_backbone(path)
        backbone, config = loaded.model, loaded.config
        if preset_options and not architecture(config.arch).finetune_as:  # a wrapping family takes its options
            others = [k for k in preset_options if k not in DROPOUT_SETTINGS]
            if others:
                shown = ", ".join(f"--model.{k}" for k in others)
                raise LmforgeError(f"model settings ({shown}) only apply when --model is a preset name, not a folder "
                                   f"({source}); a pretrained model's dropouts may change: "
                                   f"{', '.join(f'--model.{k}' for k in DROPOUT_SETTINGS)}")
            # the same weights under other dropout rates (fastai's drop_mult): rebuilt, then its weights loaded
            config = from_dict(ModelConfig, {**to_dict(config), **preset_options}, where=f"--model {source}")
            backbone = build_backbone(config)
            backbone.load_state_dict(loaded.model.state_dict())
        tokenizer = tokenizer or loaded.tokenizer
        if tokenizer is None:
            raise InputFileError(f"{path}: the model folder has no tokenizer (vocab.txt); pass --tokenizer DIR "
                                 "with the tokenizer the model was trained with")
    elif source in PRESETS:
        if tokenizer is None:
            raise LmforgeError(f"--model {source} builds a new, untrained encoder: pass --tokenizer DIR (e.g. one made "
                               "by `lmforge tokenizer train`)")
        config = model_config_from_preset(source, **{**(preset_options or {}), "vocab_size": tokenizer.vocab_size,
                                                     "pad_token_id": tokenizer.pad_id})
        torch.manual_seed(seed)
        backbone = build_backbone(config)
    else:
        raise LmforgeError(f"--model {source}: not a folder and not a preset name (presets: {', '.join(PRESETS)})")
    family = architecture(config.arch)
    if family.finetune_as:  # ELMo: the pretrained biLM frozen under a scalar mix and a task BiLSTM
        if not path.is_dir() and family.reads_characters:
            backbone.set_vocabulary([token or "" for token in tokenizer.ids_to_tokens])
        options = (preset_options or {}) if path.is_dir() else {}
        backbone = architecture(family.finetune_as).load().wrap(backbone, **options)
        config = backbone.config
    # Fine-tuning heads read per-token hidden states (and the sequence head the pooled output, which
    # build_sequence_head checks): a generator has neither.
    if not architecture(config.arch).encodes_text:
        families = ", ".join(f"{name} ({architecture(name).presets})" for name in architectures_with("encodes_text"))
        raise LmforgeError(f"--model {source} is a {config.arch}; fine-tuning heads need an encoder (BERT-style, "
                           f"or the rnn-attn preset for sequence tasks): one of {families}")
    if tokenizer.vocab_size > config.vocab_size:
        raise LmforgeError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding only "
                           f"{config.vocab_size}; pass the model's own tokenizer")
    backbone.train()
    return backbone, config, tokenizer


def default_lr(source: str, config: ModelConfig) -> tuple[float, str]:
    """The default learning rate for fine-tuning the backbone ``config`` (as fine-tuned: ELMo's wrapped biLM) loaded
    from ``source`` (a folder or a preset name), and the kind of backbone that chose it (a key of ``DEFAULT_LR``):
    an RNN (``recurrent``) or ULMFiT's AWD-LSTM (``concat_pooling``: its classifier is new) is "recurrent"."""
    from lmforge.models import architecture

    family = architecture(config.arch)
    if family.recurrent or family.concat_pooling:
        kind = "recurrent"
    else:
        kind = "pretrained transformer" if Path(source).is_dir() else "random transformer"
    return DEFAULT_LR[kind], kind


# tasks that label every token (or span) of a text: a left-to-right state has not read what follows the token
_PER_TOKEN_TASKS = ("token", "span")


def resolve_task_inputs(task: TaskConfig, config: ModelConfig) -> TaskConfig:
    """The task settings for a backbone of family ``config.arch``: ``input_format`` "auto" becomes "gpt" on a GPT
    (GPT-1's input transformations) and "bert" elsewhere, ``lm_weight`` None becomes 0.5 on a GPT (GPT-1's lambda)
    and 0 elsewhere.

    Raises:
        LmforgeError: GPT inputs or the auxiliary LM loss on a backbone that is not a GPT; a per-token task on a
            left-context-only backbone without ``allow_causal``.
    """
    from lmforge.models import architecture, architectures_with

    family = architecture(config.arch)
    gpts = ", ".join(f"{n} ({architecture(n).presets})" for n in architectures_with("gpt_inputs"))
    fmt = task.input_format if task.input_format != "auto" else ("gpt" if family.gpt_inputs else "bert")
    if fmt == "gpt" and not family.gpt_inputs:
        raise LmforgeError(f"--task.input_format=gpt lays inputs out for a GPT, but the model is a {config.arch}; "
                           f"leave it at auto (GPT families: {gpts})")
    weight = task.lm_weight if task.lm_weight is not None else (0.5 if family.gpt_inputs else 0.0)
    if weight and not family.gpt_inputs:
        raise LmforgeError(f"--task.lm_weight={weight:g} adds a GPT's language-model loss on the task's text, but "
                           f"the model is a {config.arch} with no LM head here; drop the option (GPT families: "
                           f"{gpts})")
    if family.left_context_only and task.task in _PER_TOKEN_TASKS and not task.allow_causal:
        raise LmforgeError(f"--task {task.task} labels every token from its state, and a {config.arch} reads left to "
                           "right only: each token's state has not seen the words after it, which a tagger needs "
                           "(GPT-1 was never fine-tuned for tagging). Use a bidirectional encoder (bert-*, xlnet-*, "
                           "an ELMo biLM), or pass --task.allow_causal=true to tag with left context anyway")
    return from_dict(TaskConfig, {**to_dict(task), "input_format": fmt, "lm_weight": weight}, where="--task")


def init_embeddings(backbone, tokenizer, path: str) -> float:
    """Copy the vectors of ``path`` (word2vec text or binary format) into the token embedding rows of the tokens
    they name; returns the fraction of the vocabulary covered (logged)."""
    import torch

    from lmforge.embeddings.io import load_word2vec

    vectors = load_word2vec(path)
    table = backbone.get_input_embeddings().weight
    if vectors.vectors.shape[1] != table.shape[1]:
        raise LmforgeError(f"{path}: vectors of dimension {vectors.vectors.shape[1]} cannot initialise embeddings "
                           f"of width {table.shape[1]}; train vectors with --dim {table.shape[1]}")
    rows, found = [], []
    for token, row in tokenizer.vocab.items():
        i = vectors.index.get(token)
        if i is not None:
            rows.append(row)
            found.append(i)
    if not rows:
        raise LmforgeError(f"{path}: none of its words is a token of the tokenizer; train the vectors on text "
                           "split by the same tokenizer")
    with torch.no_grad():
        table[torch.tensor(rows)] = torch.as_tensor(vectors.vectors[found], dtype=table.dtype)
    coverage = len(rows) / tokenizer.vocab_size
    log.info("init_embeddings: %d of %d tokens (%.1f%%) start from %s", len(rows), tokenizer.vocab_size,
             100 * coverage, path)
    return coverage


def featurize(task, examples, tokenizer, path: str, *, training: bool):
    try:
        return task.featurize(examples, tokenizer, training=training)
    except LmforgeError as err:
        if str(err).startswith(str(path)):
            raise
        raise LmforgeError(f"{path}: {err}") from None


def build_finetune_trainer(run: FinetuneRun, *, resume: str = "never", overwrite: bool = False,
                           progress: bool = True, choose_lr: bool = False, fit_length: bool = False,
                           choose_schedule: bool = False):
    """Read the data, build TaskModel(encoder, head), freeze, and return (Trainer, task).

    Args:
        choose_lr: the run's ``train.lr`` was not given: replace it by ``default_lr`` for the backbone (BERT's 5e-5
            only for a pretrained Transformer).
        fit_length: the run's ``task.max_length`` was not given: a default longer than the model's positions is cut
            to them (a model pretrained on 64-token blocks reads 64), instead of refused.
        choose_schedule: none of epochs, batch size and steps was given: a small training set gets enough updates
            for a pretrained Transformer (``MIN_UPDATES``).
    """
    import torch

    from lmforge.data.batches import FeatureData
    from lmforge.heads import TaskModel, build_head
    from lmforge.models import architecture
    from lmforge.tasks import make_task
    from lmforge.tasks.base import TaskObjective
    from lmforge.training.distributed import init_distributed
    from lmforge.training.freeze import freeze, lr_scales
    from lmforge.training.reinit import reinit_top_layers
    from lmforge.training.trainer import RunOutput, Trainer
    from lmforge.utils.io import check_not_input

    check_not_input(run.out, [p for p in (run.model, run.tokenizer, run.train_file, run.dev_file,
                                          run.task.init_embeddings) if p and Path(p).exists()])
    make_task(run.task).check_options()  # e.g. --task.crf=true on a QA task is an error, not ignored
    backbone, config, tokenizer = load_encoder(run.model, run.tokenizer, run.train.seed, run.preset_options)
    run.task = resolve_task_inputs(run.task, config)
    kind = _default_rates(run, config, choose_lr)
    if run.task.input_format == "gpt":  # GPT-1: [START] / [DELIM] / [EXTRACT] join the vocabulary when missing
        from lmforge.tasks.gpt_inputs import add_gpt_tokens, grow_embeddings

        tokenizer, added = add_gpt_tokens(tokenizer)
        grow_embeddings(backbone, tokenizer, added)
        config = backbone.config
    if fit_length and run.task.max_length > config.max_seq_len:
        log.info("max_length %d (the model's positions; the default %d is longer: --max-length to set it)",
                 config.max_seq_len, run.task.max_length)
        run.task = from_dict(TaskConfig, {**to_dict(run.task), "max_length": config.max_seq_len}, where="--task")
    task = make_task(run.task)
    if run.task.init_embeddings:
        init_embeddings(backbone, tokenizer, run.task.init_embeddings)
    if run.task.max_length > config.max_seq_len:
        raise LmforgeError(f"--max-length {run.task.max_length} exceeds the model's limit of {config.max_seq_len} "
                           "positions; lower it (long texts: --long-text head-tail|chunks, or QA windows)")
    train_examples = task.read(run.train_file, labelled=True)
    task.fit_labels(train_examples)
    train_features = featurize(task, train_examples, tokenizer, run.train_file, training=True)
    if choose_schedule:  # before the dev evaluator takes its batch size from the run
        _default_schedule(run, kind, len(train_features))
    evaluator = None
    if run.dev_file:
        dev_examples = task.read(run.dev_file, labelled=True)
        dev_features = featurize(task, dev_examples, tokenizer, run.dev_file, training=False)
        task.warn_unknown_labels(dev_examples, run.dev_file)  # scored as misses, said once
        batch = run.train.micro_batch_size or run.train.batch_size

        def evaluator(model):
            shown = "dev" if progress and info.rank == 0 else None
            metrics = task.metrics(dev_examples, task.predict(model, dev_examples, dev_features, tokenizer,
                                                              batch_size=batch, progress=shown))
            hint(metrics)
            return metrics

    info = init_distributed()
    data = FeatureData(train_features, lambda fs: task.collate(fs, tokenizer.pad_id), seed=run.train.seed,
                       rank=info.rank, world_size=info.world_size, group_by_length=run.train.group_by_length)
    per_epoch = data.steps_per_epoch(run.train.batch_size)
    changes: dict[str, Any] = {}
    if run.train.max_steps is None:
        changes["max_steps"] = max(1, math.ceil(run.task.epochs * per_epoch))
    if run.train.eval_every is None:
        changes["eval_every"] = per_epoch if evaluator is not None else 0
    if run.train.save_every is None:
        changes["save_every"] = per_epoch
    if changes:
        run.train = from_dict(TrainConfig, {**to_dict(run.train), **changes})
    hint = _ZeroMetricHint(run, task, per_epoch)  # read by the evaluator
    head_spec = task.head_spec()
    family = architecture(config.arch)
    if head_spec["type"] == "sequence_classification" and family.gpt_inputs:
        head_spec["bias"] = False  # GPT-1 (Radford et al. 2018, eq. 3): P(y | x) = softmax(h W_y), no bias
    if head_spec["type"] in ("sequence_classification", "multiple_choice") and family.summary_activation:
        head_spec["hidden"] = family.summary_activation  # XLNet's sequence summary
    torch.manual_seed(run.train.seed)  # the head's initialisation is part of the run's seed
    model = TaskModel(backbone, build_head(head_spec, config, backbone))
    if run.task.reinit_layers:  # Zhang et al. 2021: fresh top layers for a briefly or differently pretrained encoder
        log.info("--reinit-layers %d: re-initialised %s", run.task.reinit_layers,
                 ", ".join(reinit_top_layers(model, run.task.reinit_layers)))
    frozen = freeze(model, run.task.freeze)
    if frozen:
        log.info("--freeze %s: %d of %d parameter tensors frozen", run.task.freeze, len(frozen),
                 len(list(model.parameters())))
    scales = lr_scales(model, lr=run.train.lr, head_lr=run.task.head_lr, layer_decay=run.task.layer_decay)
    log.info("%s: %d training examples -> %d features, %d labels, %d steps (%d per epoch)", run.task.task,
             len(train_examples), len(train_features), len(task.labels), run.train.max_steps, per_epoch)
    callbacks = {}
    if run.task.gradual_unfreezing:  # ULMFiT: one more layer group (last first) per epoch
        from lmforge.training.unfreeze import GradualUnfreezing

        callbacks["unfreezing"] = GradualUnfreezing(model, steps_per_stage=per_epoch)
        log.info("gradual unfreezing: %d layer groups, one more every %d steps (an epoch)",
                 len(callbacks["unfreezing"].groups), per_epoch)
    if run.task.lm_weight:
        log.info("auxiliary LM loss: L = L_task + %g * L_LM (GPT-1; --task.lm_weight=0 turns it off)",
                 run.task.lm_weight)
    output = RunOutput(run.out, resume=resume, overwrite=overwrite, progress=progress, tokenizer=tokenizer,
                       run_config=to_dict(run), run_kind=f"finetune (task {run.task.task})")
    trainer = Trainer(model, TaskObjective(task, run.task.lm_weight or 0.0), data, run.train, output,
                      evaluator=evaluator, select=task.metric if evaluator else None, lr_scales=scales,
                      callbacks=callbacks)
    return trainer, task


class _ZeroMetricHint:
    """Warns once when, after an epoch or more of training, the dev evaluation shows a model that has learned
    nothing usable, and names the options that change that:

    * the selection metric is still 0 (a tagger that says "O" everywhere);
    * a classifier's dev MCC is 0 whatever the selection metric: its predictions carry no information about the
      gold labels, which is what predicting one class for every example gives (accuracy then equals the largest
      class's share and can look respectable). On a small training set this is the usual failure of a pretrained
      encoder fine-tuned with too few updates or at a rate its head cannot follow.
    """

    def __init__(self, run: FinetuneRun, task, per_epoch: int) -> None:
        self.run, self.task, self.per_epoch = run, task, per_epoch
        self.evaluations, self.done = 0, False

    def __call__(self, metrics: dict[str, float]) -> None:
        self.evaluations += 1
        value = metrics.get(self.task.metric)
        trained = self.evaluations * (self.run.train.eval_every or self.per_epoch)
        if self.done or trained < self.per_epoch:
            return
        train, head_lr = self.run.train, self.run.task.head_lr
        head = f"--head-lr (now {head_lr:g})" if head_lr is not None else "--head-lr (now the same as --lr)"
        mcc = metrics.get("mcc")
        if value is not None and value <= 0:
            self.done = True
            log.warning("dev %s is still %g: the model has learned nothing usable yet (a tagger that predicts only "
                        "O scores 0). With %d steps at lr %g the weights may be moving too slowly: raise %s or "
                        "--lr, or train longer (--epochs)", self.task.metric, value, train.max_steps, train.lr, head)
        elif mcc is not None and abs(mcc) < 1e-9:
            self.done = True
            log.warning("dev MCC is 0 (%s %.4g): the classifier's predictions carry no information about the labels, "
                        "as when it predicts one class for every example. With %d updates of %d examples at lr %g "
                        "it has not left its starting point: give it more updates (a smaller --batch-size such as "
                        "16, more --epochs) or a larger --lr (1e-4 for a small pretrained encoder)",
                        self.task.metric, value if value is not None else float("nan"), train.max_steps,
                        train.batch_size, train.lr)


def _default_schedule(run: FinetuneRun, kind: str, n_train: int) -> None:
    """Batch size and epochs for a small training set of a ``kind`` backbone (``default_lr``'s) when the user gave
    neither (see ``MIN_UPDATES``)."""
    if kind != "pretrained transformer" or run.train.max_steps is not None:
        return
    updates = math.ceil(n_train / run.train.batch_size) * run.task.epochs
    if updates >= MIN_UPDATES:
        return
    batch = min(run.train.batch_size, SMALL_DATA_BATCH)
    micro = run.train.micro_batch_size
    if micro is not None:  # whole micro-batches (the step accumulates them): never a batch smaller than one
        batch = max(micro, batch // micro * micro)
    per_epoch = math.ceil(n_train / batch)
    epochs = float(min(MAX_DEFAULT_EPOCHS, max(run.task.epochs, math.ceil(MIN_UPDATES / per_epoch))))
    run.train = from_dict(TrainConfig, {**to_dict(run.train), "batch_size": batch})
    run.task = from_dict(TaskConfig, {**to_dict(run.task), "epochs": epochs}, where="--task")
    log.info("small training set (%d examples): batch %d for %g epochs, %d updates (the defaults would make %d, too "
             "few for a pretrained encoder's new head; --batch-size and --epochs set them)", n_train, batch, epochs,
             math.ceil(epochs * per_epoch), math.ceil(updates))


def _default_rates(run: FinetuneRun, config: ModelConfig, choose_lr: bool) -> str:
    """Fill in the learning rates the user left to the recipe: ``train.lr`` by backbone (``choose_lr``), and a CRF
    tagger's head rate on a pretrained Transformer (the larger of ``CRF_HEAD_LR`` and lr) unless ``--head-lr`` is
    given. Returns the backbone's kind (``default_lr``)."""
    lr, kind = default_lr(run.model, config)
    if choose_lr and lr != run.train.lr:
        run.train = from_dict(TrainConfig, {**to_dict(run.train), "lr": lr})
        log.info("learning rate %g (the default for a %s backbone; --lr to change it)", lr, kind)
    crf_head = run.task.task == "token" and run.task.crf and kind == "pretrained transformer"
    if crf_head and run.task.head_lr is None and run.train.lr < CRF_HEAD_LR:
        run.task = from_dict(TaskConfig, {**to_dict(run.task), "head_lr": CRF_HEAD_LR}, where="--task")
        log.info("CRF tagger: the head (emissions and transitions) learns at %g, the encoder at %g: the head starts "
                 "from nothing (--head-lr to change it)", CRF_HEAD_LR, run.train.lr)
    return kind


# ---------------------------------------------------------------------------------------------- evaluate, predict
def load_task_model(directory: str, runtime: str = "torch"):
    """(model, task, tokenizer) of a fine-tuned model folder; ``runtime="onnx"`` runs its encoder in ONNX Runtime
    (``lmforge.persistence.onnx``)."""
    from lmforge.persistence import load_pretrained
    from lmforge.tasks import task_from_head_spec

    loaded = load_pretrained(directory, runtime=runtime)
    if not loaded.head or "task" not in loaded.head:
        raise LmforgeError(f"{directory}: not a fine-tuned model (its config.json has no task head); fine-tune it "
                           "first with `lmforge finetune`")
    if loaded.tokenizer is None:
        raise InputFileError(f"{directory}: the model folder has no tokenizer (vocab.txt)")
    return loaded.model, task_from_head_spec(loaded.head), loaded.tokenizer
