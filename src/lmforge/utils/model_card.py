"""The run report: a short ``README.md`` model card in every run folder, written when the run ends.

A run folder of ``pretrain``, ``finetune``, ``train-seq2seq`` or ``distill`` already holds everything a reader needs
(``config.json``, ``run_config.json``, ``eval_results.json``, ``metrics.jsonl``, the plots), but as files only a
program reads. The card says it in one page, in the shape the Hugging Face hub shows: YAML front matter
(``library_name: lmforge``, ``tags``, ``metrics``) and Markdown sections: what was trained (family, preset, sizes,
parameter count, head), on what data (the paths as the user gave them, with their line counts), the command lines
that made the run (a resumed run adds its own), the final and best metrics, the plots in the folder, the lmforge
version.

The card is built only from the files of the folder (and the command line the CLI recorded with
``recording_command``), so it is the same whatever wrote the run, and it is refreshed when a resumed run ends. It is
written atomically. A ``README.md`` that lmforge did not write (no ``MARKER``) is never replaced: the card is skipped
with a warning.

Torch-free: it reads the safetensors header for the parameter count, not the weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shlex
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lmforge.utils.io import atomic_write_text

log = logging.getLogger("lmforge")

CARD_NAME = "README.md"
MARKER = "<!-- lmforge model card"  # the comment that marks a card lmforge wrote (and holds its command history)
_COMMAND: ContextVar[tuple[str, ...] | None] = ContextVar("lmforge_command", default=None)
_INPUT_KEYS = ("model", "tokenizer", "init_from", "teacher", "train_file", "dev_file", "test_file", "data", "train",
               "dev", "test", "input", "corpus", "shards", "path", "train_data", "dev_data", "test_data")
_SIZE_KEYS = ("vocab_size", "d_model", "n_layers", "n_decoder_layers", "n_heads", "d_ff", "max_seq_len",
              "embedding_size")
_COUNTED_SUFFIXES = (".csv", ".tsv", ".jsonl", ".txt", ".conll", ".json", ".iob", ".bio")
_MAX_COUNTED_BYTES = 200 * 2**20


@contextlib.contextmanager
def recording_command(argv: Sequence[str]) -> Iterator[None]:
    """Remember ``lmforge ARGV...`` as the command line of the runs started inside (the CLI wraps each command)."""
    token = _COMMAND.set(("lmforge", *argv))
    try:
        yield
    finally:
        _COMMAND.reset(token)


def current_command() -> list[str] | None:
    """The command line recorded by ``recording_command`` (None when the run was started from Python)."""
    command = _COMMAND.get()
    return list(command) if command is not None else None


def _size_keys(arch: Any) -> tuple[str, ...]:
    """The size fields that describe a model of family ``arch``: a recurrent model has no heads, no feed-forward
    width and no position limit, but the width of its LSTM layers."""
    from lmforge.config.model import family_class

    try:
        cls = family_class(arch)
    except Exception:  # an unknown family (a newer lmforge's folder): every size that is there
        return _SIZE_KEYS
    if getattr(cls, "transformer", True):
        return _SIZE_KEYS
    return ("vocab_size", "d_model", "d_hidden", "d_cell", "n_layers")


def write_model_card(run_dir: str | Path, *, command: Sequence[str] | None = None) -> Path | None:
    """Write (or refresh) ``README.md`` in ``run_dir`` from the folder's files; return its path, or None when a
    README.md that lmforge did not write is in the way (it is left alone, with a warning).

    Args:
        command: the command line of this run; default: the one the CLI recorded (``current_command``).
    """
    run_dir = Path(run_dir)
    path = run_dir / CARD_NAME
    history: list[list[str]] = []
    if path.exists():
        old = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        if MARKER not in old:
            log.warning("%s exists and was not written by lmforge; the run's model card is not written", path)
            return None
        history = _read_history(old)
    command = list(command) if command is not None else current_command()
    if command is not None and (not history or history[-1] != command):
        history.append(command)
    atomic_write_text(path, render_model_card(run_dir, history))
    return path


def render_model_card(run_dir: Path, history: list[list[str]]) -> str:
    """The card's text (see the module docstring)."""
    from lmforge import __version__

    model_file, run_file = _read_json(run_dir / "config.json"), _read_json(run_dir / "run_config.json")
    results = _read_json(run_dir / "eval_results.json") or {}
    model = model_file.get("model") if isinstance(model_file, dict) else None
    model = model if isinstance(model, dict) else {}
    head = model_file.get("head") if isinstance(model_file, dict) else None
    run = run_file if isinstance(run_file, dict) else {}
    task = (head or {}).get("task") or run.get("task") or {}
    task_name = task.get("task") if isinstance(task, dict) else None
    objective = (run.get("train") or {}).get("objective") if isinstance(run.get("train"), dict) else None
    metrics = {k: v for k, v in results.items() if _is_number(v) and k not in ("step", "best_step", "last_step")}
    tags = [t for t in ("lmforge", model.get("arch"), task_name, objective, (head or {}).get("type")) if t]
    front = ["---", "library_name: lmforge", "tags:", *[f"- {_yaml(t)}" for t in dict.fromkeys(tags)]]
    if metrics:
        front += ["metrics:", *[f"- {_yaml(k)}" for k in metrics]]
    front.append("---")

    title = run_dir.resolve().name
    what = _what(model, head, run, run_dir, task_name, objective)
    lines = [*front, "", f"# {title}", "", *what, "", "## Data", ""]
    lines += _data(run)
    lines += ["", "## How it was made", ""]
    if history:
        lines += ["```bash", *[shlex.join(c) for c in history], "```"]
        if len(history) > 1:
            lines.append("(a resumed run adds its command line below the first)")
    else:
        lines.append("Trained from Python (no command line recorded); the settings are in `run_config.json`.")
    lines += ["", f"Written by lmforge {__version__} on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.", ""]
    lines += ["## Results", ""] + _results(results, metrics, run_dir)
    plots = sorted(p.name for p in run_dir.glob("*.png"))
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    lines += ["", "## Files", "", *_files(run_dir), "",
              f"{MARKER}: commands = {json.dumps(history)} -->", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ sections
def _what(model: dict[str, Any], head: dict[str, Any] | None, run: dict[str, Any], run_dir: Path,
          task_name: str | None, objective: str | None) -> list[str]:
    out = []
    kind = f"fine-tuned for `{task_name}`" if task_name else (f"pretrained with `{objective}`" if objective else
                                                                   "trained")
    arch = model.get("arch", "unknown")
    preset = run.get("preset") if isinstance(run.get("preset"), str) else None
    out.append(f"Model family `{arch}`{f' (preset `{preset}`)' if preset else ''}, {kind}.")
    sizes = ", ".join(f"{k}={model[k]}" for k in _size_keys(arch) if model.get(k) is not None)
    if sizes:
        out.append(f"Actual sizes: {sizes}.")
    n = _parameter_count(run_dir / "model.safetensors")
    if n is not None:
        out.append(f"Parameters: {n:,} (the values stored in `model.safetensors`, tied weights once).")
    if head:
        labels = head.get("labels")
        shown = f" Labels: {', '.join(map(str, labels[:20]))}{' ...' if len(labels) > 20 else ''}." \
            if isinstance(labels, list) and labels else ""
        out.append(f"Head: `{head.get('type')}`.{shown}")
    out.append("")
    out.append("Load it with `lmforge.from_pretrained(\"<this folder>\")` (or `lmforge.pipeline`, "
               "`lmforge serve`).")
    return out


def _data(run: dict[str, Any]) -> list[str]:
    rows = []
    for key, value in _inputs(run):
        rows.append(f"| `{key}` | `{value}` | {_describe_input(Path(value))} |")
    if not rows:
        return ["The data paths are not recorded in `run_config.json`."]
    return ["| setting | path (as given) | contents |", "|---|---|---|", *rows]


def _inputs(run: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    found = []
    for key, value in run.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found += _inputs(value, f"{name}.")
        elif isinstance(value, str) and value and key in _INPUT_KEYS and key != "out":
            found.append((name, value))
        elif isinstance(value, list) and key in _INPUT_KEYS and all(isinstance(v, str) for v in value):
            found += [(name, v) for v in value if v]
    return found


def _describe_input(path: Path) -> str:
    try:
        if path.is_dir():
            return f"a folder of {sum(1 for _ in path.iterdir()):,} entries"
        if path.is_file():
            size = path.stat().st_size
            if path.suffix.lower() in _COUNTED_SUFFIXES and size <= _MAX_COUNTED_BYTES:
                with path.open("rb") as f:
                    lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(2**20), b""))
                return f"{lines:,} lines, {size:,} bytes"
            return f"{size:,} bytes"
    except OSError:
        pass
    return "a preset or model name" if "/" not in str(path) else "not found now"


