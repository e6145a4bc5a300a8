"""The one output policy (lmforge.utils.io): empty or new folders only, --overwrite moves aside, inputs are never
outputs, staged folders appear whole, write failures are one line."""

from __future__ import annotations

import errno

import pytest

from lmforge.errors import LmforgeError
from lmforge.utils.io import (
    check_not_input,
    describe_os_error,
    prepare_output_dir,
    prepare_output_file,
    remove_stale_partials,
    staged_output_dir,
)


def snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_new_and_empty_folders_are_accepted(tmp_path):
    assert prepare_output_dir(tmp_path / "a" / "b").is_dir()
    (tmp_path / "empty").mkdir()
    assert prepare_output_dir(tmp_path / "empty") == tmp_path / "empty"
    assert not prepare_output_dir(tmp_path / "later", create=False).exists()


def test_a_folder_holding_anything_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("model.safetensors", "config.json", "vocab.txt"):
        (out / name).write_bytes(name.encode() * 3)
    before = snapshot(tmp_path)
    with pytest.raises(LmforgeError, match=r"--out .*out is not empty \(3 entries: config.json, model.safetensors, "
                                           r"vocab.txt\).*--overwrite"):
        prepare_output_dir(out)
    with pytest.raises(LmforgeError, match="--resume auto"):
        prepare_output_dir(out, resumable=True)
    assert snapshot(tmp_path) == before


def test_overwrite_moves_the_old_folder_aside(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "mine.txt").write_text("keep me")
    prepare_output_dir(out, overwrite=True)
    assert out.is_dir() and not any(out.iterdir())
    (aside,) = tmp_path.glob("out.old-*")
    assert (aside / "sub" / "mine.txt").read_text() == "keep me"


def test_a_file_where_a_folder_is_expected_and_the_reverse(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(LmforgeError, match="is a file, but --out names a folder"):
        prepare_output_dir(tmp_path / "f")
    with pytest.raises(LmforgeError, match="a parent of the folder is a file"):
        prepare_output_dir(tmp_path / "f" / "run")
    (tmp_path / "x.json").mkdir()
    with pytest.raises(LmforgeError, match="--output .*x.json: is a folder, but --output names a file"):
        prepare_output_file(tmp_path / "x.json", option="--output")
    with pytest.raises(LmforgeError, match="is a file, not a folder"):
        prepare_output_file(tmp_path / "f" / "deeper" / "out.txt")
    assert (tmp_path / "f").read_text() == "x"


def test_an_existing_file_needs_overwrite(tmp_path):
    path = tmp_path / "preds.jsonl"
    path.write_text("old")
    with pytest.raises(LmforgeError, match="already exists; choose another path or pass --overwrite"):
        prepare_output_file(path)
    assert prepare_output_file(path, overwrite=True) == path and path.read_text() == "old"  # replaced later
    assert prepare_output_file(tmp_path / "new" / "deep" / "a.npy").parent.is_dir()


@pytest.mark.parametrize("relation", ["same", "inside", "holds"])
def test_inputs_are_never_outputs(tmp_path, relation):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = {"same": model, "inside": model / "run", "holds": tmp_path}[relation]
    words = {"same": "is", "inside": "is inside", "holds": "holds"}[relation]
    with pytest.raises(LmforgeError, match=f"--out .* {words} the input .*model; lmforge never writes over its "
                                           "inputs"):
        check_not_input(out, [None, "", model])
    for kwargs in ({}, {"overwrite": True}):
        with pytest.raises(LmforgeError):
            prepare_output_dir(out, inputs=[model], **kwargs)
    assert (model / "config.json").read_text() == "{}" and not list(tmp_path.glob("*.old-*"))
    check_not_input(tmp_path / "elsewhere", [model])  # unrelated paths pass


def test_staged_folder_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "tok"
    with pytest.raises(RuntimeError), staged_output_dir(out) as tmp:
        (tmp / "vocab.txt").write_text("[PAD]\n")
        raise RuntimeError("killed halfway")
    assert not out.exists() and not list(tmp_path.iterdir())
    with staged_output_dir(out) as tmp:
        (tmp / "vocab.txt").write_text("[PAD]\n")
        assert not out.exists()
    assert (out / "vocab.txt").read_text() == "[PAD]\n" and [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_partials_of_dead_processes_are_removed(tmp_path):
    import os

    dead, alive = tmp_path / ".tok.partial-999999999", tmp_path / f".tok.partial-{os.getpid()}"
    for folder in (dead, alive):
        folder.mkdir()
    assert remove_stale_partials(tmp_path / "tok") == [dead]
    assert alive.is_dir()


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "No space left on device; free some space"),
                                             (errno.EROFS, "read-only; write to another folder"),
                                             (errno.EACCES, "no permission; write to a folder you own")])
def test_os_errors_read_as_one_line(code, words):
    text = describe_os_error(OSError(code, os_strerror(code), "/data/run/model.safetensors"))
    assert text.startswith("/data/run/model.safetensors: ") and words in text and "\n" not in text


def os_strerror(code: int) -> str:
    import os

    return os.strerror(code)
