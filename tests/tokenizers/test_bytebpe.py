"""Byte-level BPE: ids equal to Hugging Face's (tokenizers and transformers) on a BPE trained here, exact round
trips, added tokens, persistence, error messages, and loading with a tiny Hugging Face GPT-2 folder."""

from __future__ import annotations

import json
import random
import shutil
import unicodedata
from pathlib import Path

import pytest

from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers import ByteLevelBPETokenizer
from lmforge.tokenizers.bytebpe import BYTE_TO_CHAR, CHAR_TO_BYTE, pretokenize_pattern

hf_tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is the parity reference (dev extra)")

EOT = "<|endoftext|>"

# Training text: prose with contractions, accents, digits, punctuation, runs of spaces, tabs, newlines, emoji, CJK,
# Arabic, Devanagari, code.
TRAIN = [
    "The quick brown fox jumps over the lazy dog. It's 9:45 and we're late; they'll wait, won't they?",
    "Café au lait, naïve résumé, Ærøskøbing, São Paulo, Zürich — déjà vu! Größe: 12,5 m².",
    "In 2019, GPT-2 was trained on 40 GB of text (WebText).  Two  spaces,   three   spaces.\n\nNew paragraph.",
    "def tokenize(text):\n    return [w for w in text.split() if w]  # __init__, snake_case_name\n\tindented\n",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다. Emoji: 😀 🎉 👍🏽 ❤️ 🇯🇵",
    "مرحبا بالعالم ١٢٣ — नमस्ते दुनिया १२३ — Привет, мир! 456 — Γειά σου κόσμε.",
    "I've seen 'em all: you'd think I'm done, but we'll see. Don't stop! He's here. She'd go.",
    "Prices: $3.50, €4,99, ¥1000, £7. Ratio ½, ¾, 10%, 3×4=12, x² + y² = z², Ⅷ chapters.",
    "E-mail: someone@example.com; URL: https://example.org/path?q=1&r=2#frag ... «quoted» “curly” ‘single’",
] * 3

HELD_OUT = [
    "", " ", "  ", "\n", "\n\n\n", "\t", "a", "A", "hello world", "Hello World!", "  leading spaces",
    "trailing spaces   ", "mixed \t\n whitespace \n\t ", "they're", "THEY'RE", "it's it'S", "'s's's", "''", "'",
    "rock'n'roll", "o'clock", "Ma'am, y'all", "naïveté élan Ågström", "e\u0301 combining acute", "ﬁ ligature",
    "12345678901234567890", "3.14159 2,718", "x1y2z3", "١٢٣٤ ४५६ ๗๘๙ １２３", "Ⅻ ⅻ ½⅓ ² ³ ¹",
    "🦜🦜🦜 parrots", "family: 👨‍👩‍👧‍👦, flag: 🇫🇷, skin: 👋🏿", "中文字符测试，标点。", "日本語とEnglishの混在",
    "한국어 텍스트", "Ελληνικά και русский", "עברית", "foo_bar __dunder__ _x", "a\u00a0b\u00a0\u00a0c",
    "a\u3000b", "line\u2028sep\u2029para", "nel\u0085x", "ctrl\x1c\x1d\x1e\x1fchars", "bell\x07 null\x00 del\x7f",
    "zero\u200bwidth", "bidi\u200f\u202emarks", "soft\u00adhyphen", "tabs\t\t\tand spaces   \t end",
    "!!!???...,,,;;;", "(parens) [brackets] {braces} <angles>", "@#$%^&*~`|\\/", "--- *** ===",
    "http://x.y/z?a=b", "snake_case and camelCase and SCREAMING_CASE", "x" * 500, " y" * 300, "!" * 400,
    "ab" * 257, "unseen words: quokka zephyr xylophone", "\U0001f600" * 20, "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "\ufeffBOM",
]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    """A byte-level BPE trained by Hugging Face tokenizers on TRAIN, saved as vocab.json + merges.txt."""
    ref = hf_tokenizers.ByteLevelBPETokenizer()
    ref.train_from_iterator(TRAIN, vocab_size=700, min_frequency=2, special_tokens=[EOT], show_progress=False)
    directory = tmp_path_factory.mktemp("bytebpe")
    ref.save_model(str(directory))
    return directory


