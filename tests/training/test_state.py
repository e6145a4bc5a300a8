"""The Trainer's Stateful components: each gives and takes its own state; checkpoints of the earlier flat layout
(version 1) still resume exactly; the constructor checks the run folder but changes it only when fit() starts."""

from __future__ import annotations

import torch

from lmforge.training import RunOutput, Trainer
from lmforge.training import checkpoint as ckpt
from lmforge.training.state import BestTracker, Progress, migrate_state
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, train_config, without_timing
from tests.training.test_resume import _run, _weights


def test_components_round_trip():
    progress = Progress(step=7, epoch=1, tokens=99, elapsed_s=1.5, last_eval={"step": 6, "eval_loss": 2.0})
    progress.window["steps"] = 3
    again = Progress()
    again.load_state_dict(progress.state_dict())
    assert again == progress
    tracker = BestTracker("-eval_loss")
    assert tracker.offer({"eval_loss": 2.0}, 2) and not tracker.offer({"eval_loss": 2.0}, 4)  # a tie keeps step 2
    assert tracker.offer({"eval_loss": 1.0}, 6)
    other = BestTracker("-eval_loss")
    other.load_state_dict(tracker.state_dict())
    assert other.best == tracker.best and other.best["step"] == 6


def test_a_checkpoint_holds_one_state_per_component(tmp_path):
    _run(tmp_path, max_steps=2)
    state = ckpt.load_trainer_state(ckpt.latest_checkpoint(tmp_path))
    assert set(state["components"]) == {"optimizer", "scheduler", "progress", "best"}
    assert state["components"]["progress"]["step"] == 2 and state["version"] == ckpt.STATE_VERSION


def _as_version_1(path):
    """Rewrite a checkpoint's trainer_state.pt in the flat layout lmforge wrote before components."""
    file = path / ckpt.STATE_NAME
    state = torch.load(file, weights_only=True)
    c = state.pop("components")
    flat = {**state, "version": 1, "optimizer": c["optimizer"], "scheduler": c["scheduler"], **c["progress"],
            "best": c["best"]["best"]}
    torch.save(flat, file)
    assert "components" in migrate_state(flat) and migrate_state(migrate_state(flat)) == migrate_state(flat)


def test_a_version_1_checkpoint_resumes_the_same_run(tmp_path):
    full = tmp_path / "full"
    _run(full)
    _as_version_1(full / "checkpoints" / "step-2")
    _run(tmp_path / "resumed", seed=123, resume=full / "checkpoints" / "step-2")
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(tmp_path / "resumed" / "metrics.jsonl")
    assert without_timing(b) == without_timing([r for r in a if r["step"] > 2])
    for name, tensor in _weights(full).items():
        assert torch.equal(tensor, _weights(tmp_path / "resumed")[name]), name


def test_the_constructor_changes_nothing_on_disk(tmp_path):
    out = tmp_path / "run"
    _run(out, max_steps=2)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    trainer = Trainer(tiny_decoder(), LMObjective(), ToyData(n=8), train_config(max_steps=2),
                      RunOutput(out, overwrite=True, progress=False))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing moved yet
    trainer.fit()
    (aside,) = tmp_path.glob("run.old-*")  # the old run was moved aside when fit() started
    assert (aside / "metrics.jsonl").is_file() and (out / "metrics.jsonl").is_file()


class _Unsafe:  # not a type torch.load(weights_only=True) accepts
    pass


def test_an_unreadable_state_names_the_older_checkpoints_and_never_advises_unsafe_loading(tmp_path):
    import pytest

    from lmforge.errors import InputFileError

    checkpoints = tmp_path / ckpt.CHECKPOINTS_DIR
    for step in (10, 20, 30):
        (checkpoints / f"step-{step}").mkdir(parents=True)
        torch.save({"format": ckpt.STATE_FORMAT, "step": step}, checkpoints / f"step-{step}" / ckpt.STATE_NAME)
        (checkpoints / f"step-{step}" / ckpt.WEIGHTS_NAME).write_bytes(b"")  # a complete checkpoint's files
    torch.save({"format": ckpt.STATE_FORMAT, "object": _Unsafe()}, checkpoints / "step-30" / ckpt.STATE_NAME)
    with pytest.raises(InputFileError) as caught:
        ckpt.load_trainer_state(checkpoints / "step-30")
    message = str(caught.value)
    assert "weights_only" not in message and "Weights only" not in message
    assert message.index("step-20") < message.index("step-10") and "--resume PATH" in message
    (checkpoints / "step-20" / ckpt.STATE_NAME).write_bytes(b"not a torch file")  # corrupt, not unsafe
    with pytest.raises(InputFileError, match=r"cannot read the trainer state.*: the file is corrupt") as caught:
        ckpt.load_trainer_state(checkpoints / "step-20")
    assert str(caught.value).endswith("step-10") and "weights_only" not in str(caught.value)  # only older ones
    with pytest.raises(InputFileError, match="Start afresh"):  # a lone checkpoint folder
        alone = tmp_path / "alone"
        alone.mkdir()
        (alone / ckpt.STATE_NAME).write_bytes(b"\x00" * 8)
        ckpt.load_trainer_state(alone)
