"""The pretraining recipe: BERT (MLM + NSP), RoBERTa (MLM), SpanBERT (MLM + SBO), GPT (causal LM), XLNet (PLM) and
the other objectives of ``lmforge.objectives.registry``.

A run is a ``PretrainRun`` (model preset and overrides, ``DataConfig``, the objective's loss options, ``TrainConfig``);
``build_trainer`` reads the
prepared corpus and its tokenizer, builds the model and its head, and returns the Trainer. Distributed runs need
nothing more than ``torchrun`` (see ``lmforge.training.distributed``). ``lmforge pretrain`` is its command line.
"""

from __future__ import annotations

import json
import logging
import warnings
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


PRETRAIN_STEPS = 1000  # train.max_steps when the run sets neither it nor a budget
# A masked LM "has left the plateau" when its held-out accuracy beats always guessing the most frequent masked token
# by more than this (absolute): one point of accuracy.
PLATEAU_MARGIN = 0.01


def check_finetune_defaults(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` (``{"train": {...}, "task": {...}}``) checked against ``TrainConfig`` and ``TaskConfig``; returned
    as given.

    Raises:
        LmforgeError: another table than train and task, or a key or value those configs refuse (named).
    """
    from lmforge.config import TaskConfig

    unknown = sorted(set(values) - {"train", "task"})
    if unknown:
        raise LmforgeError(f"{where}: [finetune] holds the tables train and task, not {', '.join(unknown)}")
    for name, cls in (("train", TrainConfig), ("task", TaskConfig)):
        table = values.get(name, {})
        if not isinstance(table, dict):
            raise LmforgeError(f"{where}: finetune.{name} must be a table, e.g. {name} = {{ lr = 1e-3 }}")
        try:
            from_dict(cls, table, where=f"{where}: finetune.{name}")
        except LmforgeError as err:
            raise LmforgeError(f"{where}: [finetune] {name} table: {err}") from None
    return values


def _run_config(folder: str | Path) -> dict[str, Any]:
    """The ``run_config.json`` of a run folder; {} when there is none or it cannot be read as a JSON object."""
    path = Path(folder) / "run_config.json"
    try:
        values = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return values if isinstance(values, dict) else {}


def recorded_finetune_defaults(folder: str | Path) -> dict[str, Any]:
    """The fine-tuning settings the pretraining recipe of ``folder`` recorded (its ``run_config.json``'s
    ``finetune``: ``{"train": {...}, "task": {...}}``); {} for any other folder, or none."""
    values = _run_config(folder).get("finetune")
    return check_finetune_defaults(values, str(Path(folder) / "run_config.json")) \
        if isinstance(values, dict) and values else {}


def plateau_warning(results: dict[str, Any]) -> str | None:
    """A warning when a finished masked-LM (or permutation-LM) run is still on the plateau: its held-out accuracy
    (``eval_mlm_accuracy``, ``eval_plm_accuracy``) within ``PLATEAU_MARGIN`` of the best constant guess
    (``eval_mlm_constant_accuracy``, ...); None when it has left it or the run has no such evaluation. The line names
    the anisotropy of its token states too (``eval_token_cosine``)."""
    for term in ("mlm", "plm"):
        accuracy, constant = results.get(f"eval_{term}_accuracy"), results.get(f"eval_{term}_constant_accuracy")
        if accuracy is None or constant is None or accuracy > constant + PLATEAU_MARGIN:
            continue
        cosine = results.get("eval_token_cosine")
        alike = f"; its token states are nearly alike (mean cosine {cosine:.2f})" if cosine is not None else ""
        name = term.upper()
        return (f"the {name} has not left the plateau: held-out {name} accuracy {accuracy:.3f}, against "
                f"{constant:.3f} for always predicting the most frequent target token{alike}. The model has learnt "
                "little yet to fine-tune from: train longer (--budget), or change the lr or the recipe")
    return None


@dataclass
class PretrainRun:
    """Everything one pretraining run needs. ``model`` holds overrides of the preset's ModelConfig.

    ``init_from``: a model folder (a finished pretraining run) whose weights and model config the run starts from,
    instead of a new model of ``preset``: language-model fine-tuning on new text (ULMFiT's stage (b)); ``model``
    overrides still apply (e.g. other dropouts), the sizes must stay. Its tokenizer is the default one, and the
    corpus must be prepared with it (``lmforge data prepare --tokenizer RUN``). ``layer_decay`` < 1: discriminative
    learning rates (ULMFiT: 1/2.6), layer group l of L gets ``lr * layer_decay ** (L + 1 - l)`` (embeddings l = 0,
    layer i at l = i + 1, the LM head at L + 1; ``lmforge.training.freeze.lr_scales``).
    """

    preset: str = "bert-mini"
    out: str = ""
    tokenizer: str = ""
    init_from: str = ""
    layer_decay: float = 1.0
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    # the objective's own options (``lmforge.objectives.options``: ELECTRA's rtd_weight, the AWD-LSTM's ar_alpha and
    # tar_beta, Transformer-XL's eval_mem_len), checked against the objective ``data.objective`` names
    loss: dict[str, Any] = field(default_factory=dict)
    # pretrain with every dropout of the model at 0 (Geiping & Goldstein 2023, Cramming: no dropout in pretraining),
    # while the saved folder keeps the model's dropouts for fine-tuning
    dropout_off: bool = False
    # how the models of this recipe should be fine-tuned, as measured for it (``[finetune]`` with ``train`` and
    # ``task`` tables, e.g. ``train = {lr = 1e-3}``, ``task = {pooling = "mean"}``): saved with the run's settings
    # (run_config.json), where `lmforge finetune` takes them as its defaults (the user's options still win)
    finetune: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        check_finetune_defaults(self.finetune, "pretrain")  # a bad [finetune] table fails before any work
        self._check_masking()

    def _check_masking(self) -> None:
        """Masking settings an objective would ignore are refused (a biLM or GPT run with --masking span would
        otherwise train exactly as without it)."""
        from lmforge.objectives.registry import OBJECTIVES

        objective = OBJECTIVES.get(self.data.objective)
        if objective is None or objective.masking == "config":
            return
        takers = ", ".join(name for name, o in OBJECTIVES.items() if o.masking == "config")
        defaults = DataConfig()
        if self.data.masking != defaults.masking and self.data.masking != objective.masking:
            what = (f"always masks {objective.masking}s" if objective.masking else "masks no tokens")
            raise LmforgeError(f"data.masking={self.data.masking!r} (--masking): objective {objective.name!r} "
                               f"{what}; leave the option out, or choose an objective that takes it ({takers})")
        if objective.masking is None and self.data.mask_prob != defaults.mask_prob:
            raise LmforgeError(f"data.mask_prob={self.data.mask_prob:g}: objective {objective.name!r} masks no "
                               "tokens; leave data.mask_prob out")

    @classmethod
    def _upgrade_values(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
        """A run's settings as this release reads them: the loss weights a ``[data]`` table held before objectives
        had their own options move to ``[loss]``, with a DeprecationWarning (they go in the next release)."""
        data = values.get("data")
        moved = [k for k in DataConfig.MOVED_TO_LOSS if isinstance(data, dict) and k in data]
        if not moved:
            return values
        warnings.warn(f"{where}: {', '.join(f'data.{k}' for k in moved)} moved to "
                      f"{', '.join(f'loss.{k}' for k in moved)} (the objective's loss options); the old keys go in "
                      "the next release", DeprecationWarning, stacklevel=3)
        loss = dict(values.get("loss") or {})
        for key in moved:
            if key in loss:
                raise LmforgeError(f"{where}: both data.{key} and loss.{key} are set; keep loss.{key}")
            loss[key] = data[key]
        return {**values, "data": {k: v for k, v in data.items() if k not in moved}, "loss": loss}


def build_pretraining_model(run: PretrainRun, vocab_size: int, pad_id: int | None = None):
    """The model for a run: ``TaskModel(backbone, head)`` when the objective has a head (the MLM objectives), else
    the backbone with its own LM head (GPT, XLNet); returns (model, ModelConfig, head spec or None).

    ``pad_id``: the tokenizer's [PAD] id, the config's ``pad_token_id`` of a new model unless the run's ``model``
    settings name one (the XLNet presets say 5, SentencePiece's id, but the data pads with the tokenizer's)."""
    import torch

    from lmforge.config import model_config_from_preset
    from lmforge.heads import TaskModel, build_head
    from lmforge.models import ARCHITECTURES, architecture
    from lmforge.objectives.registry import get_objective
    from lmforge.persistence import build_backbone

    objective = get_objective(run.data.objective)
    start = _start_model(run, vocab_size)
    pad = {} if pad_id is None or "pad_token_id" in run.model else {"pad_token_id": pad_id}
    config = start.config if start is not None else \
        model_config_from_preset(run.preset, **{**pad, **run.model, "vocab_size": vocab_size})
    # An objective names the one family it trains (its head and data plan are made for it), so this compares
    # families rather than asking a capability.
    if config.arch != objective.arch:
        hint = architecture(objective.arch).presets if objective.arch in ARCHITECTURES else objective.arch
        raise LmforgeError(f"objective {objective.name!r} trains a {objective.arch}, but preset {run.preset!r} is a "
                           f"{config.arch}; use a {hint} preset")
    if objective.check_model is not None:  # e.g. Transformer-XL: causal attention and a memory length
        objective.check_model(config, run.data)
    if run.data.seq_len > config.max_seq_len:
        raise LmforgeError(f"data.seq_len={run.data.seq_len} exceeds the model's max_seq_len={config.max_seq_len}; "
                           "lower --seq-len or raise --model.max_seq_len")
    torch.manual_seed(run.train.seed)  # a reproducible initialisation
    # the module pretrains without dropout when asked; ``config`` (returned, saved) keeps the fine-tuning dropouts
    built = config.without_dropout() if run.dropout_off else config
    backbone = build_backbone(built)  # after checking that it fits in memory
    if start is not None:  # the folder's module is a TaskModel when it was saved with a head
        backbone.load_state_dict((start.model.backbone if start.head is not None else start.model).state_dict())
    head = objective.head_spec(run.data)
    if head is None:
        if start is not None:
            log.info("starting from the weights of %s", run.init_from)
        return backbone, config, None
    model = TaskModel(backbone, build_head(head, built, backbone))
    if start is not None:
        # Continued pretraining (ULMFiT's stage b, domain-adaptive pretraining) continues the head as well when the
        # folder's head is the one this objective builds: a fresh MLM transform or output bias would first undo
        # what the backbone's top layer had fitted to the old head.
        if start.head == head:
            model.head.load_state_dict(start.model.head.state_dict())
            log.info("starting from the weights of %s, its %s head included", run.init_from, head.get("type"))
        else:
            log.info("starting from the backbone of %s with a new %s head (the folder's head is %s)", run.init_from,
                     head.get("type"), (start.head or {}).get("type", "none"))
    return model, config, head


def _start_model(run: PretrainRun, vocab_size: int):
    """``init_from``'s backbone and its config with the run's ``model`` overrides (None without ``init_from``)."""
    from lmforge.config import ModelConfig
    from lmforge.persistence import load_pretrained

    if not run.init_from:
        return None
    if not Path(run.init_from).is_dir():
        raise LmforgeError(f"--init-from {run.init_from}: not a folder; give the folder of a finished pretraining run "
                           "(it holds config.json and model.safetensors)")
    loaded = load_pretrained(run.init_from)  # with its pretraining head, which the run continues when it fits
    values = {**to_dict(loaded.config), **run.model}
    config = from_dict(ModelConfig, values, where=f"--init-from {run.init_from} with the run's model settings")
    # the size fields of every family (a family without one, e.g. a decoder's d_hidden, has None on both sides)
    sizes = [k for k in ("arch", "vocab_size", "d_model", "n_layers", "d_hidden", "d_ff", "n_heads", "reverse")
             if getattr(config, k, None) != getattr(loaded.config, k, None)]
    if sizes:
        raise LmforgeError(f"--init-from {run.init_from}: the run's model settings change {', '.join(sizes)}; "
                           "weights can only be continued at the same sizes (change dropouts only)")
    if vocab_size != config.vocab_size:
        raise LmforgeError(f"--init-from {run.init_from}: its embedding has {config.vocab_size} rows but the "
                           f"tokenizer {vocab_size} tokens; prepare the corpus with the run's own tokenizer "
                           f"(lmforge data prepare --tokenizer {run.init_from})")
    loaded.config = config
    return loaded


def recorded_settings(run: PretrainRun) -> dict[str, Any]:
    """The run's settings as ``run_config.json`` keeps them. A run started ``--init-from`` a folder takes its
    model from that folder, not from ``preset``: the preset recorded is the folder's own (from its
    ``run_config.json``), or none, never the unused default."""
    values = to_dict(run)
    if run.init_from:
        preset = _run_config(run.init_from).get("preset")
        values["preset"] = preset if isinstance(preset, str) else ""
    return values


def run_kind(run: PretrainRun) -> str:
    """What a pretraining run is, for the Trainer's resume check: the objective, and where the weights start."""
    start = f"starting from {run.init_from}" if run.init_from else "from scratch"
    return f"pretrain (objective {run.data.objective}, {start})"


def give_vocabulary(backbone, config, tokenizer) -> None:
    """A family whose token layer spells the vocabulary (ELMo's char CNN) gets the tokenizer's entries in id order."""
    from lmforge.models import architecture

    if architecture(config.arch).reads_characters:
        backbone.set_vocabulary([token or "" for token in tokenizer.ids_to_tokens])


def build_trainer(run: PretrainRun, *, resume: str = "never", overwrite: bool = False, progress: bool = True):
    """Everything of a pretraining run up to the Trainer: tokenizer, data, model, objective."""
    from lmforge.data.instances import TooFewDocumentsError
    from lmforge.data.lm_stream import LMStreamData
    from lmforge.data.pretraining import PretrainingData
    from lmforge.data.shards import ShardedCorpus
    from lmforge.objectives.registry import get_objective
    from lmforge.tokenizers import WordPieceTokenizer
    from lmforge.training.distributed import init_distributed
    from lmforge.training.trainer import RunOutput, Trainer
    from lmforge.utils.io import check_not_input

    # save_every stays unset: the Trainer's default cadence (steps or minutes) keeps checkpoints for --resume auto
    # with a budget (train.budget) max_steps stays unset unless given: the budget ends the run
    changes = {k: v for k, v in (("max_steps", None if run.train.budget else PRETRAIN_STEPS), ("eval_every", 0))
               if getattr(run.train, k) is None and v is not None}
    if changes:  # what pretraining derives: a fixed number of steps, no evaluation unless asked
        run.train = from_dict(TrainConfig, {**to_dict(run.train), **changes})
    if not 0.0 < run.layer_decay <= 1.0:
        raise LmforgeError(f"layer_decay={run.layer_decay} must be in (0, 1] (ULMFiT's discriminative rates: 1/2.6)")
    tokenizer_dir = Path(run.tokenizer) if run.tokenizer else \
        Path(run.init_from) if run.init_from else Path(run.data.path) / "tokenizer"
    check_not_input(run.out, [run.data.path, run.tokenizer, run.init_from])
    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    corpus = ShardedCorpus(run.data.path, tokenizer)
    info = init_distributed()

    def data(split: str) -> PretrainingData:
        objective = get_objective(run.data.objective)
        kind = LMStreamData if objective.plan == "stream" else PretrainingData  # the plans of a stateful LM
        if objective.plan == "plm" and run.data.reuse_len is not None:  # XLNet with memory: a stream of sequences
            from lmforge.data.plm_stream import PLMStreamData

            kind = PLMStreamData
        if objective.plan == "denoise":  # BART's (corrupted text, text) pairs
            from lmforge.data.corruption import DenoisingData

            kind = DenoisingData
        return kind(corpus, run.data, tokenizer, plan=objective.plan,
                               masking=objective.masking_for(run.data), split=split, seed=run.train.seed,
                               rank=info.rank, world_size=info.world_size)

    get_objective(run.data.objective).options(run.loss)  # an unknown name or option fails before the corpus is read
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
    if hasattr(train, "check_micro_batch"):  # XLNet's bi_data: before the run folder is written
        from lmforge.training.runtime import split_batch

        train.check_micro_batch(split_batch(run.train, info.world_size)[0])
    if run.train.optimizer == "nt_asgd" and (evaluation is None or not run.train.eval_every):
        raise LmforgeError("optimizer nt_asgd starts averaging when the held-out loss stops improving: it needs "
                           "held-out documents (data.eval_fraction > 0) and an evaluation cadence (--eval-every N)")
    model, config, _ = build_pretraining_model(run, tokenizer.vocab_size, tokenizer.pad_id)  # config, head travel
    for split_data in (train, evaluation):  # a backward AWD-LSTM LM reads the stream right to left
        if isinstance(split_data, LMStreamData):
            split_data.reverse = bool(getattr(config, "reverse", False))
            if config.arch == "bilm":  # both directions' windows, of a fixed length (bilm-tf's unroll_steps)
                split_data.bidirectional, split_data.variable = True, False
    give_vocabulary(getattr(model, "backbone", model), config, tokenizer)
    if getattr(config, "softmax_samples", 0) and getattr(config, "softmax_sampler", None) == "log_uniform":
        getattr(model, "backbone", model).set_token_counts(corpus.token_counts())  # bilm-tf's frequency ranking
    objective = get_objective(run.data.objective).build_loss(run.data, run.loss)
    scales = None
    if run.layer_decay < 1.0:
        from lmforge.training.freeze import lr_scales

        scales = lr_scales(model, lr=run.train.lr, layer_decay=run.layer_decay)
    # saved models carry ``config``: with dropout_off, the module trains without dropout and the folder keeps it
    output = RunOutput(run.out, resume=resume, overwrite=overwrite, progress=progress, tokenizer=tokenizer,
                       run_config=recorded_settings(run), run_kind=run_kind(run), model_config=config)
    return Trainer(model, objective, train, run.train, output, eval_data=evaluation, lr_scales=scales)