@pytest.fixture(scope="module")
def reference(bpe_dir):
    """The same files read by Hugging Face tokenizers (with <|endoftext|> as a special added token)."""
    ref = hf_tokenizers.ByteLevelBPETokenizer(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"))
    ref.add_special_tokens([EOT])
    return ref


@pytest.fixture()
def tok(bpe_dir) -> ByteLevelBPETokenizer:
    return ByteLevelBPETokenizer.from_pretrained(bpe_dir)


def _random_texts(seed: int, n: int, length: int = 40) -> list[str]:
    """Random strings of assigned code points (all planes) mixed with spaces, ASCII and apostrophes."""
    rng = random.Random(seed)
    common = list(" \t\n'sdtmlrve0123456789abcXYZ.,!_-") + ["  ", "'s", "'ll", " \n"]
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(length)):
            if rng.random() < 0.5:
                parts.append(rng.choice(common))
                continue
            while True:
                c = chr(rng.randrange(0x110000 if rng.random() < 0.3 else 0x3000))
                if unicodedata.category(c) not in ("Cn", "Cs"):  # assigned, and a character (not a surrogate)
                    break
            parts.append(c)
        texts.append("".join(parts))
    return texts


# ---------------------------------------------------------------------------------------------------- the byte map
def test_byte_map_is_a_printable_bijection():
    assert len(set(BYTE_TO_CHAR)) == 256 and len(CHAR_TO_BYTE) == 256
    assert all(c.isprintable() and not c.isspace() for c in BYTE_TO_CHAR)
    assert BYTE_TO_CHAR[ord("A")] == "A" and BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ"
    assert set(BYTE_TO_CHAR) == set(hf_tokenizers.pre_tokenizers.ByteLevel.alphabet())


# ---------------------------------------------------------------------------------------------------- parity
def test_pretokenization_matches_hugging_face_on_every_kind_of_character():
    """GPT-2's pattern with \\p{L}, \\p{N} and \\s spelled out in stdlib classes splits like the Rust original."""
    ref = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pattern = pretokenize_pattern()
    table = {b: c for b, c in enumerate(BYTE_TO_CHAR)}
    rng = random.Random(0)
    chars = [c for c in map(chr, rng.sample(range(0x110000), 6000)) if unicodedata.category(c) not in ("Cn", "Cs")]
    chars += list("\x1c\x1f\x85\xa0\u1680\u2007\u2028\u3000\u200b²Ⅷ½_é\u0301😀中٣")
    mismatches = []
    for c in chars:
        text = f"a{c}1{c} {c}{c}x '{c}"  # c after a letter, a digit, a space, itself, before a letter
        theirs = [piece for piece, _ in ref.pre_tokenize_str(text)]
        ours = [w.encode("utf-8").decode("latin-1").translate(table) for w in pattern.findall(text)]
        if ours != theirs:
            mismatches.append((hex(ord(c)), unicodedata.category(c)))
    assert mismatches == []


def test_ids_match_hugging_face_tokenizers(tok, reference):
    texts = HELD_OUT + TRAIN[:9] + _random_texts(1, 300)
    assert [tok.encode_ids(t) for t in texts] == [e.ids for e in reference.encode_batch(texts)]
    assert [tok.tokenize(t) for t in HELD_OUT] == [reference.encode(t).tokens for t in HELD_OUT]


