"""The encoder-decoder recipe: train a Transformer encoder-decoder or an attentional RNN on (source, target) pairs.

Vaswani et al. (2017) as the defaults: teacher forcing, label smoothing 0.1, the inverse-square-root schedule with
warm-up, one vocabulary shared by source and target. The dev set is decoded (greedy by default) every epoch and
scored with ROUGE; the best model by ``select`` (ROUGE-L) is kept; at the end the test set, when there is one, is
decoded with ``[decode]`` (e.g. beam 4 with the GNMT length penalty) into ``test_results.json`` and
``test_predictions.jsonl``.

``data.train = "bbc-headlines"`` uses the embedded BBC News corpus: write each article's title from its body,
on a fixed per-topic split (``lmforge.data.seq2seq``).

Without ``tokenizer``, a WordPiece vocabulary of ``vocab_size`` tokens is trained by pair count on the training
sources and targets (deterministic, so a resumed run gets the same one) and saved with the model.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.config import TrainConfig, from_dict, to_dict
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")


BBC_HEADLINES = "bbc-headlines"


SEQ2SEQ_DEFAULTS: dict[str, Any] = {"train": {"schedule": "inverse_sqrt", "warmup_steps": 400, "lr": 1e-3,
                                              "batch_size": 32, "beta2": 0.98, "eps": 1e-9, "weight_decay": 0.0,
                                              "log_every": 10}}


@dataclass
class Seq2SeqDataConfig:
    """Where the pairs come from and how long they may be (in word pieces)."""

    train: str = ""
    dev: str = ""
    test: str = ""
    source_column: str = "source"
    target_column: str = "target"
    max_source_len: int = 256
    max_target_len: int = 32
    dev_fraction: float = 0.05
    test_fraction: float = 0.1
    split_seed: int = 0
    max_dev_examples: int = 200

    def __post_init__(self) -> None:
        if self.max_source_len < 1 or self.max_target_len < 3 or self.max_dev_examples < 1:
            raise LmforgeError("invalid data config: max_source_len >= 1, max_target_len >= 3 and "
                               "max_dev_examples >= 1 are required")


@dataclass
class DecodeConfig:
    """How to decode the test set, and the dev set at each evaluation (``dev_strategy``: greedy, the fast default,
    or beam with these beams and length penalty, slower but what the test set gets)."""

    strategy: str = "beam"
    beams: int = 4
    length_penalty: str = "gnmt:0.6"
    max_new_tokens: int = 30
    no_repeat_ngram: int = 0
    dev_strategy: str = "greedy"

    def __post_init__(self) -> None:
        for name in ("strategy", "dev_strategy"):
            if getattr(self, name) not in ("greedy", "beam"):
                raise LmforgeError(f"decode.{name}={getattr(self, name)!r} is not one of greedy, beam")


@dataclass
class Seq2SeqRun:
    preset: str = "rnn-seq2seq"
    model: dict[str, Any] = field(default_factory=dict)
    tokenizer: str = ""
    vocab_size: int = 8000
    out: str = ""
    init: str = ""  # a model folder (e.g. `lmforge pretrain --objective denoise`) whose weights the model starts from
    epochs: float = 10.0
    label_smoothing: float = 0.1
    select: str = "rougeL"
    data: Seq2SeqDataConfig = field(default_factory=Seq2SeqDataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def load_data(run: Seq2SeqRun):
    """(train, dev, test) example lists."""
    from lmforge.data.seq2seq import bbc_headlines, headline_split, read_pairs

    d = run.data
    if d.train == BBC_HEADLINES:
        from lmforge.data.corpora import bbc_news_dir

        examples = bbc_headlines(bbc_news_dir())
        train, dev, test = headline_split(examples, dev_fraction=d.dev_fraction, test_fraction=d.test_fraction,
                                          seed=d.split_seed)
        return [examples[i] for i in train], [examples[i] for i in dev], [examples[i] for i in test]

    def read(path: str):
        return read_pairs(path, source_column=d.source_column, target_column=d.target_column) if path else []

    return read(d.train), read(d.dev), read(d.test)


def build_model(run: Seq2SeqRun, vocab_size: int, pad_id: int):
    import torch

    from lmforge.config import model_config_from_preset
    from lmforge.models import architecture, architectures_with
    from lmforge.persistence import build_backbone

    start = _start_model(run, vocab_size) if run.init else None
    config = start.config if start is not None else \
        model_config_from_preset(run.preset, **{**run.model, "vocab_size": vocab_size, "pad_token_id": pad_id})
    family = architecture(config.arch)
    if not family.has_encoder_decoder:
        presets = ", ".join(architecture(name).presets for name in architectures_with("has_encoder_decoder"))
        raise LmforgeError(f"preset {run.preset!r} is a {config.arch}; train-seq2seq needs an encoder-decoder "
                           f"({presets})")
    if family.position_limited and run.data.max_source_len > config.max_seq_len:  # an RNN reads any length
        raise LmforgeError(f"data.max_source_len={run.data.max_source_len} exceeds the model's max_seq_len="
                           f"{config.max_seq_len}")
    torch.manual_seed(run.train.seed)
    model = build_backbone(config)  # after checking that it fits in memory
    if start is not None:
        model.load_state_dict(start.model.state_dict())
        log.info("train-seq2seq: starting from the weights of %s (its model config; preset %s not used)", run.init,
                 run.preset)
    return model, config


def describe_model(run: Seq2SeqRun, config, model=None) -> str:
    """An honest name for the trained model: the preset (or ``--init`` folder), the settings that differ from it
    (``transformer-base with d_model 512 -> 64, n_layers 6 -> 2``), and the parameter count when ``model`` is
    given. The vocabulary size always comes from the tokenizer and is not listed."""
    from lmforge.config import model_config_from_preset

    name = run.init or run.preset
    if run.init:
        changed = sorted(k for k in run.model if k in INIT_MAY_CHANGE)
        parts = [f"{k} {getattr(config, k)}" for k in changed]
    else:
        base = to_dict(model_config_from_preset(run.preset, vocab_size=config.vocab_size,
                                                pad_token_id=config.pad_token_id))
        now = to_dict(config)
        parts = [f"{k} {base[k]} -> {now[k]}" for k in now if k in base and now[k] != base[k]]
    text = f"{name} with {', '.join(parts)}" if parts else name
    if model is not None:
        n = sum(p.numel() for p in model.parameters())
        text += f", {n / 1e6:.1f}M parameters" if n >= 1e6 else f", {n / 1e3:.1f}k parameters"
    return text


# --init: what a run may still change of the folder's model (regularisation and the attention kernel, not a shape)
INIT_MAY_CHANGE = ("dropout", "attention_dropout", "kernel")


def _start_model(run: Seq2SeqRun, vocab_size: int):
    """The ``--init`` folder's model, its config with the run's ``model`` settings (dropouts only)."""
    from lmforge.config import ModelConfig
    from lmforge.models import architecture
    from lmforge.persistence import load_backbone

    _check_init_folder(run)
    loaded = load_backbone(run.init)
    if not architecture(loaded.config.arch).has_encoder_decoder:
        raise LmforgeError(f"--init {run.init}: a {loaded.config.arch} model; train-seq2seq starts only from an "
                           "encoder-decoder folder (e.g. lmforge pretrain --preset bart-tiny --objective denoise)")
    fixed = sorted(k for k in run.model if k not in INIT_MAY_CHANGE)
    if fixed:
        raise LmforgeError(f"--init {run.init}: the run's model settings change {', '.join(fixed)}; a model started "
                           f"from weights keeps their shapes (only {', '.join(INIT_MAY_CHANGE)} may change)")
    config = from_dict(ModelConfig, {**to_dict(loaded.config), **run.model},
                       where=f"--init {run.init} with the run's model settings")
    if vocab_size != config.vocab_size:
        raise LmforgeError(f"--init {run.init}: its embedding has {config.vocab_size} rows but the tokenizer has "
                           f"{vocab_size} tokens; fine-tune with the folder's own tokenizer (leave out --tokenizer)")
    loaded.config = config
    return loaded


def _check_init_folder(run: Seq2SeqRun) -> None:
    if not Path(run.init).is_dir():
        raise LmforgeError(f"--init {run.init}: not a folder; give a model folder (config.json and model.safetensors), "
                           "e.g. the --out of `lmforge pretrain --objective denoise`")


def init_tokenizer(run: Seq2SeqRun):
    """The tokenizer of a run with ``--init``: the folder's; a ``--tokenizer`` given as well must be the same one."""
    from lmforge.tokenizers import WordPieceTokenizer

    _check_init_folder(run)
    if not (Path(run.init) / "vocab.txt").is_file():
        raise LmforgeError(f"--init {run.init}: the folder has no tokenizer (vocab.txt); the weights need the "
                           "tokenizer they were trained with: pass it with --tokenizer DIR")
    own = WordPieceTokenizer.from_pretrained(run.init)
    if run.tokenizer:
        given = WordPieceTokenizer.from_pretrained(run.tokenizer)
        if given.ids_to_tokens != own.ids_to_tokens:
            raise LmforgeError(f"--tokenizer {run.tokenizer} is not the tokenizer of --init {run.init} (their "
                               "vocabularies differ); leave out --tokenizer to use the folder's")
    return own


