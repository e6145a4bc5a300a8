"""``lmforge embed`` and ``lmforge convert`` on the real MiniLM checkpoint and a tiny GPT-2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.embeddings import embed_texts
from lmforge.persistence import load_pretrained

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")

LINES = ["The bank raised interest rates.", "We sat on the river bank.", "", "Profits jumped 76% to $1.13bn."]


@pytest.fixture()
def lines_file(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def test_embed_from_a_hugging_face_bert_folder(tmp_path, minilm_dir, lines_file):
    out = tmp_path / "e.npy"
    assert main(["embed", "--model", str(minilm_dir), "--input", str(lines_file), "--pooling", "mean",
                 "--out", str(out)]) == 0
    vectors = np.load(out)
    assert vectors.shape == (len(LINES), 384)
    reference = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    tok = transformers.BertTokenizer.from_pretrained(str(minilm_dir))
    batch = tok(LINES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(vectors, expected, atol=1e-5)

    tokens = tmp_path / "t.npz"
    assert main(["embed", "--model", str(minilm_dir), "--input", str(lines_file), "--pooling", "none",
                 "--layers", "-2,-1", "--combine", "concat", "--out", str(tokens)]) == 0
    arrays = np.load(tokens)
    lengths = [len(ids) for ids in tok(LINES)["input_ids"]]
    assert [arrays[f"arr_{i}"].shape for i in range(len(LINES))] == [(n, 768) for n in lengths]


def test_embed_bad_options(tmp_path, minilm_dir, lines_file, capsys):
    assert main(["embed", "--model", str(minilm_dir), "--input", str(lines_file), "--pooling", "none",
                 "--out", str(tmp_path / "x.npy")]) == 2
    assert "writes a .npz file" in capsys.readouterr().err
    assert main(["embed", "--model", str(minilm_dir), "--input", str(lines_file), "--layers", "9",
                 "--out", str(tmp_path / "x.npy")]) == 2
    assert "layer 9 does not exist" in capsys.readouterr().err


def test_convert_bert_both_ways(tmp_path, minilm_dir, lines_file):
    ours = tmp_path / "ours"
    assert main(["convert", "--from-hf", str(minilm_dir), "--out", str(ours)]) == 0
    assert (ours / "vocab.txt").is_file()
    loaded = load_pretrained(ours)
    direct = load_pretrained(minilm_dir)
    a = embed_texts(loaded.model, loaded.tokenizer, LINES)
    b = embed_texts(direct.model, direct.tokenizer, LINES)
    np.testing.assert_array_equal(a, b)

    back = tmp_path / "back"
    assert main(["convert", "--to-hf", str(ours), "--out", str(back)]) == 0
    original = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    exported = transformers.BertModel.from_pretrained(str(back)).eval()
    ids = torch.randint(1000, 2000, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).last_hidden_state, original(ids).last_hidden_state)


def test_convert_gpt2_both_ways(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=99, n_positions=32, n_embd=12, n_layer=2, n_head=3)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(str(tmp_path / "hf"))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 0
    again = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "back")).eval()
    ours = load_pretrained(tmp_path / "ours").model
    ids = torch.randint(0, 99, (3, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(again(ids).logits, reference(ids).logits)


def test_convert_refuses_wrong_direction_and_overwrite(tmp_path, minilm_dir, capsys):
    ours = tmp_path / "ours"
    assert main(["convert", "--from-hf", str(minilm_dir), "--out", str(ours)]) == 0
    assert main(["convert", "--from-hf", str(ours), "--out", str(tmp_path / "x")]) == 2
    assert "already an lmforge model" in capsys.readouterr().err
    assert main(["convert", "--from-hf", str(minilm_dir), "--out", str(ours)]) == 2
    assert "is not empty" in capsys.readouterr().err