def test_ids_match_transformers_gpt2_tokenizer(tok, bpe_dir):
    transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")
    texts = [*HELD_OUT, *_random_texts(2, 100), f"one{EOT}two {EOT} three{EOT}{EOT}"]
    for name in ("GPT2TokenizerFast", "GPT2Tokenizer"):
        ref = getattr(transformers, name).from_pretrained(str(bpe_dir))
        assert len(ref) == tok.vocab_size
        assert ref.eos_token_id == tok.eos_id and ref.bos_token_id == tok.bos_id
        assert [tok.encode_ids(t) for t in texts] == [ref.encode(t) for t in texts], name
        for t in texts:
            ids = tok.encode_ids(t)
            assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
            assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids)


def test_bbc_news_matches_hugging_face(bbc_texts, tmp_path):
    """A vocabulary trained on 100 real articles, compared on 400 others (skipped without the corpus)."""
    ref = hf_tokenizers.ByteLevelBPETokenizer()
    ref.train_from_iterator(bbc_texts[:100], vocab_size=1500, show_progress=False)
    ref.save_model(str(tmp_path))
    ours = ByteLevelBPETokenizer.from_pretrained(tmp_path)
    texts = bbc_texts[1000:1400]
    mine = [ours.encode_ids(t) for t in texts]
    assert mine == [e.ids for e in ref.encode_batch(texts)]
    assert [ours.decode(ids) for ids in mine] == texts


def test_long_words_merge_like_the_reference(tok, reference):
    for text in ["ab" * 3000, "!?" * 2000 + "." * 999, "😀" * 700, "th" + "e" * 5000]:
        assert tok.encode_ids(text) == reference.encode(text).ids


# ---------------------------------------------------------------------------------------------------- round trips
def test_decode_inverts_encode_exactly(tok):
    for text in [*HELD_OUT, *TRAIN, *_random_texts(3, 300, length=80), f"x{EOT}y", f" {EOT} {EOT}\n"]:
        assert tok.decode(tok.encode_ids(text), skip_special_tokens=False) == text


def test_decode_replaces_cut_characters_like_gpt2(tok, reference):
    ids = tok.encode_ids("😀")  # 4 bytes: with few merges, several ids
    cut = [tok.vocab[BYTE_TO_CHAR[b]] for b in "😀".encode()[:3]] + tok.encode_ids("ok")
    assert tok.decode(cut) == "\ufffdok" == reference.decode(cut)
    assert tok.decode(ids) == "😀"


def test_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    small = ByteLevelBPETokenizer(vocab, [], eos_token=None)
    assert small.decode(torch.tensor(small.encode_ids("hé"))) == "hé"


def test_lone_surrogate_is_a_clear_error(tok):
    with pytest.raises(LmforgeError, match="lone surrogate"):
        tok.encode_ids("abc\ud800def")


# ---------------------------------------------------------------------------------------------------- special tokens
def test_roles_and_properties(tok, bpe_dir):
    vocab = json.loads((bpe_dir / "vocab.json").read_text(encoding="utf-8"))
    assert tok.vocab_size == len(tok) == len(vocab) == len(tok.ids_to_tokens)
    assert tok.eos_id == tok.bos_id == tok.pad_id == vocab[EOT]  # no pad token configured: pad is eos
    assert tok.unk_id is None and tok.lowercase is False
    assert tok.special_ids == {vocab[EOT]} and tok.special_tokens == [EOT]
    assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens([5, 6, vocab[EOT]])) == [5, 6, vocab[EOT]]


def test_special_token_in_text_is_one_id(tok):
    ids = tok.encode_ids(f"Hello{EOT}world {EOT}")
    assert ids.count(tok.eos_id) == 2 and EOT not in tok.decode(ids)
    assert tok.decode(ids, skip_special_tokens=False) == f"Hello{EOT}world {EOT}"
    assert tok.decode(ids) == "Helloworld "
    # The text around the special token is pre-tokenised on its own: "world " ends with its own space.
    assert tok.encode_ids(f"world {EOT}")[:-1] == tok.encode_ids("world ")


