from hypothesis import given
from hypothesis import strategies as st

from lmforge.tokenizers.basic import BasicTokenizer, is_punctuation, is_removed


def test_lowercase_strips_accents_and_splits_punctuation():
    bt = BasicTokenizer()
    assert bt.tokenize("Héllo, Wörld!") == ["hello", ",", "world", "!"]
    assert bt.tokenize("don't-stop") == ["don", "'", "t", "-", "stop"]


def test_cased_keeps_case_and_accents():
    bt = BasicTokenizer(lowercase=False)
    assert bt.tokenize("Héllo, Wörld") == ["Héllo", ",", "Wörld"]


def test_strip_accents_can_be_set_independently():
    assert BasicTokenizer(lowercase=True, strip_accents=False).tokenize("Héllo") == ["héllo"]
    assert BasicTokenizer(lowercase=False, strip_accents=True).tokenize("Héllo") == ["Hello"]


def test_cleaning_removes_controls_and_normalises_whitespace():
    bt = BasicTokenizer()
    # \x00, U+FFFD, zero-width space (Cf) and \x85 (Cc) are removed and glue their neighbours
    assert bt.tokenize("a\x00b c\ufffdd e\u200bf g\x85h") == ["ab", "cd", "ef", "gh"]
    # tab, newline, no-break space, line separator separate words
    assert bt.tokenize("a\tb\nc\u00a0d\u2028e") == ["a", "b", "c", "d", "e"]


def test_cjk_characters_become_words():
    bt = BasicTokenizer()
    assert bt.tokenize("ab中文cd") == ["ab", "中", "文", "cd"]
    assert BasicTokenizer(tokenize_chinese_chars=False).tokenize("ab中文cd") == ["ab中文cd"]


def test_normalisation_that_yields_punctuation_is_split():
    # U+1FEF GREEK VARIA decomposes to "`", an ASCII symbol: BERT splits after normalising.
    assert BasicTokenizer().tokenize("a\u1fefb") == ["a", "`", "b"]


def test_offsets_point_into_the_original_text():
    bt = BasicTokenizer()
    text = "  Café\u0301 au\x00lait, s'il vous plaît "
    for word, start, end in bt.tokenize_with_offsets(text):
        original = text[start:end]
        assert bt.normalize(original) == word, (word, original)


def test_punctuation_classes():
    assert all(is_punctuation(c) for c in "!$^`~¿«»—")
    assert not any(is_punctuation(c) for c in "aZ9 é中")
    assert is_removed("\x01") and is_removed("\u200b") and not is_removed("\t")


@given(st.text(max_size=60))
def test_offsets_cover_normalised_words(text):
    bt = BasicTokenizer()
    words = bt.tokenize_with_offsets(text)
    assert [w for w, _, _ in words] == bt.tokenize(text)
    previous_end = 0
    for word, start, end in words:
        assert word and previous_end <= start < end <= len(text)
        previous_end = end


def test_astral_cjk_and_punctuation_are_isolated():
    # U+20000 (CJK Extension B) and U+10100 (AEGEAN WORD SEPARATOR LINE, Po) lie outside the BMP
    bt = BasicTokenizer()
    assert bt.tokenize("ab\U00020000cd") == ["ab", "\U00020000", "cd"]
    assert bt.tokenize("ab\U00010100cd") == ["ab", "\U00010100", "cd"]
    assert [(s, e) for _, s, e in bt.tokenize_with_offsets("ab\U00020000cd")] == [(0, 2), (2, 3), (3, 5)]