def decode_texts(model, tokenizer, features: list[dict[str, Any]], decode: DecodeConfig, *, batch_size: int = 32,
                 greedy: bool = False) -> list[str]:
    """Generate a target text for each source feature (``src_ids``)."""
    import torch

    from lmforge.generation import generate

    order = sorted(range(len(features)), key=lambda i: len(features[i]["src_ids"]))
    texts: list[str] = [""] * len(features)
    device = next(model.parameters()).device
    options: dict[str, Any] = {"max_new_tokens": decode.max_new_tokens, "bos_id": tokenizer.cls_id,
                               "eos_id": tokenizer.sep_id, "pad_id": tokenizer.pad_id}
    if greedy or decode.strategy == "greedy":
        options["strategy"] = "greedy"
    else:
        options.update(strategy="beam", num_beams=decode.beams, length_penalty=decode.length_penalty)
    if decode.no_repeat_ngram:
        options["no_repeat_ngram_size"] = decode.no_repeat_ngram
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(features[i]["src_ids"]) for i in chunk)
        ids = torch.full((len(chunk), width), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            src = features[i]["src_ids"]
            ids[row, :len(src)] = torch.tensor(src)
            mask[row, :len(src)] = 1
        out = generate(model, ids.to(device), mask.to(device), **options)
        for row, i in enumerate(chunk):
            texts[i] = tokenizer.decode(out.sequences[row][0], skip_special_tokens=True)
    return texts


def train_tokenizer(run: Seq2SeqRun, train: list[Any]):
    """A shared WordPiece vocabulary (merged by pair count) of the training sources and targets."""
    import time

    from lmforge.tokenizers import WordPieceTrainer

    if run.vocab_size < 100:
        raise LmforgeError(f"vocab_size={run.vocab_size}: a trained tokenizer needs at least 100 tokens")
    start = time.perf_counter()
    tokenizer = WordPieceTrainer(run.vocab_size, algorithm="bpe-count").train(e.source + "\n" + e.target
                                                                              for e in train)
    log.info("train-seq2seq: no --tokenizer, so trained a %d-token WordPiece vocabulary on the %d training pairs "
             "in %.1f s (saved with the model)", tokenizer.vocab_size, len(train), time.perf_counter() - start)
    return tokenizer


def build_seq2seq_trainer(run: Seq2SeqRun, *, resume: str = "never",
                          overwrite: bool = False, progress: bool = True):
    from lmforge.data.batches import FeatureData
    from lmforge.data.seq2seq import collate_pairs, featurize_pairs
    from lmforge.metrics import rouge_scores
    from lmforge.objectives import Seq2SeqObjective
    from lmforge.tokenizers import WordPieceTokenizer
    from lmforge.training.distributed import init_distributed
    from lmforge.training.trainer import RunOutput, Trainer
    from lmforge.utils.io import check_not_input

    check_not_input(run.out, [p for p in (run.tokenizer, run.init, run.data.train, run.data.dev, run.data.test)
                              if p and Path(p).exists()])
    train, dev, test = load_data(run)
    d = run.data
    if run.init:  # the weights come with their tokenizer
        tokenizer = init_tokenizer(run)
    else:
        tokenizer = WordPieceTokenizer.from_pretrained(run.tokenizer) if run.tokenizer else train_tokenizer(run, train)

    def featurize(examples, what: str):
        features, cut_src, cut_tgt = featurize_pairs(examples, tokenizer, max_source_len=d.max_source_len,
                                                     max_target_len=d.max_target_len)
        if cut_src or cut_tgt:
            log.info("%s: %d of %d sources cut to %d pieces, %d targets to %d", what, cut_src, len(examples),
                     d.max_source_len, cut_tgt, d.max_target_len - 2)
        return features

    train_features = featurize(train, "train")
    dev = dev[:d.max_dev_examples]
    dev_features = featurize(dev, "dev") if dev else []
    model, config = build_model(run, tokenizer.vocab_size, tokenizer.pad_id)
    info = init_distributed()
    data = FeatureData(train_features, lambda fs: collate_pairs(fs, tokenizer.pad_id), seed=run.train.seed,
                       rank=info.rank, world_size=info.world_size, group_by_length=run.train.group_by_length)
    per_epoch = data.steps_per_epoch(run.train.batch_size)
    changes: dict[str, Any] = {}
    if run.train.max_steps is None:
        changes["max_steps"] = max(1, math.ceil(run.epochs * per_epoch))
    if run.train.eval_every is None:
        changes["eval_every"] = per_epoch if dev else 0
    if run.train.save_every is None:
        changes["save_every"] = per_epoch
    if changes:
        run.train = from_dict(TrainConfig, {**to_dict(run.train), **changes})
    evaluator = None
    if dev:
        references = [e.target for e in dev]

        def evaluator(m):
            greedy = run.decode.dev_strategy == "greedy"
            return rouge_scores(decode_texts(m, tokenizer, dev_features, run.decode, greedy=greedy), references)

    log.info("train-seq2seq: %s, %d training pairs, %d dev, %d test; %d steps (%d per epoch)",
             describe_model(run, config, model), len(train), len(dev), len(test), run.train.max_steps, per_epoch)
    output = RunOutput(run.out, resume=resume, overwrite=overwrite, progress=progress, tokenizer=tokenizer,
                       run_config=to_dict(run))
    trainer = Trainer(model, Seq2SeqObjective(run.label_smoothing), data, run.train, output, evaluator=evaluator,
                      select=run.select if evaluator else None)
    return trainer, tokenizer, test


def evaluate_test(run: Seq2SeqRun, trainer, tokenizer, test) -> dict[str, float] | None:
    """Decode the test set with the final (best) model; write test_results.json and test_predictions.jsonl."""
    from lmforge.data.seq2seq import featurize_pairs
    from lmforge.metrics import rouge_scores
    from lmforge.utils.io import atomic_open, atomic_write_text
    from lmforge.utils.model_card import write_model_card

    if not test:
        return None
    features, _, _ = featurize_pairs(test, tokenizer, max_source_len=run.data.max_source_len,
                                     max_target_len=run.data.max_target_len)
    predictions = decode_texts(trainer.model.eval(), tokenizer, features, run.decode)
    scores = rouge_scores(predictions, [e.target for e in test])
    out = Path(run.out)
    atomic_write_text(out / "test_results.json", json.dumps({**scores, "decode": to_dict(run.decode),
                                                             "examples": len(test)}, indent=2) + "\n")
    with atomic_open(out / "test_predictions.jsonl", "w") as f:
        for e, p in zip(test, predictions, strict=True):
            f.write(json.dumps({"prediction": p, "reference": e.target}, ensure_ascii=False) + "\n")
    write_model_card(out)  # the run's README.md, now with the test scores
    return scores