def test_add_tokens(tok, reference):
    n = tok.vocab_size
    new = tok.add_tokens(["<start>", "<delim>", "<extract>"])
    assert new == [n, n + 1, n + 2] and tok.vocab_size == n + 3
    assert tok.add_tokens(["<delim>", EOT]) == [n + 1, tok.eos_id]  # known tokens keep their ids
    assert tok.vocab_size == n + 3 and tok.convert_ids_to_tokens(new) == ["<start>", "<delim>", "<extract>"]
    text = "<start> Is it?<delim>Yes, it is.<extract>"
    ids = tok.encode_ids(text)
    assert ids[0] == n and n + 1 in ids and ids[-1] == n + 2
    assert tok.decode(ids) == " Is it?Yes, it is." and tok.decode(ids, skip_special_tokens=False) == text
    reference.add_special_tokens(["<start>", "<delim>", "<extract>"])
    assert ids == reference.encode(text).ids


def test_longest_added_token_wins(tok):
    a, ab = tok.add_tokens(["<a>", "<a><b>"])
    assert tok.encode_ids("<a><b><a>") == [ab, a]


def test_add_tokens_rejects_non_tokens(tok):
    with pytest.raises(LmforgeError, match=r"add_tokens\(\[token\]\)"):
        tok.add_tokens("<x>")
    with pytest.raises(LmforgeError, match="non-empty strings"):
        tok.add_tokens([""])


def test_unknown_tokens_and_ids_are_errors(tok):
    with pytest.raises(LmforgeError, match="not a token of this vocabulary"):
        tok.convert_tokens_to_ids(["no such token"])
    with pytest.raises(LmforgeError, match="outside the vocabulary"):
        tok.convert_ids_to_tokens([tok.vocab_size])
    with pytest.raises(LmforgeError, match="outside the vocabulary"):
        tok.decode([-1])


# ---------------------------------------------------------------------------------------------------- persistence
def test_save_and_load_round_trip(tok, tmp_path):
    tok.add_tokens(["<sep>"])
    out = tok.save_pretrained(tmp_path / "t")
    again = ByteLevelBPETokenizer.from_pretrained(out)
    assert again.vocab == tok.vocab and again.merges == tok.merges
    assert again.special_tokens == tok.special_tokens and again.eos_id == tok.eos_id and again.pad_id == tok.pad_id
    text = "a<sep>b " + HELD_OUT[30]
    assert again.encode_ids(text) == tok.encode_ids(text)
    assert (out / "merges.txt").read_text(encoding="utf-8").startswith("#version: 0.2\n")
    with pytest.raises(LmforgeError, match="already exists"):
        tok.save_pretrained(out)
    tok.save_pretrained(out, overwrite=True)


def test_saved_folder_loads_in_transformers(tok, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")
    new = tok.add_tokens(["<start>", "<delim>"])
    tok.save_pretrained(tmp_path)
    ref = transformers.GPT2TokenizerFast.from_pretrained(str(tmp_path))
    text = "<start>Tokyo 東京<delim>Zürich 123 <|endoftext|>"
    assert ref.encode(text) == tok.encode_ids(text) and ref.convert_tokens_to_ids(["<start>", "<delim>"]) == new
    assert ref.decode(ref.encode(text), skip_special_tokens=True) == tok.decode(tok.encode_ids(text))


def test_roles_from_hugging_face_config_files(bpe_dir, tmp_path):
    shutil.copytree(bpe_dir, tmp_path, dirs_exist_ok=True)
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    n = len(vocab)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": {"content": EOT, "lstrip": False}, "pad_token": "<pad>"}), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "model_max_length": 64, "pad_token": "<pad>",
        "added_tokens_decoder": {str(vocab[EOT]): {"content": EOT, "special": True},
                                 str(n): {"content": "<pad>", "special": True},
                                 str(n + 1): {"content": "<plain>", "special": False}}}), encoding="utf-8")
    tok = ByteLevelBPETokenizer.from_pretrained(tmp_path)
    assert tok.vocab_size == n + 2 and tok.pad_id == n and tok.eos_id == tok.bos_id == vocab[EOT]
    assert tok.model_max_length == 64
    ids = tok.encode_ids("x<plain>y<pad>")
    assert ids[1] == n + 1 and ids[-1] == n
    assert tok.decode(ids) == "x<plain>y"  # a non-special added token is kept whole and kept by decode


