"""ONNX Runtime for GPT decoders (lmforge.persistence.onnx_decoder): the exported graph, its KV cache fed back as
inputs, gives eager's logits within 1e-4 on left-padded prompts (P = 0) and cached steps; greedy and beam search
through ``lmforge.generation`` give eager's tokens; ``generate``, ``serve`` and a fine-tuned GPT's ``predict`` run
with ``--runtime onnx``; bad folders fail with one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="ONNX Runtime is the lmforge[onnx] extra; `make test` installs it")
pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript (the lmforge[onnx] extra)")

from lmforge.cli import main  # noqa: E402
from lmforge.config import ModelConfig  # noqa: E402
from lmforge.errors import InputFileError, LmforgeError  # noqa: E402
from lmforge.generation import generate  # noqa: E402
from lmforge.models import Decoder  # noqa: E402
from lmforge.persistence import load_pretrained, save_pretrained  # noqa: E402
from lmforge.persistence.onnx_decoder import OnnxDecoder, OnnxDecoderCache  # noqa: E402
from lmforge.tokenizers import WordPieceTokenizer  # noqa: E402
from tests.toy_tasks import make_decoder_dir, vocab, write_task_data  # noqa: E402

TOL = 1e-4
PROMPTS = ["alice went to paris", "the", "bob met carol in rome today and later visited oslo"]


def _gpt_folder(path: Path, **overrides) -> Path:
    """A tiny GPT with large random weights (peaked next-token distributions: no near-ties for argmax)."""
    tokenizer = WordPieceTokenizer(vocab())
    config = ModelConfig(**{**dict(arch="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2,
                                   n_layers=2, d_ff=32, max_seq_len=40, norm_first=True, dropout=0.0,
                                   attention_dropout=0.0), **overrides})
    torch.manual_seed(0)
    model = Decoder(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not ("norm" in name and name.endswith("weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return save_pretrained(model.eval(), path, tokenizer=tokenizer)


def export(folder: Path, out: Path, *extra: str) -> Path:
    assert main(["-q", "convert", "--to-onnx", str(folder), "--out", str(out), *extra]) == 0
    return out


VARIANTS = {
    "learned": {},  # GPT-2's shape: pre-LN, learned positions, the LM head tied to the embeddings
    "rotary": {"positional": "rotary"},
    "gpt1": {"norm_first": False, "positional": "sinusoidal", "tie_embeddings": False},  # post-LN, own LM head
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(variant)`` -> the ONNX folder of a tiny GPT of that ``VARIANTS`` shape, exported once."""
    cache: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in cache:
            root = tmp_path_factory.mktemp(f"gpt-{variant}")
            cache[variant] = export(_gpt_folder(root / "gpt", **VARIANTS[variant]), root / "onnx")
        return cache[variant]

    return get


def _models(folder: Path) -> tuple[Decoder, OnnxDecoder]:
    eager = load_pretrained(folder, with_head=False).model.eval()
    onnx = load_pretrained(folder, with_head=False, runtime="onnx").model
    assert isinstance(eager, Decoder) and isinstance(onnx, OnnxDecoder)
    return eager, onnx


