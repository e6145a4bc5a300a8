"""``lmforge compare``: the lectures' comparison of ways to build a text classifier, on one fixed split.

(a) train from scratch (a small Transformer encoder, the RNN with attention pooling; random embeddings);
(b) the same RNN with embeddings initialised from Word2Vec or GloVe trained on the unlabelled training texts,
    frozen or fine-tuned;
(c) a frozen pretrained encoder with a linear head (feature extraction);
(d) pretrain + fine-tune (our own pretrained encoder, a public checkpoint).

Every approach is trained on class-balanced subsets of the training split (``sizes`` examples per class, 0 = all)
with several ``seeds`` (the seed draws the subset and initialises the model) and scored on the whole test split
(or a class-balanced ``max_test`` of it).
The results are ``compare.csv`` (one row per run), ``compare.md`` (mean and standard deviation of accuracy and
macro-F1 per approach and size, and the wall time of each approach) and ``learning_curve.png``.

An approach is a table in the config (``[[approach]]``); ``model`` is a preset name, a model folder, one of
``@minilm`` (the embedded MiniLM checkpoint) and ``@pretrained`` (the config's ``pretrained`` folder), or
``@NAME`` for a ``[[pretrain]]`` table of the config: a model that lmforge pretrains once per comparison on the
training texts, with the comparison's tokenizer (any ``lmforge pretrain`` objective: ``preset``, ``objective`` and
``model`` / ``data`` / ``train`` overrides), timed and named in the table. ``task`` and ``train`` tables in an
approach override its ``TaskConfig`` / ``TrainConfig`` (e.g. ULMFiT's ``gradual_unfreezing`` and schedule);
``vectors = "word2vec" | "glove"`` initialises the token embeddings from static vectors trained here on the
training texts split into the tokenizer's word pieces (so every token has a vector).

Nothing is lost when a comparison stops: every finished run is appended to ``runs.jsonl`` at once, and
``resume=True`` (``lmforge compare --resume``) continues in the same folder, reusing the tokenizer, the static
vectors and every finished run whose approach settings are unchanged; sizes, seeds and approaches may be added.
A folder that already holds a comparison is otherwise refused, or moved aside with ``overwrite=True``.

The modules, in the order a comparison uses them: ``config`` (the typed config), ``folder`` (the output folder
and resuming), ``data`` (the split and the subsets), ``pretraining`` (static vectors and ``[[pretrain]]`` models,
trained once), ``approaches`` (one run of an approach), ``run`` (``run_compare``, the whole comparison) and
``report`` (the table, the CSV and the learning curve).
"""

from lmforge.recipes.compare.approaches import check_sources, model_source, run_one
from lmforge.recipes.compare.config import (
    FAMILIES,
    RESERVED,
    Approach,
    CompareConfig,
    PretrainSpec,
    compare_config,
)
from lmforge.recipes.compare.data import Split, load_labelled, split_data, subset
from lmforge.recipes.compare.folder import (
    CONFIG_NAME,
    RUNS_NAME,
    SETUP_KEYS,
    append_record,
    member_dirs,
    prepare_out,
    run_key,
)
from lmforge.recipes.compare.pretraining import pretrain_here, train_static_vectors
from lmforge.recipes.compare.report import learning_curve_figure, markdown_table, plot_learning_curve, write_results
from lmforge.recipes.compare.run import failing_step, run_compare

__all__ = [
    "CONFIG_NAME", "FAMILIES", "RESERVED", "RUNS_NAME", "SETUP_KEYS", "Approach", "CompareConfig", "PretrainSpec",
    "Split", "append_record", "check_sources", "compare_config", "failing_step", "learning_curve_figure",
    "load_labelled", "markdown_table", "member_dirs", "model_source", "plot_learning_curve", "prepare_out",
    "pretrain_here", "run_compare", "run_key", "run_one", "split_data", "subset", "train_static_vectors",
    "write_results",
]
