"""Tokenizers from ``tokenizer.json`` alone (what transformers 5 saves): WordPiece (uncased and cased) and byte-level
BPE encode held-out text to the same ids as the ``tokenizers`` package; a model folder holding only that file loads
with its tokenizer; a model lmforge cannot read is refused by name, never dropped."""

from __future__ import annotations

import pytest

from lmforge.errors import InputFileError
from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from lmforge.tokenizers.hf_json import from_tokenizer_json

transformers = pytest.importorskip("transformers", reason="the reference tokenizers come from transformers")
hf_tokenizers = pytest.importorskip("tokenizers", reason="the reference tokenizers package")

EXTRA = ["Naïve café owners in Zürich — 東京 and ＡＢＣ — said \"no\"!", "Shares rose 5.5% to $1,234 (up 2,000).",
         "The striker's hat-trick won't be forgotten.", "tab\tseparated\u00a0non-breaking   spaces"]


def _held_out(bbc_dir, n: int = 40) -> list[str]:
    lines = []
    for topic in ("tech", "politics"):
        for path in sorted((bbc_dir / topic).glob("*.txt"))[-3:]:
            lines += [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[:n] + EXTRA


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_from_tokenizer_json_encodes_as_tokenizers(minilm_dir, bbc_dir, tmp_path, lowercase):
    reference = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir), do_lower_case=lowercase)
    reference.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").is_file()
    ours = from_tokenizer_json(tmp_path / "tokenizer.json")
    assert isinstance(ours, WordPieceTokenizer) and ours.basic.lowercase == lowercase
    for text in _held_out(bbc_dir):
        assert ours.encode_ids(text) == reference(text, add_special_tokens=False)["input_ids"], text


def test_byte_level_bpe_from_tokenizer_json_encodes_as_tokenizers(bbc_dir, tmp_path):
    train = []
    for path in sorted((bbc_dir / "business").glob("*.txt"))[:60]:
        train += path.read_text(encoding="utf-8", errors="replace").splitlines()
    reference = hf_tokenizers.ByteLevelBPETokenizer()
    reference.train_from_iterator(train, vocab_size=600, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  show_progress=False)
    reference.save(str(tmp_path / "tokenizer.json"))
    ours = from_tokenizer_json(tmp_path)
    assert isinstance(ours, ByteLevelBPETokenizer)
    for text in _held_out(bbc_dir):
        assert ours.encode_ids(text) == reference.encode(text).ids, text


def test_a_model_folder_with_tokenizer_json_only_keeps_its_tokenizer(minilm_dir, tmp_path):
    import torch

    from lmforge.persistence import load_pretrained

    config = transformers.BertConfig(vocab_size=30522, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(tmp_path))
    transformers.BertTokenizerFast.from_pretrained(str(minilm_dir)).save_pretrained(str(tmp_path))
    assert not (tmp_path / "vocab.txt").exists()
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded.tokenizer, WordPieceTokenizer)
    assert loaded.tokenizer.encode_ids("hello world") == [7592, 2088]


def test_a_model_lmforge_cannot_read_is_refused_by_name(tmp_path):
    # Unigram is read since issue 37 (tests/tokenizers/test_unigram_json.py); a word-level model is not
    word_level = hf_tokenizers.Tokenizer(hf_tokenizers.models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    word_level.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputFileError, match="a WordLevel tokenizer model, which lmforge cannot read yet"):
        from_tokenizer_json(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InputFileError, match="cannot read it as JSON"):
        from_tokenizer_json(tmp_path)


@pytest.mark.parametrize("lowercase", [True, False])
def test_the_tokenizer_json_written_on_export_encodes_as_ours(minilm_dir, bbc_dir, tmp_path, lowercase):
    import json

    from lmforge.tokenizers.hf_json import wordpiece_tokenizer_json

    ours = WordPieceTokenizer.from_pretrained(minilm_dir, lowercase=lowercase)
    (tmp_path / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(ours)), encoding="utf-8")
    reference = hf_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    texts = _held_out(bbc_dir, 20)
    for text in texts:
        assert reference.encode(text).ids == ours(text)["input_ids"], text  # [CLS] ... [SEP]
    pair = reference.encode(texts[0], texts[1])
    expected = ours(texts[0], texts[1])
    assert pair.ids == expected["input_ids"] and pair.type_ids == expected["token_type_ids"]
    assert from_tokenizer_json(tmp_path).encode_ids(texts[2]) == ours.encode_ids(texts[2])  # and back


def test_convert_to_hf_writes_tokenizer_json_that_transformers_loads(tmp_path):
    from lmforge.cli import main
    from tests.toy_tasks import make_encoder_dir

    model = make_encoder_dir(tmp_path / "model")
    assert main(["-q", "convert", "--to-hf", str(model), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").is_file() and (tmp_path / "hf" / "vocab.txt").is_file()
    fast = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ours = WordPieceTokenizer.from_pretrained(model)
    assert fast("alice went to paris")["input_ids"] == ours("alice went to paris")["input_ids"]


def test_a_byte_level_bpe_is_written_as_tokenizer_json_that_encodes_as_ours(bbc_dir, tmp_path):
    # GPT-2 exports (and RoBERTa ones with a byte-level BPE) carry tokenizer.json beside vocab.json + merges.txt
    import json

    from lmforge.tokenizers import ByteLevelBPETokenizer
    from lmforge.tokenizers.hf_json import byte_bpe_tokenizer_json
    from tokenizers import decoders, models, pre_tokenizers, trainers

    files = [str(p) for p in sorted((bbc_dir / "business").glob("*.txt"))[:80]]
    held_out = [p.read_text(encoding="utf-8") for p in sorted((bbc_dir / "tech").glob("*.txt"))[:3]]
    for specials, bos in ((["<|endoftext|>"], None), (["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>")):
        trained = hf_tokenizers.Tokenizer(models.BPE())
        trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trained.decoder = decoders.ByteLevel()
        trained.train(files, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        trained.save(str(tmp_path / "source.json"))
        ours = from_tokenizer_json(tmp_path / "source.json")
        assert isinstance(ours, ByteLevelBPETokenizer) and ours.wraps_texts == (bos is not None)
        (tmp_path / "tokenizer.json").write_text(json.dumps(byte_bpe_tokenizer_json(ours)), encoding="utf-8")
        reference = hf_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
        for text in held_out:
            assert reference.encode(text).ids == ours(text)["input_ids"]
            assert reference.encode(text, held_out[0][:200]).ids == ours(text, held_out[0][:200])["input_ids"]
        assert from_tokenizer_json(tmp_path / "tokenizer.json").ids_to_tokens == ours.ids_to_tokens
