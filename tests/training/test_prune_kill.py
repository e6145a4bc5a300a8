"""kill -9 while checkpoints are written and pruned never leaves an incomplete ``step-N`` folder (a reproduction:
deleting the folder in place left half-deleted ``step-N`` folders in 2 of 14 kills)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from lmforge.training import checkpoint as ckpt

FILES = 1000  # many files per checkpoint, so that a kill often lands inside a deletion

WRITER = f"""
import os, sys
from pathlib import Path
from lmforge.training import checkpoint as ckpt

out, step = Path(sys.argv[1]), int(sys.argv[2])
template = out / "template"  # checkpoints are hard links of these files: cheap to make, so most time is pruning
template.mkdir(exist_ok=True)
for i in range({FILES}):
    (template / f"part-{{i}}.bin").write_bytes(b"x" * 512)
print("ready", flush=True)
while True:  # the shape of save_checkpoint: assemble under .tmp-*, rename to step-N, prune
    step += 1
    tmp = out / ckpt.CHECKPOINTS_DIR / f".tmp-step-{{step}}-{{os.getpid()}}"
    tmp.mkdir(parents=True)
    for i in range({FILES}):
        os.link(template / f"part-{{i}}.bin", tmp / f"part-{{i}}.bin")
    (tmp / ckpt.WEIGHTS_NAME).write_bytes(b"w")
    (tmp / ckpt.STATE_NAME).write_bytes(b"s")
    os.replace(tmp, ckpt.checkpoint_path(out, step))
    ckpt.prune_checkpoints(out, keep_last=2)
"""


def complete(folder: Path) -> bool:
    names = {p.name for p in folder.iterdir()}
    return {ckpt.WEIGHTS_NAME, ckpt.STATE_NAME} <= names and sum(n.startswith("part-") for n in names) == FILES


def test_kill_during_pruning_never_leaves_an_incomplete_step_folder(tmp_path):
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ckpt.__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    step = 0
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(step)], stdout=subprocess.PIPE,
                                env=env)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.1, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        folders = sorted((tmp_path / ckpt.CHECKPOINTS_DIR).glob("step-*"), key=ckpt.step_of)
        assert folders, "the writer never finished a checkpoint"
        incomplete = [f.name for f in folders if not complete(f)]
        assert incomplete == [], f"incomplete checkpoint folders after kill -9: {incomplete}"
        assert ckpt.latest_checkpoint(tmp_path) == folders[-1]
        # what the next run does at start: leftovers of the killed process go, complete checkpoints stay
        ckpt.remove_partial_checkpoints(tmp_path)
        assert not list((tmp_path / ckpt.CHECKPOINTS_DIR).glob(".tmp-*"))
        assert sorted((tmp_path / ckpt.CHECKPOINTS_DIR).glob("step-*"), key=ckpt.step_of) == folders
        step = ckpt.step_of(folders[-1])
