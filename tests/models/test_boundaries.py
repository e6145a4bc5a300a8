"""What every model family does with bad input at its boundary: the same checks (``lmforge.nn.inputs``,
``lmforge.nn.masks.key_padding_mask``), the same words, the stricter behaviour where the families had drifted:

- an empty batch (no rows) or an empty sequence (no tokens) is a clear ``LmforgeError`` in every family;
- a bool is never a layer index: ``output_attentions=[True]`` is refused everywhere (by the families that select
  layers because True is not an index, by the others because they have no per-layer selection);
- the decoder caches are one implementation (``lmforge.nn.StackCache``) under each family's own name.

Parametrised over the architecture registry, so a new family is covered by its record.
"""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import ARCHITECTURES, architecture, architectures_with
from lmforge.models.decoder import Decoder, DecoderCache
from lmforge.models.seq2seq import EncoderDecoder, Seq2SeqCache
from lmforge.nn import StackCache

B, T, V, D = 2, 5, 99, 12
NAMES = list(ARCHITECTURES)
# The families whose forward takes layer indices in output_attentions (the others take True/False only).
SELECTS_LAYERS = {"encoder", "decoder", "seq2seq_encoder"}


def tiny(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    values = dict(arch=name, vocab_size=V, d_model=D, n_heads=3, n_layers=2, d_ff=19, max_seq_len=16, dropout=0.0,
                  attention_dropout=0.0, kernel="math")
    return ARCHITECTURES[name](ModelConfig(**{**values, **overrides})).eval()


def ids(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, V, shape, generator=torch.Generator().manual_seed(seed))


def run(model: torch.nn.Module, source: object, target: torch.Tensor | None = None, **kwargs):
    """A forward pass: encoder-decoders also get a target (teacher forcing), by default B short full rows."""
    if architecture(model.config.arch).has_encoder_decoder:
        return model(source, ids(B, 3, seed=2) if target is None else target, **kwargs)
    return model(source, **kwargs)


def source_name(name: str) -> str:
    return "src_ids" if architecture(name).has_encoder_decoder else "input_ids"


# ---------------------------------------------------------------------------------------------- empty inputs
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(0, T), (B, 0), (0, 0)], ids=["no rows", "no tokens", "nothing"])
def test_an_empty_batch_is_a_clear_error_in_every_family(name: str, shape: tuple[int, int]) -> None:
    model = tiny(name)
    with torch.no_grad(), pytest.raises(LmforgeError, match=rf"{source_name(name)} is empty \(batch size "
                                                            rf"{shape[0]}, length {shape[1]}\)"):
        run(model, torch.zeros(shape, dtype=torch.long))


@pytest.mark.parametrize("name", [n for n in NAMES if architecture(n).has_encoder_decoder])
def test_an_empty_target_or_source_is_refused_by_encoder_decoders(name: str) -> None:
    model = tiny(name)
    with torch.no_grad():
        with pytest.raises(LmforgeError, match=r"tgt_ids is empty \(batch size 2, length 0\)"):
            model(ids(B, T), torch.zeros(B, 0, dtype=torch.long))
        with pytest.raises(LmforgeError, match=r"src_ids is empty \(batch size 0, length 5\)"):
            model.encode(torch.zeros(0, T, dtype=torch.long))


def test_the_encoder_decoder_refuses_an_empty_target_batch_when_decoding() -> None:
    model = tiny("seq2seq")
    memory = model.encode(ids(B, T))
    with torch.no_grad(), pytest.raises(LmforgeError, match=r"tgt_ids is empty \(batch size 0, length 1\)"):
        model.decode(torch.zeros(0, 1, dtype=torch.long), memory[:0])


# ---------------------------------------------------------------------------------------------- layer selection
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("selection", [[True], [0, False], (False,)], ids=["[True]", "[0, False]", "(False,)"])
def test_a_bool_is_never_a_layer_index(name: str, selection: list) -> None:
    model = tiny(name)
    pattern = "layer index" if name in SELECTS_LAYERS else "True or False"
    with torch.no_grad(), pytest.raises(LmforgeError, match=rf"output_attentions.*{pattern}"):
        run(model, ids(B, T), output_attentions=selection)


@pytest.mark.parametrize("name", architectures_with("returns_attention"))  # the others: test_architectures.py
def test_true_still_means_every_layer_and_false_none(name: str) -> None:
    model = tiny(name)
    with torch.no_grad():
        on = run(model, ids(B, T), output_attentions=True)
        off = run(model, ids(B, T), output_attentions=False)
    found = [getattr(on, field, None) for field in ("attentions", "self_attentions")]
    # One tensor (RNNSeq2Seq: (B, T, S)) or one entry per layer.
    weights_on = [w for f in found if f is not None for w in ((f,) if isinstance(f, torch.Tensor) else f)]
    assert weights_on and all(w is not None for w in weights_on)
    for field in ("attentions", "self_attentions", "cross_attentions"):
        assert getattr(off, field, None) is None