def test_no_endoftext_means_no_eos(tmp_path):
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tok = ByteLevelBPETokenizer.from_pretrained(tmp_path)
    assert tok.eos_id is tok.bos_id is tok.pad_id is None and tok.special_tokens == []
    assert tok.encode_ids("hi") == [vocab["h"], vocab["i"]]


# ---------------------------------------------------------------------------------------------------- bad files
@pytest.fixture()
def folder(bpe_dir, tmp_path) -> Path:
    shutil.copy(bpe_dir / "vocab.json", tmp_path / "vocab.json")
    shutil.copy(bpe_dir / "merges.txt", tmp_path / "merges.txt")
    return tmp_path


def _error(folder: Path) -> str:
    with pytest.raises(InputFileError) as info:
        ByteLevelBPETokenizer.from_pretrained(folder)
    return str(info.value)


def test_missing_files(folder):
    with pytest.raises(InputFileError, match="no such tokenizer folder"):
        ByteLevelBPETokenizer.from_pretrained(folder / "nope")
    (folder / "merges.txt").unlink()
    assert "merges.txt: not found" in _error(folder)
    (folder / "vocab.json").unlink()
    assert "vocab.json: not found" in _error(folder)


@pytest.mark.parametrize(("content", "expected"), [
    ('{"a": 0,\n "b": }', r"vocab.json:2: not valid JSON"),
    ('["a", "b"]', "vocab.json: not a JSON object"),
    ('{"a": "zero"}', "'a' has id 'zero'"),
    ('{"a": 0, "b": 0}', "share id 0"),
    ('{"a": 0, "b": 2}', "the integers 0..1"),
    ('{"a": 0, "b": 1}', "lacks 254 of the 256 byte tokens"),
    ("{}", "vocabulary is empty"),
])
def test_malformed_vocab_json(folder, content, expected):
    (folder / "vocab.json").write_text(content, encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    message = _error(folder)
    assert expected in message and "vocab.json" in message


def test_vocab_json_not_utf8(folder):
    (folder / "vocab.json").write_bytes(b'{"a":\n 0, "\xff": 1}')
    assert "vocab.json:2: not valid UTF-8" in _error(folder)


@pytest.mark.parametrize(("line", "expected"), [
    ("Ġ t h", "is not a merge"),
    ("Ġt", "is not a merge"),
    ("Ġ  t", "is not a merge"),
    ("Ġ ☃", "needs the token '☃'"),
])
def test_bad_merges_line_names_the_line(folder, line, expected):
    lines = (folder / "merges.txt").read_text(encoding="utf-8").split("\n")
    lines.insert(3, line)
    (folder / "merges.txt").write_text("\n".join(lines), encoding="utf-8")
    message = _error(folder)
    assert "merges.txt:4:" in message and expected in message


def test_merge_whose_result_is_not_a_token(folder):
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    left, right = next((a, b) for a in BYTE_TO_CHAR for b in BYTE_TO_CHAR if a + b not in vocab)
    with (folder / "merges.txt").open("a", encoding="utf-8") as f:
        f.write(f"{left} {right}\n")
    assert f"needs the token {left + right!r}" in _error(folder)


def test_bad_config_files(folder):
    (folder / "tokenizer_config.json").write_text('{"add_prefix_space": true}', encoding="utf-8")
    assert "add_prefix_space" in _error(folder)
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<nope>"}', encoding="utf-8")
    assert "eos_token='<nope>' is not in the vocabulary" in _error(folder)
    (folder / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"x": 1}}', encoding="utf-8")
    assert "tokenizer_config.json: added_tokens_decoder entry 'x'" in _error(folder)
    (folder / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"3": {"content": "<|endoftext|>"}}}',
                                                  encoding="utf-8")
    assert "but" in _error(folder) and "vocab.json gives it id" in _error(folder)
    (folder / "tokenizer_config.json").write_text("[1]", encoding="utf-8")
    assert "tokenizer_config.json: not a JSON object" in _error(folder)