def _left_padded(vocab_size: int, seed: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(5, vocab_size, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
    return ids, mask


def _diff(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> float:
    return (a - b)[real].abs().max().item()


# ------------------------------------------------------------------------------------------------ parity
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_pass_and_cached_steps_match_eager(exported, variant):
    folder = exported(variant)
    eager, onnx = _models(folder)
    manifest = json.loads((folder / "onnx" / "manifest.json").read_text())
    entry = manifest["graphs"]["decoder"]
    assert entry["max_abs_diff_fp32"] <= TOL and set(entry["max_abs_diff_fp32_by_pass"]) == {"prompt", "cached_steps"}
    assert entry["outputs"][0] == "logits" and entry["inputs"][2:4] == ["past_key_0", "past_value_0"]
    V = eager.config.vocab_size
    ids, mask = _left_padded(V, 0, [9, 4, 1, 7])
    real = mask.bool()
    with torch.no_grad():
        full = eager(ids, attention_mask=mask, output_hidden_states=True)  # no cache: one pass
    alone = onnx(ids, attention_mask=mask, output_hidden_states=True)
    assert _diff(full.logits, alone.logits, real) <= TOL
    assert (full.pooled_output - alone.pooled_output).abs().max() <= TOL
    assert len(alone.hidden_states) == eager.config.n_layers + 1
    for x, y in zip(full.hidden_states, alone.hidden_states, strict=True):
        assert _diff(x, y, real) <= TOL
    # the prompt through the cache (P = 0), then steps of 1, 1 and 3 new tokens reading the cache
    a_cache, b_cache = eager.new_cache(), onnx.new_cache()
    assert isinstance(b_cache, OnnxDecoderCache) and b_cache.length == 0
    g = torch.Generator().manual_seed(1)
    new, new_real = ids, real
    for T in (None, 1, 1, 3):
        if T is not None:
            new = torch.randint(5, V, (4, T), generator=g)
            mask = torch.cat((mask, torch.ones(4, T, dtype=torch.long)), dim=1)
            new_real = torch.ones(4, T, dtype=torch.bool)
        with torch.no_grad():
            a = eager(new, attention_mask=mask, cache=a_cache)
        b = onnx(new, attention_mask=mask, cache=b_cache)
        assert b.cache is b_cache and b_cache.length == a_cache.length == mask.shape[1]
        assert _diff(a.logits, b.logits, new_real) <= TOL
        assert _diff(a.last_hidden_state, b.last_hidden_state, new_real) <= TOL
        assert (a.pooled_output - b.pooled_output).abs().max() <= TOL
    keys = mask.bool()[:, None, :, None].expand_as(a_cache.layers[0].self_attn.key)  # padding's are never read
    for layer, key in zip(a_cache.layers, b_cache.keys, strict=True):  # the presents are eager's keys
        assert _diff(layer.self_attn.key, torch.from_numpy(key), keys) <= TOL
    # last_only and return_logits=False, as generation asks for them
    step = torch.randint(5, V, (4, 1), generator=g)
    mask = torch.cat((mask, torch.ones(4, 1, dtype=torch.long)), dim=1)
    with torch.no_grad():
        a = eager(step, attention_mask=mask, cache=a_cache, last_only=True)
    b = onnx(step, attention_mask=mask, cache=b_cache, last_only=True)
    assert b.logits.shape == a.logits.shape == (4, 1, V) and (a.logits - b.logits).abs().max() <= TOL
    none = onnx(ids[:, :3], return_logits=False)
    assert none.logits is None and none.last_hidden_state.shape == (4, 3, eager.config.d_model)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_and_beam_search_give_eagers_tokens(exported, variant):
    eager, onnx = _models(exported(variant))
    ids, mask = _left_padded(eager.config.vocab_size, 2, [6, 2, 4])
    mask = mask.flip(1)  # right padding: generation re-packs it to the left
    ids = ids.flip(1)
    for options in (dict(strategy="greedy"), dict(strategy="beam", num_beams=3, num_return_sequences=2)):
        want = generate(eager, ids, mask, max_new_tokens=12, **options)
        got = generate(onnx, ids, mask, max_new_tokens=12, **options)
        assert got.sequences == want.sequences, options
        for s, t in zip(want.scores, got.scores, strict=True):
            assert s == pytest.approx(t, abs=TOL)
    assert generate(onnx, ids, mask, max_new_tokens=3, use_cache=False).sequences == \
        generate(eager, ids, mask, max_new_tokens=3).sequences


# ------------------------------------------------------------------------------------------------ commands
def test_convert_then_generate_and_serve_with_runtime_onnx(exported, tmp_path, capsys):
    import lmforge

    folder = exported("learned")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    outputs = {}
    for runtime in ("torch", "onnx"):
        capsys.readouterr()
        assert main(["-q", "generate", "--model", str(folder), "--input", str(prompts), "--strategy", "beam",
                     "--num-beams", "3", "--num-return-sequences", "2", "--max-new-tokens", "8", "--json",
                     "--runtime", runtime]) == 0
        outputs[runtime] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(outputs["onnx"]) == len(PROMPTS)
    assert [[g["text"] for g in row["generations"]] for row in outputs["torch"]] == \
        [[g["text"] for g in row["generations"]] for row in outputs["onnx"]]
    want = lmforge.pipeline("text-generation", model=folder, max_new_tokens=6)(PROMPTS)
    assert lmforge.pipeline("text-generation", model=folder, max_new_tokens=6, runtime="onnx")(PROMPTS) == want

    httpx = pytest.importorskip("httpx", reason="httpx (a dev dependency) is not installed")
    from lmforge.serve import create_app
    from tests.serve import server_thread

    app = create_app(folder, runtime="onnx", max_wait_ms=5)
    assert isinstance(app.state.model.model, OnnxDecoder) and app.state.model.endpoints == ["/generate"]
    with server_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/generate", json={"texts": PROMPTS, "max_new_tokens": 6})
    assert r.status_code == 200, r.text
    assert [res["texts"][0] for res in r.json()["results"]] == [w[0]["generated_text"] for w in want]


def test_a_fine_tuned_gpt_exports_without_logits_and_predicts_as_eager(tmp_path, capsys):
    gpt = make_decoder_dir(tmp_path / "gpt")
    train, dev = write_task_data(tmp_path, "sequence", n_train=16, n_dev=8)
    run = tmp_path / "run"
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(gpt), "--train", str(train), "--dev",
                 str(dev), "--out", str(run), "--epochs", "1", "--batch-size", "8", "--max-length", "32",
                 "--seed", "0"]) == 0, capsys.readouterr().err
    folder = export(run, tmp_path / "onnx")
    entry = json.loads((folder / "onnx" / "manifest.json").read_text())["graphs"]["decoder"]
    assert "logits" not in entry["outputs"] and entry["max_abs_diff_fp32"] <= TOL
    assert "no logits" in capsys.readouterr().err  # the note of convert
    rows = {}
    for runtime in ("torch", "onnx"):
        out = tmp_path / f"{runtime}.jsonl"
        assert main(["-q", "predict", "--model", str(folder), "--input", str(dev), "--runtime", runtime,
                     "--out", str(out)]) == 0
        rows[runtime] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in rows["torch"]] == [r["label"] for r in rows["onnx"]]
    for a, b in zip(rows["torch"], rows["onnx"], strict=True):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=TOL)
    loaded = load_pretrained(folder, runtime="onnx")
    assert isinstance(loaded.model.backbone, OnnxDecoder)
    backbone = load_pretrained(folder, with_head=False, runtime="onnx").model
    with pytest.raises(LmforgeError, match="has no logits"):
        generate(backbone, torch.tensor([[5, 6, 7]]), max_new_tokens=2)
    with pytest.raises(LmforgeError, match="has no logits"):
        backbone(torch.tensor([[5, 6, 7]]))