@pytest.mark.parametrize("name", sorted(SELECTS_LAYERS))
def test_layer_indices_select_layers_and_the_words_are_shared(name: str) -> None:
    model = tiny(name)
    with torch.no_grad():
        out = model(ids(B, T), output_attentions=[-1])
        assert out.attentions[0] is None and out.attentions[1] is not None
        with pytest.raises(LmforgeError, match=r"output_attentions: layer index 2 does not exist in a 2-layer "
                                               r"model \(valid indices are 0 \.\. 1, or -2 \.\. -1 from the end\)"):
            model(ids(B, T), output_attentions=[2])
        with pytest.raises(LmforgeError, match="output_attentions must be True, False or a sequence"):
            model(ids(B, T), output_attentions=1)


# ---------------------------------------------------------------------------------------------- same words
@pytest.mark.parametrize("name", NAMES)
def test_every_family_words_bad_ids_the_same_way(name: str) -> None:
    model = tiny(name)
    arg = source_name(name)
    bad = ids(B, T)
    bad[1, 2] = V
    with torch.no_grad():
        with pytest.raises(LmforgeError, match=rf"^{arg}: token id {V} at \(batch 1, position 2\) is outside the "
                                               rf"vocabulary of size {V} \(valid ids are 0 \.\. {V - 1}\)$"):
            run(model, bad)
        with pytest.raises(LmforgeError, match=rf"^{arg} must hold integer token ids .*torch.float32$"):
            run(model, ids(B, T).float())
        with pytest.raises(LmforgeError, match=rf"^{arg} must be a \(batch, length\) tensor of token ids; got "
                                               rf"shape \({T},\) \(add a batch dimension: {arg}.unsqueeze\(0\)\)$"):
            run(model, ids(T))
        with pytest.raises(LmforgeError, match=rf"^{arg} must be a torch tensor of integer token ids; got list$"):
            run(model, ids(B, T).tolist())


@pytest.mark.parametrize("name", NAMES)
def test_every_family_refuses_a_bad_padding_mask_the_same_way(name: str) -> None:
    model = tiny(name)
    mask_arg = "src_mask" if architecture(name).has_encoder_decoder else "attention_mask"
    with torch.no_grad():
        with pytest.raises(LmforgeError, match=rf"^{mask_arg} must be \(batch=2, .*\) with 1 = real token, 0 = "
                                               r"padding; got shape \(2, 4\)$"):
            run(model, ids(B, T), **{mask_arg: torch.ones(B, T - 1)})
        with pytest.raises(LmforgeError, match="values other than 0 and 1"):
            run(model, ids(B, T), **{mask_arg: torch.zeros(B, T).index_fill_(1, torch.tensor([4]), -1e4)})
        with pytest.raises(LmforgeError, match=rf"^{mask_arg} must be bool, integer or float"):
            run(model, ids(B, T), **{mask_arg: torch.ones(B, T, dtype=torch.complex64)})


# ---------------------------------------------------------------------------------------------- the caches
def test_both_decoder_caches_are_the_one_stack_cache_under_their_own_names() -> None:
    assert issubclass(DecoderCache, StackCache) and issubclass(Seq2SeqCache, StackCache)
    decoder, seq2seq = tiny("decoder"), tiny("seq2seq")
    assert type(decoder.new_cache()) is DecoderCache and type(seq2seq.new_cache()) is Seq2SeqCache
    assert repr(DecoderCache(2)) == "DecoderCache(layers=2, length=0)"
    assert repr(Seq2SeqCache()) == "Seq2SeqCache(layers=0, length=0)"


def test_a_cache_of_another_family_is_refused() -> None:
    decoder, seq2seq = tiny("decoder"), tiny("seq2seq")
    assert isinstance(decoder, Decoder) and isinstance(seq2seq, EncoderDecoder)
    with torch.no_grad():
        with pytest.raises(LmforgeError, match="cache must be a DecoderCache"):
            decoder(ids(B, T), cache=seq2seq.new_cache())
        with pytest.raises(LmforgeError, match="cache must be a Seq2SeqCache"):
            seq2seq.decode(ids(B, 1), seq2seq.encode(ids(B, T)), cache=decoder.new_cache())


def test_cache_length_batch_and_reorder_agree_across_the_two_families() -> None:
    decoder, seq2seq = tiny("decoder"), tiny("seq2seq")
    dec_cache, s2s_cache = DecoderCache(), Seq2SeqCache()
    with torch.no_grad():
        decoder(ids(3, 4), cache=dec_cache)
        seq2seq.decode(ids(3, 4), seq2seq.encode(ids(3, T)), cache=s2s_cache)
    for cache in (dec_cache, s2s_cache):
        assert len(cache.layers) == 2 and cache.length == 4 and cache.batch_size == 3
        before = [layer.self_attn.key.clone() for layer in cache.layers]
        cache.reorder(torch.tensor([2, 2]))
        assert cache.batch_size == 2 and cache.length == 4
        for layer, key in zip(cache.layers, before, strict=True):
            torch.testing.assert_close(layer.self_attn.key, key[[2, 2]], rtol=0, atol=0)
    assert s2s_cache.layers[0].cross_attn.key.shape[0] == 2  # cross-attention keys follow the reorder too
    with torch.no_grad():
        with pytest.raises(LmforgeError, match="cache holds batch size 2 but input_ids has 3 rows"):
            decoder(ids(3, 1), cache=dec_cache)
        with pytest.raises(LmforgeError, match=r"tgt_ids has 3 rows; .*cache.reorder\(index\)\) and the memory"):
            seq2seq.decode(ids(3, 1), seq2seq.encode(ids(3, T)), cache=s2s_cache)
