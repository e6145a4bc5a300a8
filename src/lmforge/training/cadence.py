"""When the Trainer writes a checkpoint, and how it stops on SIGTERM / SIGINT.

**Save cadence** (``SaveCadence``): a checkpoint every ``save_every`` steps and every ``save_minutes`` minutes,
whichever comes first. Left unset (None), the cadence is the default one: ``DEFAULT_SAVE_EVERY`` steps or
``DEFAULT_SAVE_MINUTES`` minutes, and a default-cadence checkpoint is skipped while less than ``SAVE_COST_FACTOR``
times the duration of the last write has passed since it, so that writing never takes more than about 1/20 of the
training time (a large model on a fast GPU). An explicit ``save_every`` is exact on every process; the default steps
and the time cadence are rank 0's decision, which travels with the all-reduce that every step already makes
(``vote`` before it, ``agree`` after it), so that all processes save after the same step.

**Signal stop** (``SignalStop``): while the loop runs, SIGTERM and SIGINT ask it to finish the step under way, write
a checkpoint and raise ``TrainingInterrupted`` (a ``KeyboardInterrupt``; the CLI exits with 128 + the signal
number: 143 for SIGTERM, 130 for Ctrl-C); a second signal stops at once. Any process's signal travels with the same
all-reduce as the save decision, so every process stops after the same step.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmforge.config import DEFAULT_SAVE_EVERY, DEFAULT_SAVE_MINUTES

log = logging.getLogger("lmforge")

# a default-cadence checkpoint waits until this many times the last write's duration has passed since it
SAVE_COST_FACTOR = 20.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(KeyboardInterrupt):
    """``fit`` stopped on SIGTERM or SIGINT, after writing a checkpoint.

    Attributes:
        signum: the signal received.
        checkpoint: the checkpoint written before stopping; None when a second signal stopped the run at once.
        exit_code: the shell's convention, 128 + the signal number.
    """

    def __init__(self, signum: int, checkpoint: Path | None, out_dir: Path) -> None:
        self.signum, self.checkpoint, self.exit_code = signum, checkpoint, 128 + signum
        name = signal.Signals(signum).name
        saved = f"saved {checkpoint}" if checkpoint else "stopped at once (second signal), nothing saved after the " \
            "last checkpoint"
        super().__init__(f"training interrupted by {name}: {saved}; continue with --resume auto (--out {out_dir})")


class SaveCadence:
    """Decides after which steps a checkpoint is written (see the module docstring).

    Args:
        save_every: ``TrainConfig.save_every``: every this many steps (0: never by steps; None: the default cadence).
        save_minutes: ``TrainConfig.save_minutes``: every this many minutes (0: never by time; None: the default).
        is_main: whether this is rank 0, the only process whose clock decides.
    """

    def __init__(self, save_every: int | None, save_minutes: float | None, is_main: bool) -> None:
        self.every = save_every or 0  # explicit steps: exact on every rank, no vote needed
        # read at construction (not import) time, so that tests can scale the default down to a toy run
        self.default_steps = DEFAULT_SAVE_EVERY if save_every is None else 0
        self.seconds = 60.0 * (DEFAULT_SAVE_MINUTES if save_minutes is None else save_minutes)
        self.is_main = is_main
        self.last_t, self.last_cost = time.perf_counter(), 0.0
        self.agreed = False  # every process's answer to the last vote

    def restart_clock(self) -> None:
        """Count the time cadence from now (``fit`` starting: the constructor's time is not training time)."""
        self.last_t = time.perf_counter()

    def vote(self, step: int) -> float:
        """Rank 0's wish (1.0) for a checkpoint by the default steps or by time after ``step``; 0.0 elsewhere.

        Returns a float so that it can be summed with the step's other numbers in one all-reduce.
        """
        if not self.is_main:
            return 0.0
        since = time.perf_counter() - self.last_t
        by_steps = bool(self.default_steps) and step % self.default_steps == 0
        by_time = self.seconds > 0 and since >= self.seconds
        return float((by_steps or by_time) and since >= SAVE_COST_FACTOR * self.last_cost)

    def agree(self, total: float) -> None:
        """Take the all-reduced vote: every process saves after this step when any asked (rank 0 only votes)."""
        self.agreed = total > 0

    def due(self, step: int) -> bool:
        """Whether to write a checkpoint now that ``step`` is done: the explicit cadence or the agreed vote."""
        return bool(self.every and step % self.every == 0) or self.agreed

    def saved(self, started: float) -> None:
        """Note a write that began at ``started`` (``time.perf_counter()``) and has just finished."""
        self.last_t = time.perf_counter()
        self.last_cost = self.last_t - started


class SignalStop:
    """SIGTERM / SIGINT: stop after the current step with a checkpoint (see the module docstring).

    Args:
        out_dir: the run folder, named in the message of ``TrainingInterrupted``.
        announce: log the first signal (rank 0 only, so the message shows once).
    """

    def __init__(self, out_dir: Path, announce: bool) -> None:
        self.out_dir, self.announce = out_dir, announce
        self.signum: int | None = None  # the first SIGTERM / SIGINT received
        self.agreed = False  # every process's answer to the last vote

    def vote(self) -> float:
        """1.0 when this process received a signal, for the step's all-reduce."""
        return float(self.signum is not None)

    def agree(self, total: float, distributed: bool) -> None:
        """Take the all-reduced vote; a single process also heeds a signal that came after its vote."""
        self.agreed = total > 0 or (not distributed and self.signum is not None)

    def interrupted(self, checkpoint: Path | None) -> TrainingInterrupted:
        """The exception that ends ``fit`` after ``checkpoint`` was written."""
        return TrainingInterrupted(self.signum or signal.SIGTERM, checkpoint, self.out_dir)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle SIGTERM and SIGINT inside the block; the previous handlers are put back afterwards.

        Handlers can only be installed from the main thread; elsewhere signals keep their usual effect.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self.signum is not None:  # asked twice: do not wait for the step and the checkpoint
                raise TrainingInterrupted(signum, None, self.out_dir)
            self.signum = signum
            if self.announce:
                log.warning("received %s: finishing this step and saving a checkpoint, then stopping (send it "
                            "again to stop at once)", signal.Signals(signum).name)

        previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
