"""The configs of a run: how the Trainer optimises (``TrainConfig``), the pretraining data (``DataConfig``) and a
fine-tuning task (``TaskConfig``)."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass

from lmforge.choices import (
    INPUT_FORMATS,
    LONG_TEXT,
    MASKINGS,
    OPTIMIZERS,
    PARALLELS,
    PRECISIONS,
    SCHEDULES,
    SEQUENCE_POOLINGS,
    SPAN_POOLINGS,
    TAG_SCHEMES,
    TASKS,
    WORD_POOLINGS,
)
from lmforge.errors import LmforgeError

BUDGET_FORMS = ("a training time such as 30s, 10m or 1.5h, or a number of tokens (all processes together) such as "
                "123456tok, 200ktok, 5Mtok or 1Gtok")
_TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_TOKEN_UNITS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:(?P<time>[smh])|(?P<scale>[kKMGB]?)tok)\s*$")


@dataclass(frozen=True)
class Budget:
    """A parsed ``TrainConfig.budget``: ``kind`` "time" (``amount`` in seconds of training) or "tokens" (``amount``
    tokens, the global count the Trainer keeps)."""

    kind: str
    amount: float

    def describe(self) -> str:
        return f"{self.amount:g} s of training" if self.kind == "time" else f"{int(self.amount)} tokens"


def parse_budget(text: str) -> Budget | None:
    """``TrainConfig.budget`` as a ``Budget`` (None for "": no budget).

    Raises:
        LmforgeError: not one of ``BUDGET_FORMS``, or not positive.
    """
    if not text:
        return None
    match = _BUDGET.match(str(text))
    if match is None:
        raise LmforgeError(f"budget={text!r} is not a budget: give {BUDGET_FORMS}")
    number = float(match.group(1))
    if match.group("time"):
        amount = number * _TIME_UNITS[match.group("time")]
        if not 0 < amount < math.inf:
            raise LmforgeError(f"budget={text!r} must be a positive time ({BUDGET_FORMS})")
        return Budget("time", amount)
    tokens = round(number * _TOKEN_UNITS[match.group("scale")])
    if tokens < 1:
        raise LmforgeError(f"budget={text!r} must be at least one token ({BUDGET_FORMS})")
    return Budget("tokens", float(tokens))


@dataclass
class TrainConfig:
    """How the Trainer optimises: batch, schedule, precision, evaluation, logging and checkpoints.

    ``batch_size`` is the global number of sequences per optimizer step; each process runs micro-batches of
    ``micro_batch_size`` (default: the whole share of one process) and accumulates
    ``batch_size / (micro_batch_size * world_size)`` of them.

    ``budget`` (empty: none) trains for a time (``"10m"``: 10 minutes of training, ``"30s"``, ``"1.5h"``) or a
    number of tokens (``"5Mtok"``, ``"200ktok"``, ``"123456tok"``; the global count) instead of a number of steps:
    the warm-up (``warmup_ratio``) and the decay follow the elapsed fraction of the budget
    (``lmforge.training.optim.lr_multiplier_at``), the run stops after the update that reaches the budget, and
    ``max_steps`` is then an optional cap. The elapsed fraction is checkpointed: a resumed run continues the same
    schedule (a token budget exactly; a time budget with the time that remains).
    """

    max_steps: int | None = None  # None: derived by the recipe (epochs x batches per epoch; pretraining: 1000)
    budget: str = ""  # a time (30s, 10m, 1.5h) or tokens (200ktok, 5Mtok): see the class docstring
    # Cramming's batch-size ramp (Geiping & Goldstein 2023): over the first batch_ramp of the run (of max_steps, or
    # of the budget) the batch grows linearly from one micro-batch per process to batch_size, in whole micro-batches
    # (lmforge.training.budget.RunLimit.accumulation); 0: the full batch from the first step
    batch_ramp: float = 0.0
    batch_size: int = 32
    micro_batch_size: int | None = None
    optimizer: str = "adamw"  # OPTIMIZERS; "lamb": LAMB (You et al. 2020) for large batches (lmforge.training.optim)
    lr: float = 1e-4
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    schedule: str = "linear"
    warmup_steps: int | None = None
    warmup_ratio: float = 0.01
    min_lr_ratio: float = 0.0
    stlr_cut_frac: float = 0.1  # schedule slanted_triangular (ULMFiT eq. 3): the fraction of steps that increase
    stlr_ratio: float = 32.0  # ... and how much smaller the lowest lr is than the peak
    max_grad_norm: float = 1.0
    # optimizer nt_asgd (Merity et al. 2018, Algorithm 1): the non-monotone interval n; the averaging starts at the
    # first evaluation whose eval_loss is worse than the best one before the last n (lmforge.training.ntasgd)
    nonmono: int = 5
    # fp32; bf16 (autocast); auto: bf16 only where the device runs it natively and measurably faster for this model
    # (lmforge.training.precision), decided once per run and kept on resume
    precision: str = "fp32"
    # torch.compile the model the objective calls (lmforge.utils.compiling); checkpoints come from the plain module,
    # and a run may resume with compile switched on or off
    compile: bool = False
    eval_every: int | None = None  # None: derived by the recipe (fine-tuning: every epoch; else 0 = off)
    eval_batches: int = 20
    log_every: int = 10
    # Checkpoints: every save_every steps (0 = none by steps) and every save_minutes minutes of training (0 = none by
    # time), whichever comes first, and always at the end and on SIGTERM / SIGINT. None: the recipe's choice
    # (fine-tuning, seq2seq: every epoch), else the default cadence of DEFAULT_SAVE_EVERY steps or
    # DEFAULT_SAVE_MINUTES minutes, whose checkpoints are skipped while writing would take over 1/20 of the training
    # time (lmforge.training.trainer).
    save_every: int | None = None
    save_minutes: float | None = None
    keep_last: int = 2
    seed: int = 0
    tensorboard: bool = False
    # fine-tuning and seq2seq batches: each epoch's random order is cut into groups of 50 micro-batches sorted by
    # length inside, so a batch holds inputs of similar length (less padding; transformers' group_by_length)
    group_by_length: bool = False
    device: str = "auto"
    # several processes (torchrun): ddp replicates the model, fsdp shards parameters, gradients and optimizer state
    # (FSDP2; lmforge.training.distributed); ignored in a single process
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        problems = []
        if self.parallel not in PARALLELS:
            problems.append(f"parallel={self.parallel!r} is not one of {', '.join(PARALLELS)}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer={self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} is not one of {', '.join(PRECISIONS)}")
        for name in ("max_steps", "batch_size", "log_every", "eval_batches", "nonmono"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            problems.append(f"micro_batch_size={self.micro_batch_size} must be >= 1")
        for name in ("eval_every", "save_every", "keep_last"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0 (0 = off / keep all)")
        if not 0 <= self.seed < 2**32:
            problems.append(f"seed={self.seed} must be in [0, 2**32)")
        for name in ("lr", "weight_decay", "beta1", "beta2", "eps", "warmup_ratio", "min_lr_ratio", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                problems.append(f"{name}={getattr(self, name)} must be a finite number")
        if self.save_minutes is not None and not 0 <= self.save_minutes < math.inf:
            problems.append(f"save_minutes={self.save_minutes} must be a finite number >= 0 (0 = no time-based "
                            "checkpoints)")
        if problems:  # the range checks below would pass NaN
            raise LmforgeError("invalid train config: " + "; ".join(problems))
        if self.lr <= 0:
            problems.append(f"lr={self.lr} must be positive")
        if self.weight_decay < 0:
            problems.append(f"weight_decay={self.weight_decay} must be >= 0 (0 = none)")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        if self.eps <= 0:
            problems.append(f"eps={self.eps} must be positive")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if not 0.0 < self.stlr_cut_frac < 1.0:
            problems.append(f"stlr_cut_frac={self.stlr_cut_frac} must be in (0, 1)")
        if not 1.0 <= self.stlr_ratio < math.inf:
            problems.append(f"stlr_ratio={self.stlr_ratio} must be a finite number >= 1")
        if self.max_grad_norm < 0:
            problems.append(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0 = no clipping)")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            problems.append(f"warmup_steps={self.warmup_steps} must be >= 0")
        if not 0.0 <= self.warmup_ratio < 1.0:
            problems.append(f"warmup_ratio={self.warmup_ratio} must be in [0, 1)")
        if not 0.0 <= self.batch_ramp <= 1.0:  # also refuses NaN
            problems.append(f"batch_ramp={self.batch_ramp} must be in [0, 1] (the share of the run over which the "
                            "batch grows to batch_size; 0: no ramp)")
        try:
            budget = parse_budget(self.budget)
        except LmforgeError as err:
            problems.append(str(err))
            budget = None
        if budget is not None and self.warmup_steps is not None:
            problems.append(f"warmup_steps={self.warmup_steps} cannot be used with budget={self.budget!r}: the "
                            "warm-up of a budget is a share of it, warmup_ratio")
        if budget is not None and self.schedule == "inverse_sqrt" and self.warmup_ratio == 0:
            problems.append(f"schedule inverse_sqrt with budget={self.budget!r} needs warmup_ratio > 0 (its decay "
                            "sqrt(warmup_ratio / fraction) is scaled by the warm-up)")
        if problems:
            raise LmforgeError("invalid train config: " + "; ".join(problems))

    def budget_spec(self) -> Budget | None:
        """The parsed ``budget`` (None: the run is limited by ``max_steps``)."""
        return parse_budget(self.budget)

    def warmup(self) -> int:
        """Warm-up steps: ``warmup_steps`` when given, else ``warmup_ratio * max_steps`` (which must be set)."""
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * self.max_steps)


# The default checkpoint cadence (TrainConfig.save_every / save_minutes = None): whichever comes first.
DEFAULT_SAVE_EVERY = 500
DEFAULT_SAVE_MINUTES = 10.0


@dataclass
class DataConfig:
    """Pretraining data: prepared shards, instance creation and masking (google-research/bert, SpanBERT).

    The weights of an objective's loss terms are not data: they are the objective's own options (``[loss]``,
    ``lmforge.objectives.options``). ``MOVED_TO_LOSS`` names the ones this config held before.
    """

    MOVED_TO_LOSS: typing.ClassVar[tuple[str, ...]] = ("ar_alpha", "tar_beta", "eval_mem_len", "rtd_weight")

    path: str = ""
    objective: str = "mlm+nsp"
    seq_len: int = 128
    short_seq_prob: float = 0.1
    nsp_prob: float = 0.5  # the share of negative pairs: a random B (NSP) or the two segments swapped (SOP)
    masking: str = "token"
    mask_prob: float = 0.15
    max_predictions: int | None = None  # None: round(mask_prob * seq_len), the budget following the length
    nsp_balance: str = "exact"  # exact: 50/50 by construction; bert: google-research/bert's draw (about 56/44)
    mask_token_ratio: float = 0.8
    random_token_ratio: float = 0.1
    span_p: float = 0.2
    max_span_len: int = 10
    max_ngram: int = 3  # masking "ngram" (ALBERT): the longest n-gram in words
    static: bool = False
    dupe_factor: int = 5
    eval_fraction: float = 0.02
    variable_bptt: bool = True  # plan "stream" (AWD-LSTM): window lengths drawn around seq_len (Merity et al. 2018)
    # objective plm (XLNet, lmforge.data.permutation): about 1/partial_k of the tokens are predicted, in spans of up
    # to plm_max_span words; num_predict is the number of prediction rows per sequence (None: ceil(seq_len / partial_k))
    partial_k: float = 6.0
    plm_max_span: int = 5
    num_predict: int | None = None
    # objective plm with segment recurrence (lmforge.data.plm_stream; XLNet section 2.4): reuse_len = the first tokens
    # of each sequence, whose states the next sequence of the same row attends as memory (the model's mem_len keeps
    # them); None: independent packed sequences, no memory. perm_size: XLNet's local permutation (chunks of perm_size,
    # one shuffle of the offsets); bi_data: half the rows read the stream reversed. XLNet: seq_len 512, reuse_len 256,
    # perm_size 256, mem_len 384, bi_data true.
    reuse_len: int | None = None
    perm_size: int | None = None
    bi_data: bool = False
    # objective denoise (BART, Lewis et al. 2020; lmforge.data.corruption): how the encoder's input is corrupted, each
    # a share of the tokens (permute_sentences: of the sentences; rotate_prob: a probability per example); 0 = off.
    # The defaults are BART's final mix: text infilling of 30% of the tokens in Poisson(3) spans + every sentence
    # shuffled. Each step acts on the tokens the earlier ones left (order: lmforge.data.corruption.Corruption).
    infill_rate: float = 0.3
    poisson_lambda: float = 3.0
    permute_sentences: float = 1.0
    rotate_prob: float = 0.0
    token_mask_rate: float = 0.0
    substitute_rate: float = 0.0
    delete_rate: float = 0.0
    # objective clm (plan "causal", lmforge.data.instances.DocAlignedBlocks): every row starts at a document start
    # ([SEP] + the document + [SEP], cut into rows of at most seq_len + 1 tokens; a document's last row is shorter and
    # padded) instead of windows of the [SEP]-joined stream, where a document may start mid-row after the previous
    # document's tokens. Costs the padding; a 2-layer GPT found its induction head sooner this way on short documents.
    doc_aligned: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.objective, str) or not self.objective:  # the name is checked by the objective
            problems.append(f"objective={self.objective!r} must be a name")  # registry (lmforge.objectives)
        if self.masking not in MASKINGS:
            problems.append(f"masking={self.masking!r} is not one of {', '.join(MASKINGS)}")
        if self.seq_len < 8:
            problems.append(f"seq_len={self.seq_len} must be >= 8")
        for name in ("short_seq_prob", "nsp_prob", "mask_prob", "mask_token_ratio", "random_token_ratio",
                     "eval_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1]")
        if self.mask_token_ratio + self.random_token_ratio > 1.0:
            problems.append(f"mask_token_ratio + random_token_ratio = "
                            f"{self.mask_token_ratio + self.random_token_ratio} exceeds 1")
        if not 0.0 < self.span_p <= 1.0:
            problems.append(f"span_p={self.span_p} must be in (0, 1]")
        if self.nsp_balance not in ("exact", "bert"):
            problems.append(f"nsp_balance={self.nsp_balance!r} is not one of exact, bert")
        if self.max_span_len < 1 or self.max_ngram < 1 or \
                (self.max_predictions is not None and self.max_predictions < 1) or \
                self.dupe_factor < 1:
            problems.append("max_span_len, max_ngram, max_predictions and dupe_factor must be >= 1")
        problems += self._plm_problems()
        problems += self._denoise_problems()
        if not isinstance(self.doc_aligned, bool):
            problems.append(f"doc_aligned={self.doc_aligned!r} must be true or false")
        elif self.doc_aligned and self.objective != "clm":
            problems.append(f"doc_aligned=true applies to objective clm only (rows cut per document), not "
                            f"objective={self.objective!r}")
        if problems:
            raise LmforgeError("invalid data config: " + "; ".join(problems))

    def _plm_problems(self) -> list[str]:
        """The PLM options (objective plm); checked for every objective (their defaults are valid)."""
        problems = []
        if not 1.0 <= self.partial_k <= self.seq_len:  # also refuses NaN
            problems.append(f"partial_k={self.partial_k} must be in [1, seq_len={self.seq_len}]: about 1/partial_k of "
                            "the tokens are predicted (XLNet 6; 1 predicts every token)")
        if isinstance(self.plm_max_span, bool) or not isinstance(self.plm_max_span, int) or self.plm_max_span < 1:
            problems.append(f"plm_max_span={self.plm_max_span!r} must be an integer >= 1 (XLNet 5)")
        if self.num_predict is not None and (isinstance(self.num_predict, bool) or not isinstance(self.num_predict, int)
                                             or not 1 <= self.num_predict <= self.seq_len):
            problems.append(f"num_predict={self.num_predict!r} must be an integer in [1, seq_len={self.seq_len}] (the "
                            "prediction rows per sequence cannot outnumber its tokens), or unset for "
                            "ceil(seq_len / partial_k)")
        if self.reuse_len is not None and (isinstance(self.reuse_len, bool) or not isinstance(self.reuse_len, int)
                                           or not 1 <= self.reuse_len < self.seq_len):
            problems.append(f"reuse_len={self.reuse_len!r} must be an integer in [1, seq_len={self.seq_len}) (the "
                            "tokens of a sequence whose states the next one reuses; XLNet seq_len / 2), or unset for "
                            "no memory")
        elif self.reuse_len is not None and self.objective != "plm":
            problems.append(f"reuse_len applies to objective plm (XLNet with memory), not objective="
                            f"{self.objective!r}; objective txl keeps the whole previous segment (its mem_len)")
        if not isinstance(self.bi_data, bool):
            problems.append(f"bi_data={self.bi_data!r} must be true or false")
        for name in ("perm_size", "bi_data"):
            if getattr(self, name) not in (None, False) and self.reuse_len is None:
                problems.append(f"{name} is part of XLNet's stream with memory: set data.reuse_len too (XLNet: "
                                "seq_len / 2)")
        if self.perm_size is not None and self.reuse_len is not None and isinstance(self.reuse_len, int) and (
                isinstance(self.perm_size, bool) or not isinstance(self.perm_size, int) or self.perm_size < 1
                or self.reuse_len % self.perm_size or (self.seq_len - self.reuse_len) % self.perm_size):
            problems.append(f"perm_size={self.perm_size!r} must be an integer >= 1 dividing both reuse_len="
                            f"{self.reuse_len} and seq_len - reuse_len={self.seq_len - self.reuse_len} (each part is "
                            "permuted in chunks of perm_size; XLNet: perm_size = reuse_len = seq_len / 2)")
        return problems

    def _denoise_problems(self) -> list[str]:
        """The corruption options (objective denoise); checked for every objective (their defaults are valid)."""
        problems = [f"{name}={getattr(self, name)} must be in [0, 1] (0 = off)" for name in
                    ("infill_rate", "permute_sentences", "rotate_prob", "token_mask_rate", "substitute_rate",
                     "delete_rate") if not 0.0 <= getattr(self, name) <= 1.0]  # also refuses NaN
        if not 0.0 < self.poisson_lambda <= 64.0:
            problems.append(f"poisson_lambda={self.poisson_lambda} must be in (0, 64]: the mean length of an infilled "
                            "span (BART 3)")
        return problems


SCHEMES = ("auto", *TAG_SCHEMES)  # auto: detected from the training tags


@dataclass
class TaskConfig:
    """A fine-tuning task: what the head predicts and how examples become model inputs.

    ``freeze``: ``none``, ``all`` (the whole backbone: feature extraction), ``embeddings``, or
    ``all-but-last:K`` (only the last K layers, the final norm and the pooler train). ``head_lr`` gives the head
    its own peak learning rate (default: the run's lr); ``layer_decay`` < 1 scales layer l of L by
    ``layer_decay ** (L + 1 - l)`` (embeddings l = 0; the head and pooler keep 1; ULMFiT's discriminative fine-tuning
    is ``layer_decay = 1/2.6``). ``gradual_unfreezing`` (ULMFiT): the first epoch trains only the last layer group
    (the head), each further epoch one more group, last first (``lmforge.training.unfreeze``). ``init_embeddings``: a
    word2vec-format vectors file whose rows replace the token embeddings of the tokens they name (static
    embeddings as the initialisation of a model trained from scratch; ``freeze = "embeddings"`` keeps them).
    """

    task: str = "sequence"
    max_length: int = 128
    text_column: str = "text"
    text_pair_column: str = "text_pair"
    label_column: str = "label"
    long_text: str = "truncate"
    head_tokens: int | None = None
    max_chunks: int = 8
    crf: bool = False
    scheme: str = "auto"
    subwords: str = "first"
    word_pooling: str = "first"
    pooling: str = "cls"  # sequence / pair: classify the pooled [CLS] output or the mean of the final states
    max_span_width: int = 8
    span_pooling: str = "mean"
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_threshold: float = 0.0
    version_2: bool | None = None
    freeze: str = "none"
    reinit_layers: int = 0  # re-draw the top K layers and the pooler before fine-tuning (Zhang et al. 2021)
    head_lr: float | None = None
    layer_decay: float = 1.0
    gradual_unfreezing: bool = False  # ULMFiT: epoch 1 trains the head only, each epoch unfreezes one more layer
    epochs: float = 3.0
    dropout: float | None = None
    metric: str | None = None
    init_embeddings: str = ""
    span_features: str = "width"  # span task: "lecture" = [s_i; e_j; g_ij], "width" adds a width embedding
    span_decoding: str = "flat"  # span task: "flat" (non-overlapping) or "nested" (nesting spans, never crossing)
    # GPT-1 fine-tuning (Radford et al. 2018): input transformations, the auxiliary LM loss, similarity in both orders
    input_format: str = "auto"  # "bert": [CLS] a [SEP] b [SEP]; "gpt": [START] a [DELIM] b [EXTRACT]; auto: by family
    lm_weight: float | None = None  # L = L_task + lm_weight * L_LM on a GPT backbone (None: 0.5 there, else off)
    symmetric: bool = False  # pair task: encode (a, b) and (b, a), add the two representations (similarity)
    allow_causal: bool = False  # token / span tasks on a left-context-only backbone (refused by default)
    choices_column: str = "choices"  # choice task: the column (JSON list) holding the options

    def __post_init__(self) -> None:
        problems = []
        for name, choices in (("task", TASKS), ("long_text", LONG_TEXT), ("word_pooling", WORD_POOLINGS),
                              ("pooling", SEQUENCE_POOLINGS),
                              ("span_pooling", SPAN_POOLINGS), ("scheme", SCHEMES), ("subwords", ("first", "all")),
                              ("span_features", ("lecture", "width")), ("span_decoding", ("flat", "nested")),
                              ("input_format", INPUT_FORMATS)):
            if getattr(self, name) not in choices:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        if self.max_length < 8:
            problems.append(f"max_length={self.max_length} must be >= 8")
        if self.task == "pair" and self.long_text != "truncate":
            problems.append(f"long_text={self.long_text!r} applies to single texts (--task sequence); a pair is "
                            "cut longest-first to max_length, so leave long_text at 'truncate'")
        for name in ("max_chunks", "max_span_width", "doc_stride", "max_query_length", "max_answer_length",
                     "n_best"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.head_tokens is not None and not 0 <= self.head_tokens <= self.max_length - 2:
            problems.append(f"head_tokens={self.head_tokens} must be in [0, max_length - 2]")
        if not 0.0 < self.layer_decay <= 1.0:
            problems.append(f"layer_decay={self.layer_decay} must be in (0, 1]")
        if self.head_lr is not None and not (self.head_lr > 0 and math.isfinite(self.head_lr)):
            problems.append(f"head_lr={self.head_lr} must be positive")
        if not self.epochs > 0 or not math.isfinite(self.epochs):  # NaN fails every comparison
            problems.append(f"epochs={self.epochs} must be a positive number")
        if self.lm_weight is not None and not (self.lm_weight >= 0 and math.isfinite(self.lm_weight)):
            problems.append(f"lm_weight={self.lm_weight} must be a finite number >= 0 (0 turns the auxiliary LM loss "
                            "off)")
        if self.pooling != "cls" and self.task not in ("sequence", "pair"):
            problems.append(f"pooling={self.pooling!r} chooses what a sequence or pair classifier reads; task "
                            f"{self.task!r} has its own pooling (word_pooling, span_pooling)")
        if self.symmetric and self.task != "pair":
            problems.append("symmetric=true encodes a PAIR in both orders (similarity tasks); it needs task='pair'")
        if self.gradual_unfreezing and self.freeze != "none":
            problems.append(f"gradual_unfreezing unfreezes layer groups epoch by epoch; it cannot be combined with "
                            f"freeze={self.freeze!r} (leave freeze at 'none')")
        if isinstance(self.reinit_layers, bool) or not isinstance(self.reinit_layers, int) or self.reinit_layers < 0:
            problems.append(f"reinit_layers={self.reinit_layers!r} must be an integer >= 0 (the top layers to "
                            "re-initialise; 0: none)")
        if not _valid_freeze(self.freeze):
            problems.append(f"freeze={self.freeze!r} is not one of none, all, embeddings, all-but-last:K (K >= 0)")
        if problems:
            raise LmforgeError("invalid task config: " + "; ".join(problems))


def _valid_freeze(mode: str) -> bool:
    if mode in ("none", "all", "embeddings"):
        return True
    prefix = "all-but-last:"
    return mode.startswith(prefix) and mode[len(prefix):].isdigit()
