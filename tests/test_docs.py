"""The documentation site: the quick start runs as written on a fresh folder (its pretraining budget cut from ten
minutes to 20,000 tokens, the one change), and ``make docs``' build passes MkDocs' strict mode (no broken link,
no warning) offline."""

from __future__ import annotations

import csv
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "docs" / "quickstart.md"


def _commands() -> list[list[str]]:
    text = QUICKSTART.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "the quick start has no bash block"
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]


def test_the_quick_start_has_five_commands_and_runs_as_written(bbc_dir, tmp_path, monkeypatch):
    commands = _commands()
    assert len(commands) == 5 and all(c[0] == "lmforge" for c in commands)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = []
    for topic in ("business", "sports"):
        files = sorted((bbc_dir / topic).glob("*.txt"))
        for path in files[:12]:
            shutil.copy(path, corpus / f"{topic}-{path.name}")
        rows += [(" ".join(p.read_text(encoding="utf-8", errors="replace").split()[:50]), topic) for p in files[12:28]]
    for name, part in (("train.csv", rows[0::2]), ("dev.csv", rows[1::2])):
        with (tmp_path / name).open("w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows([("text", "label"), *part])
    (tmp_path / "new.txt").write_text("Shares fell on Wall Street.\nThe striker scored twice.\n", encoding="utf-8")
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "bert-mini-small-budget.toml", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        argv = ["20ktok" if word == "10m" and argv[i] == "--budget" else word
                for i, word in enumerate(argv[1:])]
        assert main(["-q", *argv]) == 0, argv
    predictions = (tmp_path / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(predictions) == 2 and all('"label"' in line for line in predictions)


def test_the_site_builds_offline_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="the documentation site needs mkdocs-material (the dev extra)")
    pytest.importorskip("mkdocstrings", reason="the API reference needs mkdocstrings[python] (the dev extra)")
    generated = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py")], capture_output=True,
                               text=True, timeout=300)
    assert generated.returncode == 0, generated.stderr
    cli = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "## lmforge finetune" in cli and "--max-length" in cli  # the reference comes from the parser
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                            str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")], capture_output=True, text=True,
                           timeout=900, cwd=ROOT)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "quickstart.html").is_file()  # the offline plugin: plain .html pages
    assert (tmp_path / "site" / "reference" / "api.html").is_file()
