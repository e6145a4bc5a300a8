"""``lmforge generate`` on tiny saved models: one text per prompt line (the prompt, then the library call's tokens
as text), beam --top T, JSON output, sampling seeds, bad inputs."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from lmforge.commands.generate import add_generate_arguments, run_generate
from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.generation.text import generated_text, tidy_spacing
from lmforge.models.decoder import Decoder
from lmforge.models.seq2seq import EncoderDecoder
from lmforge.persistence import save_pretrained
from lmforge.tokenizers import WordPieceTokenizer
from tests.toy_tasks import vocab

PROMPTS = ["alice went to paris", "the", "bob met carol in rome today and later visited oslo"]


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run ``lmforge generate`` (through the CLI table once the command is registered there)."""
    from lmforge import cli

    if "generate" in cli.COMMANDS:
        code = cli.main(["generate", *argv])
    else:
        parser = argparse.ArgumentParser(prog="lmforge generate")
        add_generate_arguments(parser)
        try:
            code = run_generate(parser.parse_args(argv))
        except LmforgeError as err:
            print(f"lmforge: error: {err}", file=sys.stderr)
            code = 2
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(vocab())


def _peaked(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not ("norm" in name and name.endswith("weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory) -> Path:
    tok = _tokenizer()
    torch.manual_seed(0)
    config = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                         max_seq_len=40, norm_first=True, dropout=0.0, attention_dropout=0.0)
    path = tmp_path_factory.mktemp("gpt")
    save_pretrained(_peaked(Decoder(config)), path, tokenizer=tok)
    return path


@pytest.fixture(scope="module")
def seq2seq_dir(tmp_path_factory) -> Path:
    tok = _tokenizer()
    torch.manual_seed(0)
    config = ModelConfig(arch="seq2seq", vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                         max_seq_len=40, dropout=0.0, attention_dropout=0.0)
    path = tmp_path_factory.mktemp("s2s")
    save_pretrained(_peaked(EncoderDecoder(config)), path, tokenizer=tok)
    return path


@pytest.fixture()
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return path


def _expected_decoder_texts(model_dir: Path, full_text: bool = True, **options) -> list[list[str]]:
    from lmforge.persistence import load_pretrained

    loaded = load_pretrained(model_dir)
    tok = loaded.tokenizer
    out = []
    for text in PROMPTS:
        ids = [tok.sep_id, *tok.encode_ids(text)]
        result = generate(loaded.model, torch.tensor([ids]), eos_id=tok.sep_id, **options)
        out.append([generated_text(tok, text, ids, seq, full_text=full_text) for seq in result.sequences[0]])
    return out


def test_greedy_prints_one_line_per_prompt_equal_to_the_library(gpt_dir, prompts_file, capsys):
    code, out, err = _cli(["--model", str(gpt_dir), "--input", str(prompts_file), "--max-new-tokens", "8",
                           "--batch-size", "2"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines == [texts[0] for texts in _expected_decoder_texts(gpt_dir, max_new_tokens=8)]
    assert all(line.startswith(prompt) for line, prompt in zip(lines, PROMPTS, strict=True))  # echoed as written
    assert any(len(line) > len(prompt) for line, prompt in zip(lines, PROMPTS, strict=True))
    assert not any("##" in line for line in lines)  # pieces joined to the word they continue
    code, out, err = _cli(["--model", str(gpt_dir), "--input", str(prompts_file), "--max-new-tokens", "8",
                           "--continuation-only"], capsys)
    assert code == 0, err
    tails = out.splitlines()
    assert tails == [texts[0] for texts in _expected_decoder_texts(gpt_dir, full_text=False, max_new_tokens=8)]
    assert all(line.endswith(tail) for line, tail in zip(lines, tails, strict=True))


def test_beam_top_two_prints_two_lines_per_prompt_and_json(gpt_dir, prompts_file, capsys):
    argv = ["--model", str(gpt_dir), "--input", str(prompts_file), "--strategy", "beam", "--num-beams", "3",
            "--num-return-sequences", "2", "--length-penalty", "gnmt:0.6", "--max-new-tokens", "6"]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    expected = _expected_decoder_texts(gpt_dir, strategy="beam", num_beams=3, num_return_sequences=2,
                                       length_penalty="gnmt:0.6", max_new_tokens=6)
    assert out.splitlines() == [t for texts in expected for t in texts]
    code, out, err = _cli([*argv, "--json"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == PROMPTS
    for record, texts in zip(records, expected, strict=True):
        gens = record["generations"]
        assert [g["text"] for g in gens] == texts
        assert gens[0]["score"] >= gens[1]["score"]
        assert all(g["stop"] in (None, "[SEP]") and g["log_prob"] <= 0 for g in gens)


def test_sampling_with_a_seed_is_reproducible(gpt_dir, capsys):
    argv = ["--model", str(gpt_dir), "--prompt", "alice went", "--strategy", "sample", "--num-return-sequences", "3",
            "--top-p", "0.9", "--temperature", "1.5", "--seed", "7", "--max-new-tokens", "8"]
    first = _cli(argv, capsys)
    assert first[0] == 0 and len(first[1].splitlines()) == 3
    assert _cli(argv, capsys)[1] == first[1]


def test_no_cache_gives_the_same_output(gpt_dir, prompts_file, capsys):
    argv = ["--model", str(gpt_dir), "--input", str(prompts_file), "--max-new-tokens", "6"]
    assert _cli(argv, capsys)[1] == _cli([*argv, "--no-cache"], capsys)[1]


def test_encoder_decoder_folder(seq2seq_dir, prompts_file, capsys):
    from lmforge.persistence import load_pretrained

    code, out, err = _cli(["--model", str(seq2seq_dir), "--input", str(prompts_file), "--strategy", "beam",
                           "--max-new-tokens", "5"], capsys)
    assert code == 0, err
    loaded = load_pretrained(seq2seq_dir)
    tok = loaded.tokenizer
    for text, line in zip(PROMPTS, out.splitlines(), strict=True):
        result = generate(loaded.model, torch.tensor([tok.encode_ids(text)]), strategy="beam", bos_id=tok.cls_id,
                          eos_id=tok.sep_id, max_new_tokens=5)
        assert line == tidy_spacing(tok.decode(result.sequences[0][0]))  # the target alone, not the source


def test_bad_inputs(gpt_dir, tmp_path, capsys):
    model = ["--model", str(gpt_dir)]
    bad = tmp_path / "bad.txt"
    bad.write_text("alice\n\nbob\n", encoding="utf-8")
    cases = [
        ([*model, "--input", str(bad)], f"{bad}:2: the prompt is empty"),
        ([*model, "--prompt", ""], "--prompt: the prompt is empty"),
        ([*model, "--prompt", "alice " * 40], r"has 41 tokens with the leading \[SEP\], longer than the model's "
                                              r"context \(max_seq_len=40\)"),
        ([*model, "--prompt", "a", "--strategy", "beam", "--num-beams", "2", "--num-return-sequences", "3"],
         "--num-return-sequences 3 exceeds --num-beams 2"),
        ([*model, "--prompt", "a", "--num-return-sequences", "2"], "greedy search finds one text per prompt"),
        ([*model, "--prompt", "a", "--strategy", "sample", "--top-p", "1.5"], r"--top-p: 1.5 is out of range"),
        ([*model, "--prompt", "a", "--strategy", "sample", "--top-p", "0"], r"--top-p: 0 is out of range"),
        ([*model, "--prompt", "a", "--temperature", "0.5"], "only apply to strategy 'sample'"),
        ([*model, "--prompt", "a", "--stop", "zebra"], "--stop 'zebra' is not in the model's vocabulary"),
        ([*model, "--input", str(tmp_path / "missing.txt")], "no such input file"),
        ([*model, "--prompt", "a", "--strategy", "beam", "--num-beams", "0"], r"--num-beams: 0 is out of range"),
    ]
    for argv, message in cases:
        code, out, err = _cli(argv, capsys)
        assert code == 2 and out == "", argv
        assert re.search(message, err), (argv, err)


def test_folder_without_vocab_is_a_clear_error(tmp_path, capsys):
    torch.manual_seed(0)
    config = ModelConfig(arch="decoder", vocab_size=50, d_model=8, n_heads=2, n_layers=1, max_seq_len=16,
                         norm_first=True)
    save_pretrained(Decoder(config), tmp_path / "m")
    code, _, err = _cli(["--model", str(tmp_path / "m"), "--prompt", "hi"], capsys)
    assert code == 2 and "no tokenizer" in err and "WordPiece vocab.txt" in err and "merges.txt" in err


def test_stop_token_ends_the_text(gpt_dir, capsys):
    from lmforge.persistence import load_pretrained

    loaded = load_pretrained(gpt_dir)
    tok = loaded.tokenizer
    ids = torch.tensor([[tok.sep_id, *tok.encode_ids("alice went to")]])
    seq = generate(loaded.model, ids, eos_id=tok.sep_id, max_new_tokens=12).sequences[0][0]
    at = next(i for i in range(1, len(seq)) if seq[i] not in seq[:i])
    stop = tok.ids_to_tokens[seq[at]]
    argv = ["--model", str(gpt_dir), "--prompt", "alice went to", "--max-new-tokens", "12", "--json", "--stop", stop]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    stopped = json.loads(out)["generations"][0]
    assert stopped["stop"] == stop and stopped["tokens"] == at
    assert stopped["continuation"] == generated_text(tok, "alice went to", ids[0].tolist(), seq[:at], full_text=False)
    assert stopped["text"] == generated_text(tok, "alice went to", ids[0].tolist(), seq[:at])
    assert stopped["text"].startswith("alice went to") and stopped["text"].endswith(stopped["continuation"])