def _results(results: dict[str, Any], metrics: dict[str, float], run_dir: Path) -> list[str]:
    out = []
    if metrics:
        best = results.get("best_step")
        where = f"the best dev evaluation (step {best} of {results.get('last_step')})" if best is not None else \
            f"the last evaluation (step {results.get('step')})"
        out += [f"Dev metrics of {where}; the folder holds that model:", "", "| metric | value |", "|---|---|"]
        out += [f"| {k} | {v:.4f} |" for k, v in metrics.items()]
    else:
        out.append("No dev evaluation was recorded.")
    last = _last_train_record(run_dir / "metrics.jsonl")
    if last:
        extra = [f"step {last['step']}"] + [f"{k} {last[k]:.4g}" for k in ("loss", "lr") if _is_number(last.get(k))]
        if _is_number(last.get("tokens")):
            extra.append(f"{int(last['tokens']):,} tokens seen")
        out += ["", f"Last training record: {', '.join(extra)} (`metrics.jsonl`)."]
    for name in ("test_results.json",):
        test = _read_json(run_dir / name)
        if isinstance(test, dict):
            scores = ", ".join(f"{k} {v:.4f}" for k, v in test.items() if _is_number(v))
            out += ["", f"Test set (`{name}`): {scores}."]
    return out


def _files(run_dir: Path) -> list[str]:
    known = {"config.json": "the model's config (loads with `from_pretrained`)",
             "model.safetensors": "the weights", "run_config.json": "every setting of the run",
             "eval_results.json": "the dev metrics above", "metrics.jsonl": "every logged step and evaluation",
             "checkpoints": "checkpoints to resume from (`--resume auto`)"}
    return [f"- `{name}`: {text}" for name, text in known.items() if (run_dir / name).exists()]


# ------------------------------------------------------------------------------------------------ reading
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_history(card: str) -> list[list[str]]:
    start = card.rfind(f"{MARKER}: commands = ")
    if start < 0:
        return []
    text = card[start + len(MARKER) + len(": commands = "):].split(" -->", 1)[0]
    try:
        history = json.loads(text)
    except ValueError:
        return []
    ok = isinstance(history, list) and all(isinstance(c, list) and all(isinstance(a, str) for a in c)
                                           for c in history)
    return history if ok else []


def _last_train_record(path: Path) -> dict[str, Any] | None:
    last = None
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict) and "loss" in record and "step" in record:
                        last = record
    except OSError:
        return None
    return last


def _parameter_count(path: Path) -> int | None:
    """Values in a safetensors file, from its header (8 bytes of length, then JSON); None when unreadable."""
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= 100 * 2**20:
                return None
            header = json.loads(f.read(n).decode("utf-8"))
        return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _yaml(value: Any) -> str:
    """A YAML scalar: plain when safe, else JSON-quoted (JSON strings are valid YAML)."""
    text = str(value)
    return text if text.replace("-", "").replace("_", "").replace(".", "").isalnum() else json.dumps(text)
