"""Generated ids as text (``lmforge.generation.text``): the prompt echoed as written, a continuing word piece joined
to the prompt's last word, punctuation without a space before it, byte-level BPE left exact; the text-generation
pipeline and fill-mask's filled sentence."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.generation.text import continuation_text, generated_text, tidy_spacing
from lmforge.pipelines import filled, pipeline
from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from lmforge.tokenizers.bytebpe import BYTE_TO_CHAR

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "shares", "rose", "sharp", "##ly", "##e", ".", ",", "he",
         "said", "don", "'", "t", "s", "the", "firm", "(", ")", "5", "%", "n"]


@pytest.fixture(scope="module")
def wp() -> WordPieceTokenizer:
    return WordPieceTokenizer(WORDS)


def _ids(tok: WordPieceTokenizer, *tokens: str) -> list[int]:
    return [tok.vocab[t] for t in tokens]


@pytest.mark.parametrize(("raw", "tidy"), [
    ("shares rose 5 % , he said .", "shares rose 5%, he said."),
    ("don ' t", "don't"),
    ("the firm ' s shares", "the firm's shares"),
    ("he said ( the firm ) rose", "he said (the firm) rose"),
    ("does n't", "doesn't"),
    ("the players ' union", "the players ' union"),  # not a contraction: left as it is
    ("$ 1 . 5bn and 2 , 000 jobs in 2004 , 15 firms", "$1.5bn and 2,000 jobs in 2004, 15 firms"),
    ("a three - year deal", "a three - year deal"),
])
def test_tidy_spacing(raw, tidy):
    assert tidy_spacing(raw) == tidy


def test_a_continuing_piece_joins_the_prompts_last_word(wp):
    prompt = [wp.sep_id, *wp.encode_ids("Shares rose sharp")]
    new = _ids(wp, "##ly", ".", "[SEP]")
    assert continuation_text(wp, prompt, new) == "ly ."
    assert generated_text(wp, "Shares rose sharp", prompt, new) == "Shares rose sharply."
    assert generated_text(wp, "Shares rose sharp", prompt, new, full_text=False) == "ly."
    assert generated_text(wp, "Shares rose sharp", prompt, new, tidy=False) == "Shares rose sharply ."


def test_a_new_word_starts_after_a_space_and_punctuation_attaches(wp):
    prompt = wp.encode_ids("Shares rose")
    new = _ids(wp, ",", "he", "said", ".")
    assert generated_text(wp, "Shares rose", prompt, new) == "Shares rose, he said."
    assert generated_text(wp, "Shares rose", prompt, new, full_text=False) == ", he said."
    new = _ids(wp, "sharp", "##ly")
    assert generated_text(wp, "Shares rose", prompt, new) == "Shares rose sharply"
    assert generated_text(wp, "Shares rose", prompt, new, full_text=False) == "sharply"
    assert generated_text(wp, "Shares rose ", prompt, new) == "Shares rose sharply"  # one space, not two


def test_an_encoder_decoder_target_is_its_own_text(wp):
    source = wp.encode_ids("the firm")
    target = _ids(wp, "shares", "rose", "sharp", "##ly", ".")
    for full_text in (True, False):
        assert generated_text(wp, "the firm", source, target, continues=False, full_text=full_text) == \
            "shares rose sharply."


def test_nothing_generated_gives_the_prompt_or_nothing(wp):
    prompt = wp.encode_ids("he said")
    assert generated_text(wp, "He said", prompt, []) == "He said"
    assert generated_text(wp, "He said", prompt, [], full_text=False) == ""


def _byte_bpe() -> ByteLevelBPETokenizer:
    chars = list(BYTE_TO_CHAR)
    extra = ["Ġs", "Ġsh", "ar", "Ġshar", "p", "ly"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*chars, *extra, "<|endoftext|>"]))}
    merges = [("Ġ", "s"), ("Ġs", "h"), ("a", "r"), ("Ġsh", "ar")]
    return ByteLevelBPETokenizer(vocab, merges)


def test_byte_level_bpe_decodes_exactly_and_is_not_tidied():
    tok = _byte_bpe()
    prompt = tok.encode_ids("Prices rose shar")
    new = tok.encode_ids("ply , he said .")  # spaces before punctuation are the text's own
    assert generated_text(tok, "Prices rose shar", prompt, new) == "Prices rose sharply , he said ."
    assert generated_text(tok, "Prices rose shar", prompt, new, full_text=False) == "ply , he said ."
    # bytes cut inside a character: the prompt's decoding is not a prefix, the continuation is decoded alone
    euro = tok.encode_ids("€")
    assert len(euro) == 3
    assert continuation_text(tok, tok.encode_ids("a") + euro[:1], euro[1:]) == tok.decode(euro[1:])


def test_filled_joins_a_word_piece_to_the_word_before_the_mask():
    assert filled("Shares [MASK] sharply.", "[MASK]", "rose") == "Shares rose sharply."
    assert filled("Shares rose sharp [MASK].", "[MASK]", "##ly") == "Shares rose sharply."
    assert filled("[MASK] [MASK]", "[MASK]", "he") == "he [MASK]"


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory, wp):
    from lmforge.config import ModelConfig
    from lmforge.models.decoder import Decoder
    from lmforge.persistence import save_pretrained

    torch.manual_seed(0)
    config = ModelConfig(arch="decoder", vocab_size=wp.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                         max_seq_len=32, norm_first=True, dropout=0.0, attention_dropout=0.0)
    path = tmp_path_factory.mktemp("gpt")
    save_pretrained(Decoder(config).eval(), path, tokenizer=wp)
    return path


def test_text_generation_pipeline_returns_the_prompt_and_its_continuation(gpt_dir, wp):
    from lmforge.generation import generate
    from lmforge.persistence import load_pretrained

    generator = pipeline("text-generation", gpt_dir, max_new_tokens=6)
    out = generator(["Shares rose", "he said"])
    loaded = load_pretrained(gpt_dir)
    for prompt, result in zip(["Shares rose", "he said"], out, strict=True):
        ids = [wp.sep_id, *wp.encode_ids(prompt)]
        seq = generate(loaded.model, torch.tensor([ids]), eos_id=wp.sep_id, max_new_tokens=6).sequences[0][0]
        assert result == [{"generated_text": generated_text(wp, prompt, ids, seq)}]
        assert result[0]["generated_text"].startswith(prompt)
    alone = generator("Shares rose", return_full_text=False)
    assert out[0][0]["generated_text"].endswith(alone[0]["generated_text"])
    beams = generator("he said", strategy="beam", num_beams=3, num_return_sequences=2)
    assert len(beams) == 2 and all(b["generated_text"].startswith("he said") for b in beams)


def test_text_generation_pipeline_refuses_bad_options(gpt_dir, tmp_path):
    with pytest.raises(LmforgeError, match="return_full_text must be True or False"):
        pipeline("text-generation", gpt_dir, return_full_text="yes")
    with pytest.raises(LmforgeError, match="temperature"):
        pipeline("text-generation", gpt_dir, temperature=0.7)  # greedy search does not sample
    from tests.toy_tasks import make_encoder_dir

    encoder = make_encoder_dir(tmp_path / "enc")
    with pytest.raises(LmforgeError, match="generation needs a GPT decoder"):
        pipeline("text-generation", encoder)
