"""Deprecated: ``lmforge.compare`` moved to ``lmforge.recipes.compare`` (a package: config, folder, data,
pretraining, approaches, run, report). This module re-exports its names for one release and warns on import.

The command line (``lmforge compare``) and the comparison's output folders are unchanged.
"""

from __future__ import annotations

import warnings

from lmforge.recipes.compare import (
    CONFIG_NAME,
    FAMILIES,
    RESERVED,
    RUNS_NAME,
    SETUP_KEYS,
    Approach,
    CompareConfig,
    PretrainSpec,
    check_sources,
    compare_config,
    failing_step,
    learning_curve_figure,
    load_labelled,
    markdown_table,
    member_dirs,
    plot_learning_curve,
    prepare_out,
    pretrain_here,
    run_compare,
    run_one,
    subset,
    train_static_vectors,
)

__all__ = [
    "CONFIG_NAME", "FAMILIES", "RESERVED", "RUNS_NAME", "SETUP_KEYS", "Approach", "CompareConfig", "PretrainSpec",
    "check_sources", "compare_config", "failing_step", "learning_curve_figure", "load_labelled", "markdown_table",
    "member_dirs", "plot_learning_curve", "prepare_out", "pretrain_here", "run_compare", "run_one", "subset",
    "train_static_vectors",
]

# stacklevel 2: the warning names the module that imported this one (the import machinery's frames are skipped)
warnings.warn("lmforge.compare is deprecated and will be removed in the next release: import from "
              "lmforge.recipes.compare instead", DeprecationWarning, stacklevel=2)
