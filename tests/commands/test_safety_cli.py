"""Issue reproductions: nothing a user owns is lost, and bad input ends in one clean line (exit 2), never a
traceback. Each test names the case it reproduces."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from lmforge.cli import build_parser, main
from lmforge.commands.options import unranged_numeric_options
from tests.toy_tasks import write_task_data


def snapshot(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    for word in words:
        assert word in errors[0], errors[0]


@pytest.fixture(scope="module")
def user_model(tiny_encoder_dir, tmp_path_factory) -> Path:
    """A folder the user owns: a model with its config and vocabulary (not a run lmforge started)."""
    folder = tmp_path_factory.mktemp("user") / "mine"
    folder.mkdir()
    for name in ("model.safetensors", "config.json", "vocab.txt"):
        (folder / name).write_bytes((tiny_encoder_dir / name).read_bytes())
    return folder


@pytest.fixture(scope="module")
def seq_data(tmp_path_factory) -> tuple[Path, Path]:
    return write_task_data(tmp_path_factory.mktemp("seq"), "sequence", n_train=12, n_dev=6)


FAST = ["--epochs", "1", "--batch-size", "4", "--max-length", "16", "--train.log_every=1"]


# ------------------------------------------------------------------------------------------------- data loss
def test_finetune_refuses_an_out_folder_holding_a_users_model(tiny_encoder_dir, user_model, seq_data, capsys):
    before = snapshot(user_model.parent)
    code, err = run(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(seq_data[0]),
                     "--out", str(user_model), *FAST], capsys)
    assert_one_line_error(code, err, "is not empty", "--overwrite")
    assert snapshot(user_model.parent) == before


def test_finetune_out_equal_to_model_is_refused_even_with_overwrite(user_model, seq_data, capsys):
    before = snapshot(user_model.parent)
    for extra in ([], ["--overwrite"], ["--resume", "auto"]):
        code, err = run(["finetune", "--task", "sequence", "--model", str(user_model), "--train", str(seq_data[0]),
                         "--out", str(user_model), *FAST, *extra], capsys)
        assert_one_line_error(code, err, "is the input", "never writes over its inputs")
    code, err = run(["finetune", "--task", "sequence", "--model", str(user_model), "--train", str(seq_data[0]),
                     "--out", str(user_model / "run"), *FAST], capsys)
    assert_one_line_error(code, err, "is inside the input")
    assert snapshot(user_model.parent) == before


def test_resume_auto_in_a_folder_that_is_not_a_run_is_refused(tiny_encoder_dir, user_model, seq_data, capsys):
    before = snapshot(user_model.parent)
    code, err = run(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(seq_data[0]),
                     "--out", str(user_model), "--resume", "auto", *FAST], capsys)
    assert_one_line_error(code, err, "no lmforge training run")
    assert snapshot(user_model.parent) == before


def test_overwrite_moves_a_users_folder_aside_and_trains(tiny_encoder_dir, user_model, seq_data, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = run(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(seq_data[0]),
                     "--out", str(out), "--overwrite", *FAST], capsys)
    assert code == 0, err
    (aside,) = tmp_path.glob("out.old-*")
    assert (aside / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()


def test_pretrain_refuses_a_users_folder(user_model, tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"the cat sat on mat number {i}.\nit was a good mat.\n\n" for i in range(40)))
    assert main(["tokenizer", "train", "--input", str(text), "--vocab-size", "60", "--out", str(tmp_path / "tok")]) == 0
    assert main(["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input", str(text), "--out",
                 str(tmp_path / "data"), "--workers", "1"]) == 0
    capsys.readouterr()
    before = snapshot(user_model.parent)
    tiny = ["--preset", "bert-tiny", "--input", str(tmp_path / "data"), "--max-steps", "1", "--batch-size", "2",
            "--seq-len", "16", "--model.max_seq_len=16"]
    code, err = run(["pretrain", *tiny, "--out", str(user_model)], capsys)
    assert_one_line_error(code, err, "is not empty")
    code, err = run(["pretrain", *tiny, "--out", str(tmp_path / "data")], capsys)
    assert_one_line_error(code, err, "is the input")
    assert snapshot(user_model.parent) == before


# ------------------------------------------------------------------------------------------------- options
def test_every_numeric_option_declares_its_range():
    assert unranged_numeric_options(build_parser()) == []


def test_help_shows_the_range(capsys):
    assert main(["evaluate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--batch-size BATCH_SIZE [^-]*\[integer in \[1, 65,536\]\]", out)


@pytest.mark.parametrize("value", ["0", "-1", "x"])
@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_batch_size_out_of_range(finetuned, command, value, tmp_path, capsys):
    run_dir, _, dev = finetuned("sequence")
    io = ["--test", str(dev)] if command == "evaluate" else ["--input", str(dev), "--out", str(tmp_path / "p.jsonl")]
    code, err = run([command, "--model", str(run_dir), *io, "--batch-size", value], capsys)
    assert_one_line_error(code, err, "--batch-size", "integer in [1, 65,536]")
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize(("flags", "words"), [
    (["--lr", "nan"], "--lr: 'nan' is not a finite number"),
    (["--lr", "inf"], "--lr: 'inf' is not a finite number"),
    (["--weight-decay", "-1"], "--weight-decay: -1 is out of range"),
    (["--train.weight_decay=-1"], "weight_decay=-1.0 must be >= 0"),
    (["--train.lr=nan"], "lr=nan must be a finite number"),
    (["--task.epochs=nan"], "epochs=nan must be a positive number"),
    (["--max-length", "0"], "--max-length: 0 is out of range"),
])
def test_absurd_numbers_are_refused(tiny_encoder_dir, seq_data, tmp_path, flags, words, capsys):
    code, err = run(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(seq_data[0]),
                     "--out", str(tmp_path / "run"), "--epochs", "1", *flags], capsys)
    assert_one_line_error(code, err, words)
    assert not (tmp_path / "run").exists()


def test_parse_errors_are_one_line(capsys):
    code, err = run(["finetune", "--bogus", "1"], capsys)
    assert_one_line_error(code, err, "lmforge finetune: unrecognized arguments: --bogus 1", "--help")
    code, err = run(["generate", "--model", "m", "--prompt", "a", "--num-beams", "0"], capsys)
    assert_one_line_error(code, err, "--num-beams: 0 is out of range: expected an integer in [1, 1,024]")


# ------------------------------------------------------------------------------------------------- embed, viz
def test_embed_zero_length_and_empty_input(tiny_encoder_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    code, err = run(["embed", "--model", str(tiny_encoder_dir), "--input", str(empty), "--out",
                     str(tmp_path / "e.npy")], capsys)
    assert_one_line_error(code, err, "holds no text")
    code, err = run(["embed", "--model", str(tiny_encoder_dir), "--input", str(empty), "--out",
                     str(tmp_path / "e.npy"), "--max-length", "0"], capsys)
    assert_one_line_error(code, err, "--max-length: 0 is out of range")
    assert not (tmp_path / "e.npy").exists()


def test_invalid_utf8_is_replaced_with_a_warning_or_refused(tiny_encoder_dir, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"alpha beta\ngamma \xff\xfe delta\n")
    code, err = run(["embed", "--model", str(tiny_encoder_dir), "--input", str(bad), "--out",
                     str(tmp_path / "e.npy")], capsys)
    assert code == 0 and "bad.txt: not valid UTF-8 (first at line 2), 2 byte(s) replaced" in err
    code, err = run(["--strict-utf8", "embed", "--model", str(tiny_encoder_dir), "--input", str(bad), "--out",
                     str(tmp_path / "f.npy")], capsys)
    assert_one_line_error(code, err, "bad.txt:2: not valid UTF-8")
    code, err = run(["viz", "attention", "--model", str(tiny_encoder_dir), "--text-file", str(bad), "--out",
                     str(tmp_path / "a.png")], capsys)
    assert code == 0 and "bad.txt: not valid UTF-8 (first at line 2), 2 byte(s) replaced" in err


def test_a_folder_named_like_a_file_is_called_a_folder(finetuned, tmp_path, capsys):
    run_dir, _, _ = finetuned("sequence")
    (tmp_path / "x.csv").mkdir()
    code, err = run(["evaluate", "--model", str(run_dir), "--test", str(tmp_path / "x.csv")], capsys)
    assert_one_line_error(code, err, "x.csv: is a folder, not a file")


# ------------------------------------------------------------------------------------------------- write failures
def fail_writes_under(monkeypatch, root: Path, code: int) -> None:
    """Every write under ``root`` fails as a full, read-only or forbidden disk would (we may run as root, for
    whom chmod does not stop writes)."""
    real_open, real_mkdir, real_mkstemp = os.open, os.mkdir, __import__("tempfile").mkstemp

    def under(path) -> bool:
        return Path(os.fsdecode(path)).resolve().is_relative_to(root.resolve())

    def fake_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and under(path):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if under(path):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    def fake_mkstemp(*args, dir=None, **kwargs):
        if dir is not None and under(dir):
            raise OSError(code, os.strerror(code), os.fsdecode(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr("tempfile.mkstemp", fake_mkstemp)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_unwritable_output_folders_are_one_line(tiny_encoder_dir, tmp_path, monkeypatch, code, capsys):
    text = tmp_path / "in.txt"
    text.write_text("some words here\nand more words there\n" * 20)
    locked = tmp_path / "locked"
    fail_writes_under(monkeypatch, locked, code)
    cases = [["tokenizer", "train", "--input", str(text), "--vocab-size", "40", "--out", str(locked / "tok")],
             ["tokenizer", "encode", "--tokenizer", str(tiny_encoder_dir), "--input", str(text), "--out",
              str(locked / "enc.jsonl")],
             ["embed", "--model", str(tiny_encoder_dir), "--input", str(text), "--out", str(locked / "e.npy")],
             ["viz", "positions", "--out", str(locked / "p.png")]]
    for argv in cases:
        status, err = run(argv, capsys)
        assert_one_line_error(status, err, str(locked), os.strerror(code))
    assert not locked.exists() or not any(locked.rglob("*"))


def test_a_full_disk_while_checkpointing_is_one_line_and_leaves_no_partial_checkpoint(
        tiny_encoder_dir, seq_data, tmp_path, monkeypatch, capsys):
    import torch

    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):  # what torch raises when the disk fills during torch.save
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 4352 vs 4246\n"
                           "frame #0: c10::ThrowEnforceNotMet(...)")

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "run"
    code, err = run(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(seq_data[0]),
                     "--out", str(out), *FAST], capsys)
    assert_one_line_error(code, err, "could not write it", "unexpected pos", "MB free there", "--resume auto")
    assert not list((out / "checkpoints").glob(".tmp-*")) and not list((out / "checkpoints").glob("step-*"))
    monkeypatch.setattr(torch, "save", real_save)
    code, err = run(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(seq_data[0]),
                     "--out", str(out), "--resume", "auto", *FAST], capsys)
    assert code == 0, err


def test_a_binary_input_is_called_binary_not_a_vocabulary_problem(tmp_path, capsys):
    import random

    binary = tmp_path / "corpus.txt"
    binary.write_bytes(random.Random(0).randbytes(20_000))
    code, err = run(["tokenizer", "train", "--input", str(binary), "--vocab-size", "100", "--out",
                     str(tmp_path / "tok")], capsys)
    assert_one_line_error(code, err, "corpus.txt:", "looks like a binary file")
    assert not (tmp_path / "tok").exists()


def test_kill_9_during_data_prepare_leaves_no_output_and_the_next_run_cleans_up(tmp_path):
    import random
    import signal
    import subprocess
    import sys
    import time

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(2000)]
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(" ".join(rng.choice(words) for _ in range(12)) + ".\n" + ("\n" if i % 8 == 7 else "")
                              for i in range(16_000)))
    assert main(["-q", "tokenizer", "train", "--input", str(corpus), "--vocab-size", "300", "--out",
                 str(tmp_path / "tok")]) == 0
    out = tmp_path / "data"
    argv = [sys.executable, "-m", "lmforge", "data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input",
            str(corpus), "--out", str(out), "--workers", "1", "--shard-tokens", "500"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(tmp_path.glob(".data.partial-*/shard-00003.ids.npy")) and time.monotonic() < deadline:
        assert proc.poll() is None, "data prepare finished before it could be killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # never shards without a manifest under the real name
    (partial,) = tmp_path.glob(".data.partial-*")
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"removed {partial}, left by an interrupted run" in done.stderr
    assert not partial.exists() and (out / "manifest.json").is_file() and (out / "tokenizer" / "vocab.txt").is_file()