# ---------------------------------------------------------------------------------------------------- load_pretrained
def _gpt2_folder(directory: Path, bpe_dir: Path, vocab_size: int) -> Path:
    transformers = pytest.importorskip("transformers", reason="transformers builds the Hugging Face folder")
    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=vocab_size, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(directory), safe_serialization=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(bpe_dir / name, directory / name)
    return directory


def test_load_pretrained_gives_the_byte_level_tokenizer(bpe_dir, tmp_path, tok):
    from lmforge.persistence import load_pretrained

    loaded = load_pretrained(_gpt2_folder(tmp_path, bpe_dir, tok.vocab_size))
    assert isinstance(loaded.tokenizer, ByteLevelBPETokenizer)
    assert loaded.tokenizer.encode_ids(HELD_OUT[20]) == tok.encode_ids(HELD_OUT[20])


def test_load_pretrained_refuses_more_tokens_than_embeddings(bpe_dir, tmp_path, tok):
    from lmforge.persistence import load_pretrained

    with pytest.raises(InputFileError, match=r"vocab.json: .* tokens, but the model's embeddings have 300 rows"):
        load_pretrained(_gpt2_folder(tmp_path, bpe_dir, 300))


def test_called_like_transformers_gpt2_tokenizer(tok, bpe_dir):
    # GPT-2's tokenizer adds no tokens: a pair is the two texts one after the other; padding with the pad id
    transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")
    torch = pytest.importorskip("torch")
    ref = transformers.GPT2TokenizerFast.from_pretrained(bpe_dir)
    ref.pad_token = ref.eos_token
    texts, pairs = ["Hello world, again.", "A much longer second text, with commas."], ["Yes.", "No, it is not."]
    assert tok(texts, pairs)["input_ids"] == ref(texts, pairs)["input_ids"]
    ours, theirs = tok(texts, padding=True, return_tensors="pt"), ref(texts, padding=True, return_tensors="pt")
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
    assert not tok.wraps_texts and tok.mask_id is None
    enc = tok("Hello world", return_offsets=True, return_word_ids=True)  # GPT-2's template adds nothing
    _, offsets, words = tok.encode_text("Hello world")
    assert enc["offsets"] == offsets and enc["word_ids"] == words


# ------------------------------------------------------------------------------- offsets and words (token tasks)
def test_offsets_and_word_ids_match_hugging_face_with_trimmed_offsets(tok, bpe_dir):
    """encode_text gives Hugging Face's ids, offsets (``trim_offsets``, RoBERTa's setting) and word ids."""
    trimmed = hf_tokenizers.ByteLevelBPETokenizer(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"),
                                                  trim_offsets=True)
    trimmed.add_special_tokens([EOT])
    for text in [*HELD_OUT, *TRAIN[:9], f"a {EOT} b", "Paris,  London!", *_random_texts(3, 40)]:
        ids, offsets, words = tok.encode_text(text)
        want = trimmed.encode(text)
        assert ids == want.ids and ids == tok.encode_ids(text), text
        assert offsets == [tuple(o) for o in want.offsets], text
        assert words == list(want.word_ids), text


def test_words_of_a_sentence_are_encoded_with_the_space_before_them(tok):
    from lmforge.data.token_features import split_words
    from lmforge.pipelines import word_spans

    pieces, kept = split_words(["Paris", "is", "big", "."], tok, max_length=64)
    assert pieces == [tok.encode_ids("Paris"), tok.encode_ids(" is"), tok.encode_ids(" big"), tok.encode_ids(" .")]
    assert kept == 4 and tok.words_need_spaces
    text = "Paris,  London!\nRome"
    assert [text[s:e] for s, e in word_spans(tok, text)] == ["Paris", ",", "London", "!", "Rome"]
