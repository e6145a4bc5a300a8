"""What a run records besides its model: the allocator hint, TensorBoard tags, and ``loss_curve.png`` (the figure of
``lmforge viz training``, with the dev metrics of the run)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from lmforge.training import RunOutput, Trainer
from lmforge.training import logging as run_logging
from lmforge.training.logging import MetricsLog, allocator_hint, find_allocator, plot_loss_curve
from lmforge.viz import plots
from tests.training.helpers import LMObjective, ToyData, decoder_config, tiny_decoder, train_config


# ---------------------------------------------------------------------------------------------- allocator hint
@pytest.fixture
def linux_without_preload(monkeypatch):
    monkeypatch.setattr(run_logging.sys, "platform", "linux")
    monkeypatch.delenv("LD_PRELOAD", raising=False)


def _library(folder, name: str):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\x7fELF")
    return path


def test_without_an_allocator_installed_the_hint_is_glibcs_own_settings(tmp_path, monkeypatch, linux_without_preload):
    """issue 23: every training command suggested LD_PRELOAD=...libtcmalloc.so.4 where that file does not exist."""
    monkeypatch.setattr(run_logging, "ALLOCATOR_DIRS", (str(tmp_path / "lib"), str(tmp_path / "usr" / "*")))
    _library(tmp_path / "lib", "libc.so.6")
    (tmp_path / "usr" / "x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib" / "libtcmalloc.so.4").mkdir()  # a folder of that name is no library
    assert find_allocator() is None
    monkeypatch.setattr(run_logging.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(run_logging, "_glibc_tuned", False)  # an earlier Trainer in this process tuned it
    hint = allocator_hint()  # glibc's own reuse settings instead, naming no file
    assert "LD_PRELOAD" not in hint and run_logging.GLIBC_REUSE in hint
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert allocator_hint() is None  # tuned already
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_max=0")
    assert allocator_hint() is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setattr(run_logging.platform, "libc_ver", lambda: ("", ""))  # musl: no such settings
    assert allocator_hint() is None


def test_the_allocator_hint_names_the_file_found(tmp_path, monkeypatch, linux_without_preload):
    monkeypatch.setattr(run_logging, "ALLOCATOR_DIRS", (str(tmp_path / "a"), str(tmp_path / "usr" / "*")))
    jemalloc = _library(tmp_path / "a", "libjemalloc.so.2")
    assert allocator_hint().endswith(f"LD_PRELOAD={jemalloc}") and "jemalloc" in allocator_hint()
    _library(tmp_path / "usr" / "x86_64-linux-gnu", "libtcmalloc.so")  # the development link...
    runtime = _library(tmp_path / "usr" / "x86_64-linux-gnu", "libtcmalloc.so.4")  # ...and the runtime library
    assert find_allocator() == str(runtime)  # tcmalloc (the allocator measured) first, its runtime name first
    assert allocator_hint().endswith(f"LD_PRELOAD={runtime}")
    monkeypatch.setenv("LD_PRELOAD", str(runtime))
    assert allocator_hint() is None  # already preloaded
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(run_logging.sys, "platform", "darwin")
    assert allocator_hint() is None


_FAULTS = """
import resource, sys, torch
from lmforge.training.logging import tune_glibc_malloc
message = tune_glibc_malloc() if sys.argv[1] == "tune" else None
torch.empty(1).fill_(0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    x = torch.empty(8 * 2**20)  # 32 MiB: above glibc's default mmap threshold
    x.fill_(1.0)
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, message is not None)
"""


def test_tuning_glibc_in_process_stops_the_page_faults_of_every_step(monkeypatch, linux_without_preload):
    """Issue 39: the training commands make glibc reuse freed memory in their own process (mallopt), which the
    environment variables did only when a user set them before starting: a large tensor freed and allocated again
    then faults its pages in once instead of on every step."""
    import subprocess

    if run_logging.platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's mallopt: this machine's C library is not glibc")
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_MAX_", "GLIBC_TUNABLES", "LD_PRELOAD")}
    env["OMP_NUM_THREADS"] = "1"
    faults = {}
    for mode in ("plain", "tune"):
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True, text=True,
                             check=True, timeout=120).stdout.split()
        faults[mode] = int(out[0])
        assert out[1] == str(mode == "tune")
    assert faults["tune"] * 10 < faults["plain"], faults  # 20 x 8,192 pages without; about one tensor's with
    monkeypatch.setattr(run_logging, "_glibc_tuned", False)
    monkeypatch.setenv(run_logging.GLIBC_TUNING_ENV, "0")
    assert run_logging.tune_glibc_malloc() is None  # the user kept glibc's defaults
    monkeypatch.delenv(run_logging.GLIBC_TUNING_ENV)
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert run_logging.tune_glibc_malloc() is None  # tuned by the environment already
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc.so.4")
    assert run_logging.tune_glibc_malloc() is None  # another allocator


# ---------------------------------------------------------------------------------------------- TensorBoard
class _Writer:
    """Records add_scalar calls in place of torch.utils.tensorboard.SummaryWriter."""

    def __init__(self, **kwargs) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_tensorboard_puts_a_task_evaluators_metrics_with_the_evaluation(tmp_path, monkeypatch):
    monkeypatch.setattr(run_logging, "require_tensorboard", lambda: _Writer)
    log = MetricsLog(tmp_path, tensorboard=True)
    writer = log._tb
    log.write({"step": 2, "epoch": 0, "loss": 1.5, "lr": 1e-3})
    log.write({"step": 2, "eval_loss": 1.7, "accuracy": 0.5})
    log.close()
    assert writer.scalars == [("train/epoch", 0, 2), ("train/loss", 1.5, 2), ("train/lr", 1e-3, 2),
                              ("eval_loss", 1.7, 2), ("eval_accuracy", 0.5, 2)]


# ---------------------------------------------------------------------------------------------- loss_curve.png
@pytest.fixture
def drawn(monkeypatch):
    """The figures that ``plots.save_png`` writes, kept for the test (and still written)."""
    figures = []
    save = plots.save_png

    def keep(fig, path):
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "save_png", keep)
    return figures


def test_loss_curve_is_the_viz_training_figure_with_the_dev_metric(tmp_path, drawn):
    """issue 23: loss_curve.png never showed the dev metric of a fine-tuning run (it logs accuracy, not eval_*)."""
    records = [{"step": 10, "epoch": 0, "loss": 0.9, "loss_cls": 0.9, "lr": 5e-5},
               {"step": 12, "accuracy": 0.75, "f1": 0.7}]
    assert plot_loss_curve(records, tmp_path / "run" / "loss_curve.png") is True
    (fig,) = drawn
    titles = [ax.get_title() for ax in fig.axes]
    assert "dev accuracy" in titles and "dev f1" in titles
    (accuracy,) = [ax for ax in fig.axes if ax.get_title() == "dev accuracy"]
    assert list(accuracy.get_lines()[0].get_ydata()) == [0.75]
    assert fig.get_suptitle() == "run"  # the run folder's name
    assert (tmp_path / "run" / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_loss_curve([{"step": 1, "loss": float("nan"), "lr": 1e-3}], tmp_path / "empty.png") is False
    assert not (tmp_path / "empty.png").exists()  # nothing to draw yet: no empty axes


class _Accuracy:
    """A task evaluator: plain-named dev metrics, as lmforge finetune's."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        self.calls += 1
        return {"accuracy": 0.25 * self.calls, "f1": 0.2 * self.calls}


def test_a_short_training_run_draws_its_dev_metric_and_its_single_loss_point(tmp_path, drawn):
    """A 3-step fine-tuning-like run at the default log_every=10: one training point, dev metrics each epoch."""
    config = train_config(max_steps=3, log_every=10, eval_every=1)
    Trainer(tiny_decoder(), LMObjective(), ToyData(n=8), config,
            RunOutput(tmp_path, model_config=decoder_config(), progress=False), evaluator=_Accuracy(),
            select="accuracy").fit()
    fig = drawn[-1]  # the last drawing, at the end of the run
    (accuracy,) = [ax for ax in fig.axes if ax.get_title() == "dev accuracy"]
    assert [tuple(p) for p in accuracy.get_lines()[0].get_xydata()] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    (train_loss,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "train loss"]
    assert list(train_loss.get_xdata()) == [3] and train_loss.get_marker() == "o"  # one point, visible
    assert os.path.getsize(tmp_path / "loss_curve.png") > 0