def test_fewshot_with_runtime_onnx_scores_as_eager(exported, tmp_path, capsys):
    """``fewshot --runtime onnx``: the candidates' scores come from the graph's logits (the vocabulary projection is
    inside it), equal to eager's within the parity tolerance, in classify (with demonstrations and calibration) and
    generate mode."""
    folder = exported("learned")
    texts = ["alice lives in paris", "bob met carol", "rome is the capital", "erin saw oslo", "dave went north"]
    for name, rows in (("train.csv", texts[:3]), ("test.csv", texts[2:] + texts[:2])):
        (tmp_path / name).write_text("text,label\n" + "".join(f"{t},{'same' if i % 2 else 'different'}\n"
                                                             for i, t in enumerate(rows)), encoding="utf-8")
    saved = {}
    for runtime in ("torch", "onnx"):
        for mode in ("classify", "generate"):
            out = tmp_path / f"{runtime}-{mode}"
            assert main(["-q", "fewshot", "--model", str(folder), "--train", str(tmp_path / "train.csv"), "--test",
                         str(tmp_path / "test.csv"), "--shots", "0,2", "--draws", "2", "--template",
                         "{text} is {label}", "--mode", mode, "--max-new-tokens", "3", "--runtime", runtime,
                         "--out", str(out), *(["--calibrate"] if mode == "classify" else [])]) == 0, \
                capsys.readouterr().err
            saved[runtime, mode] = json.loads((out / "fewshot.json").read_text(encoding="utf-8"))
    for mode in ("classify", "generate"):
        want, got = saved["torch", mode]["predictions"], saved["onnx", mode]["predictions"]
        assert sorted(want) == sorted(got) == ["0", "2"]
        for shots in want:
            assert [p["prediction"] for p in got[shots]] == [p["prediction"] for p in want[shots]]
            for a, b in zip(want[shots], got[shots], strict=True):
                for key in set(a) & {"scores", "probabilities"}:
                    assert b[key] == pytest.approx(a[key], abs=TOL), (mode, shots, key)


