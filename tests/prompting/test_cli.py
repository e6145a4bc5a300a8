"""``lmforge fewshot`` end to end on a tiny saved GPT: the table, fewshot.json, the PNG, escapes, the output
policy, and refusals (an encoder, a malformed verbalizer, shots without --train)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge import cli
from lmforge.commands.fewshot import parse_verbalizer, shots_list, unescape
from lmforge.errors import LmforgeError
from lmforge.persistence import save_pretrained
from lmforge.prompting import DEMOS, MODES, SCORINGS
from tests.prompting.helpers import TEST, TRAIN, decoder, tokenizer

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpt")
    save_pretrained(decoder(dtype=torch.float32), path, tokenizer=tokenizer())
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("data")
    for name, examples in (("train.csv", TRAIN), ("test.csv", TEST)):
        (root / name).write_text("text,label\n" + "".join(f"{e.text},{e.label}\n" for e in examples),
                                 encoding="utf-8")
    return root / "train.csv", root / "test.csv"


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(["-q", "fewshot", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _args(gpt_dir, data, *extra: str) -> list[str]:
    return ["--model", str(gpt_dir), "--train", str(data[0]), "--test", str(data[1]), "--shots", "0,2",
            "--draws", "2", "--template", r"Review: {text}\nSentiment: {label}",
            "--verbalizer", "pos=positive,neg=negative", *extra]


def test_end_to_end_table_json_and_png(gpt_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = _run(_args(gpt_dir, data, "--calibrate", "--out", str(out)), capsys)
    assert code == 0, err
    assert "accuracy" in stdout and "chance 0.5000" in stdout
    saved = json.loads((out / "fewshot.json").read_text(encoding="utf-8"))
    assert saved["config"]["template"] == "Review: {text}\nSentiment: {label}"  # \n became a newline
    assert saved["config"]["calibrate"] is True and saved["config"]["verbalizer"] == {"pos": "positive",
                                                                                      "neg": "negative"}
    assert [r["shots"] for r in saved["rows"]] == [0, 2] and len(saved["rows"][1]["accuracies"]) == 2
    assert len(saved["predictions"]["2"]) == len(TEST) and saved["predictions"]["2"][0]["line"] == 2
    assert (out / "fewshot.png").read_bytes().startswith(PNG)
    assert sorted(p.name for p in out.iterdir()) == ["fewshot.json", "fewshot.png"]


def test_an_existing_out_is_refused_without_overwrite(gpt_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = _run(_args(gpt_dir, data, "--out", str(out)), capsys)
    assert code == 2 and "--overwrite" in err and "Traceback" not in err
    assert (out / "keep.txt").read_text() == "mine" and not (out / "fewshot.json").exists()
    code, _, err = _run(_args(gpt_dir, data, "--max-test", "2", "--out", str(out), "--overwrite"), capsys)
    assert code == 0, err
    assert len(json.loads((out / "fewshot.json").read_text())["predictions"]["0"]) == 2
    assert any(p.name.startswith("run.old-") for p in tmp_path.iterdir())  # moved aside, not deleted


def test_an_encoder_folder_is_refused(tiny_encoder_dir, data, capsys):
    code, _, err = _run(["--model", str(tiny_encoder_dir), "--test", str(data[1]), "--shots", "0"], capsys)
    assert code == 2
    assert "fewshot scores text left to right with a causal language model" in err
    assert "bidirectional encoder" in err and str(tiny_encoder_dir) in err


@pytest.mark.parametrize("extra, words", [
    (["--verbalizer", "pos=positive,negative"], "malformed item 'negative'"),
    (["--verbalizer", "pos=positive"], "no words for label 'neg'"),
    (["--template", "{text}"], "no {label}"),
    (["--shots", "0,20"], "K=20 exceeds the 8 training examples"),
    (["--mode", "generate", "--calibrate"], "calibrate applies"),
])
def test_bad_options_are_one_line_errors(gpt_dir, data, extra, words, capsys):
    code, _, err = _run([*_args(gpt_dir, data), *extra], capsys)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_shots_above_zero_need_train(gpt_dir, data, capsys):
    code, _, err = _run(["--model", str(gpt_dir), "--test", str(data[1]), "--shots", "0,1"], capsys)
    assert code == 2 and "needs --train FILE" in err
    code, _, err = _run(["--model", str(gpt_dir), "--test", str(data[1]), "--shots", "0"], capsys)
    assert code == 2 and "labels 'neg' and 'pos' have the same verbalisation once tokenized ([UNK])" in err
    code, stdout, err = _run(["--model", str(gpt_dir), "--test", str(data[1]), "--shots", "0", "--mode", "generate",
                              "--stop", r"\n", "--max-new-tokens", "2", "--verbalizer", "pos=good,neg=bad"], capsys)
    assert code == 0, err
    assert "majority" in stdout and "chance" not in stdout


def test_option_parsers():
    assert unescape(r"a\nb\tc\\n\x") == "a\nb\tc\\n\\x"
    assert parse_verbalizer("pos=very good, neg = bad") == {"pos": "very good", "neg": "bad"}
    for bad in ("pos", "pos=,neg=bad", "=x", "a=b,a=c"):
        with pytest.raises(LmforgeError, match="--verbalizer"):
            parse_verbalizer(bad)
    assert shots_list("0,1,4,16") == (0, 1, 4, 16)
    assert (SCORINGS, DEMOS, MODES) == (
        ("sum", "mean", "unconditional"), ("fixed", "per-example"), ("classify", "generate"))
    from lmforge.commands import fewshot as command

    assert (command.SCORINGS, command.DEMOS, command.MODES) == (SCORINGS, DEMOS, MODES)


def test_a_hugging_face_gpt2_folder_with_byte_level_bpe(tmp_path, data, capsys):
    pytest.importorskip("lmforge.tokenizers.bytebpe", reason="the byte-level BPE tokenizer is not in lmforge yet")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted({w for e in [*TRAIN, *TEST] for w in e.text.split()} | {"positive", "negative", "Review",
                                                                          "Sentiment"})
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(words)] * 20 + ["Review: x\nSentiment: positive negative"] * 20,
                            vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    (tmp_path / "hf").mkdir()
    bpe.save_model(str(tmp_path / "hf"))
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=128, n_embd=16, n_layer=2,
                                     n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    code, stdout, err = _run(_args(tmp_path / "hf", data), capsys)
    assert code == 0, err
    assert "accuracy" in stdout