def test_int8_decoder_graph_is_smaller_and_generates(exported, tmp_path):
    folder = exported("learned")
    q = export(folder, tmp_path / "int8", "--quantize", "int8")
    entry = json.loads((q / "onnx" / "manifest.json").read_text())["graphs"]["decoder"]
    assert entry["precision"] == "int8"
    assert (q / "onnx" / "decoder.onnx").stat().st_size < (folder / "onnx" / "decoder.onnx").stat().st_size
    model = load_pretrained(q, with_head=False, runtime="onnx").model
    out = generate(model, torch.tensor([[5, 6, 7, 8]]), max_new_tokens=4)
    assert len(out.sequences[0][0]) == 4


# ------------------------------------------------------------------------------------------------ refusals
def test_what_the_graph_cannot_do_is_refused_with_one_line(exported):
    _, onnx = _models(exported("rotary"))
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(LmforgeError, match="attention weights"):
        onnx(ids, output_attentions=True)
    with pytest.raises(LmforgeError, match="position_ids"):
        onnx(ids, position_ids=torch.arange(3))
    with pytest.raises(LmforgeError, match="OnnxDecoderCache"):
        onnx(ids, cache=load_pretrained(exported("rotary"), with_head=False).model.new_cache())
    with pytest.raises(LmforgeError, match="vocab"):
        onnx(torch.tensor([[5, onnx.config.vocab_size]]))
    with pytest.raises(LmforgeError, match="max_seq_len"):
        onnx(torch.full((1, onnx.config.max_seq_len + 1), 5))
    cache = onnx.new_cache()
    onnx(ids, cache=cache)
    with pytest.raises(LmforgeError, match="reorder the cache"):
        onnx(torch.tensor([[5], [6]]), cache=cache)
    with pytest.raises(LmforgeError, match=r"cached \+ new = 3 \+ 1 = 4"):
        onnx(torch.tensor([[5]]), attention_mask=torch.ones(1, 3), cache=cache)
    cache.reorder(torch.tensor([0, 0]))
    assert cache.batch_size == 2 and onnx(torch.tensor([[5], [6]]), cache=cache).logits.shape[:2] == (2, 1)
    with pytest.raises(LmforgeError, match="lm_logits|vocabulary projection"):
        onnx.lm_logits(torch.zeros(1, onnx.config.d_model))


def test_bad_folders_fail_with_one_line(exported, tmp_path, capsys):
    folder = exported("learned")
    plain = _gpt_folder(tmp_path / "plain")
    assert main(["-q", "generate", "--model", str(plain), "--prompt", "the", "--runtime", "onnx"]) != 0
    err = capsys.readouterr().err
    assert "no ONNX graph" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def broken(name: str, manifest: dict | str | None = None, drop_graph: bool = False) -> Path:
        target = tmp_path / name
        shutil.copytree(folder, target)
        path = target / "onnx" / "manifest.json"
        if isinstance(manifest, str):
            path.write_text(manifest)
        elif manifest is not None:
            path.write_text(json.dumps(manifest))
        if drop_graph:
            (target / "onnx" / "decoder.onnx").unlink()
        return target

    good = json.loads((folder / "onnx" / "manifest.json").read_text())
    entry = good["graphs"]["decoder"]
    fewer = {**entry, "inputs": entry["inputs"][:4], "outputs": [n for n in entry["outputs"] if not n.endswith("1")]}
    cases = [
        (broken("other", {"format": "other"}), "not an lmforge ONNX manifest"),
        (broken("json", "{not json"), "not readable JSON"),
        (broken("encoder", {**good, "graphs": {"encoder": entry}}), "no decoder graph"),
        (broken("missing", drop_graph=True), "decoder.onnx: missing"),
        (broken("layers", {**good, "graphs": {"decoder": fewer}}), "belongs to another model"),
    ]
    for bad, message in cases:
        with pytest.raises(InputFileError, match=message):
            load_pretrained(bad, with_head=False, runtime="onnx")
        assert main(["-q", "generate", "--model", str(bad), "--prompt", "the", "--runtime", "onnx"]) != 0
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
