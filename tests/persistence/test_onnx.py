"""ONNX Runtime for encoders (lmforge.persistence.onnx): every task head on an exported encoder gives eager's
outputs within 1e-4, every encoder variant exports, and the commands run a folder with ``--runtime onnx``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="ONNX Runtime is the lmforge[onnx] extra; `make test` installs it")
pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript (the lmforge[onnx] extra)")

from lmforge.cli import main  # noqa: E402
from lmforge.errors import LmforgeError  # noqa: E402
from lmforge.persistence import load_pretrained  # noqa: E402
from lmforge.persistence.onnx import OnnxEncoder, require_onnxruntime  # noqa: E402
from lmforge.recipes.finetune import featurize, load_task_model  # noqa: E402
from lmforge.tasks.base import run_model  # noqa: E402
from tests.toy_tasks import make_encoder_dir  # noqa: E402

TOL = 1e-4


def export(folder: Path, out: Path, *extra: str) -> Path:
    assert main(["-q", "convert", "--to-onnx", str(folder), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def exported(finetuned, tmp_path_factory):
    """``exported(task)`` -> (ONNX folder, train file, dev file), exported once per module."""
    cache: dict[str, tuple[Path, Path, Path]] = {}

    def get(task: str) -> tuple[Path, Path, Path]:
        if task not in cache:
            run, train, dev = finetuned(task)
            cache[task] = (export(run, tmp_path_factory.mktemp(f"onnx-{task}") / "model"), train, dev)
        return cache[task]

    return get


def tensors_of(out) -> dict[str, torch.Tensor]:
    fields = out._asdict() if hasattr(out, "_asdict") else vars(out)
    return {k: v for k, v in fields.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("task", ["sequence", "pair", "token", "span", "qa", "choice"])
def test_every_task_head_on_the_onnx_encoder_equals_eager(exported, task):
    folder, _, dev = exported(task)
    eager, task_obj, tokenizer = load_task_model(str(folder))
    onnx, _, _ = load_task_model(str(folder), "onnx")
    assert isinstance(onnx.backbone, OnnxEncoder) and not isinstance(eager.backbone, OnnxEncoder)
    examples = task_obj.read(str(dev), labelled=True)
    features = featurize(task_obj, examples, tokenizer, str(dev), training=False)

    def collate(fs):
        return task_obj.collate(fs, tokenizer.pad_id)

    compared = 0
    for (chunk_a, a), (chunk_b, b) in zip(run_model(eager, features, collate, 5, drop=("labels",)),
                                          run_model(onnx, features, collate, 5, drop=("labels",)), strict=True):
        assert chunk_a == chunk_b
        real = collate([features[i] for i in chunk_a])["attention_mask"].bool()  # (B, T)
        ta, tb = tensors_of(a), tensors_of(b)
        assert ta.keys() == tb.keys() and ta
        for name, value in ta.items():
            other = tb[name]
            if value.shape[:2] == real.shape:  # per-token outputs: padded positions are not outputs of the model
                value, other = value[real], other[real]  # (eager unpads only some batches; the graph always)
            if value.is_floating_point():
                finite = torch.isfinite(value)  # masked logits are -inf on both sides
                assert torch.equal(finite, torch.isfinite(other)), name
                assert (value[finite] - other[finite]).abs().max().item() <= TOL, name
            else:
                assert torch.equal(value, other), name
            compared += 1
    assert compared > 0
    # and the decoded predictions are the same
    want = task_obj.predict(eager, examples, features, tokenizer, batch_size=4)
    got = task_obj.predict(onnx, examples, features, tokenizer, batch_size=4)
    assert len(want) == len(got) == len(examples)
    if task in ("sequence", "pair"):
        assert [p["label"] for p in want] == [p["label"] for p in got]


@pytest.mark.parametrize("task", ["sequence", "pair", "token"])
def test_a_classifier_exports_whole_for_onnx_runtime_alone(exported, task):
    """``onnx/model.onnx``: a sequence or pair classifier with its head, run by a bare ONNX Runtime session (no
    lmforge at run time), gives eager's logits within 1e-4, its columns in the manifest's label order; other heads
    export the encoder alone."""
    folder, _, dev = exported(task)
    manifest = json.loads((folder / "onnx" / "manifest.json").read_text())
    if task == "token":
        assert set(manifest["graphs"]) == {"encoder"} and not (folder / "onnx" / "model.onnx").exists()
        return
    entry = manifest["graphs"]["task"]
    assert entry["file"] == "model.onnx" and entry["outputs"] == ["logits"] and entry["max_abs_diff_fp32"] <= TOL
    eager, task_obj, tokenizer = load_task_model(str(folder))
    assert entry["labels"] == list(eager.head.labels)
    examples = task_obj.read(str(dev), labelled=True)
    features = featurize(task_obj, examples, tokenizer, str(dev), training=False)
    batch = task_obj.collate(features[:7], tokenizer.pad_id)
    ort = require_onnxruntime()
    session = ort.InferenceSession(str(folder / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {name: batch[name].numpy() for name in entry["inputs"]}
    (got,) = session.run(["logits"], feeds)
    with torch.no_grad():
        want = eager(**{name: batch[name] for name in entry["inputs"]}).logits
    assert got.shape == tuple(want.shape) and (torch.from_numpy(got) - want).abs().max().item() <= TOL


@pytest.mark.parametrize("overrides", [
    {},                                                             # BERT (post-LN, learned positions)
    {"embedding_size": 16, "share_layers": "all"},                 # ALBERT
    {"type_vocab_size": 0, "pooler": False},                        # DistilBERT
    {"norm_first": True, "positional": "rotary"},                   # the small-budget shape
    {"positional": "sinusoidal", "activation": "gelu_tanh"},
], ids=["bert", "albert", "distilbert", "pre-ln-rotary", "sinusoidal"])
def test_encoder_variants_export_and_match_eager(tmp_path, overrides):
    folder = make_encoder_dir(tmp_path / "enc", **overrides)
    onnx_dir = export(folder, tmp_path / "onnx")
    eager = load_pretrained(onnx_dir, with_head=False).model.eval()
    onnx = load_pretrained(onnx_dir, with_head=False, runtime="onnx").model
    g = torch.Generator().manual_seed(3)
    for B, T in ((1, 1), (4, 37), (2, 64)):  # lengths unlike the traced example's, the window's end included
        ids = torch.randint(5, eager.config.vocab_size, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, max(1, T - 3):] = 0
        with torch.no_grad():
            a = eager(ids, attention_mask=mask, output_hidden_states=True)
        b = onnx(ids, attention_mask=mask, output_hidden_states=True)
        real = mask.bool()
        assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max() <= TOL
        assert (a.pooled_output - b.pooled_output).abs().max() <= TOL
        assert len(a.hidden_states) == len(b.hidden_states) == eager.config.n_layers + 1
        for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
            assert (x - y)[real].abs().max() <= TOL
    manifest = json.loads((onnx_dir / "onnx" / "manifest.json").read_text())
    assert manifest["graphs"]["encoder"]["max_abs_diff_fp32"] <= TOL


def test_the_onnx_encoder_keeps_the_input_checks(exported):
    folder, _, _ = exported("sequence")
    model = load_pretrained(folder, with_head=False, runtime="onnx").model
    V, window = model.config.vocab_size, model.config.max_seq_len
    with pytest.raises(LmforgeError, match="vocab"):
        model(torch.tensor([[1, V]]))
    with pytest.raises(LmforgeError, match="max_seq_len"):
        model(torch.ones(1, window + 1, dtype=torch.long))
    with pytest.raises(LmforgeError, match="attention weights"):
        model(torch.ones(1, 3, dtype=torch.long), output_attentions=True)


def test_commands_with_runtime_onnx_equal_torch(exported, tmp_path):
    folder, _, dev = exported("sequence")
    metrics = {}
    for runtime in ("torch", "onnx"):
        out = tmp_path / f"{runtime}.json"
        assert main(["-q", "evaluate", "--model", str(folder), "--test", str(dev), "--runtime", runtime,
                     "--out", str(out)]) == 0
        metrics[runtime] = json.loads(out.read_text())
        assert main(["-q", "predict", "--model", str(folder), "--input", str(dev), "--runtime", runtime,
                     "--out", str(tmp_path / f"{runtime}.jsonl")]) == 0
        assert main(["-q", "embed", "--model", str(folder), "--input", str(dev), "--runtime", runtime,
                     "--layers", "-2,-1", "--out", str(tmp_path / f"{runtime}.npy")]) == 0
    assert metrics["torch"] == metrics["onnx"]
    rows = [[json.loads(line) for line in (tmp_path / f"{r}.jsonl").read_text().splitlines()]
            for r in ("torch", "onnx")]
    assert [r["label"] for r in rows[0]] == [r["label"] for r in rows[1]]
    import numpy as np

    a, b = np.load(tmp_path / "torch.npy"), np.load(tmp_path / "onnx.npy")
    assert a.shape == b.shape and np.abs(a - b).max() <= TOL


def test_pipelines_and_serve_take_the_runtime(exported):
    import lmforge
    from lmforge.serve import create_app

    folder, _, _ = exported("token")
    texts = ["alice went to paris today", "bob met carol"]
    want = lmforge.pipeline("token-classification", model=folder)(texts)
    got = lmforge.pipeline("token-classification", model=folder, runtime="onnx")(texts)
    assert [[(e["entity_group"], e["start"], e["end"]) for e in row] for row in want] == \
        [[(e["entity_group"], e["start"], e["end"]) for e in row] for row in got]
    app = create_app(folder, runtime="onnx")
    assert isinstance(app.state.model.backbone, OnnxEncoder)
    with pytest.raises(LmforgeError, match="exclude each other"):
        create_app(folder, runtime="onnx", compile=True)


def test_int8_quantisation_writes_a_smaller_graph_that_runs(exported, tmp_path):
    folder, _, dev = exported("sequence")
    q = export(folder, tmp_path / "int8", "--quantize", "int8")
    manifest = json.loads((q / "onnx" / "manifest.json").read_text())
    assert manifest["graphs"]["encoder"]["precision"] == manifest["graphs"]["task"]["precision"] == "int8"
    assert (q / "onnx" / "model.onnx").stat().st_size < (folder / "onnx" / "model.onnx").stat().st_size
    assert (q / "onnx" / "encoder.onnx").stat().st_size < (folder / "onnx" / "encoder.onnx").stat().st_size
    fp32 = load_pretrained(folder, with_head=False, runtime="onnx").model
    int8 = load_pretrained(q, with_head=False, runtime="onnx").model
    ids = torch.randint(5, fp32.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    a, b = fp32(ids).last_hidden_state, int8(ids).last_hidden_state
    assert torch.isfinite(b).all() and not torch.equal(a, b)  # quantised, and still the same function roughly:
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.9


def test_bad_requests_fail_with_one_line(exported, tmp_path, capsys, monkeypatch):
    folder, _, dev = exported("sequence")
    run = folder.parent.parent  # not an ONNX folder: the fine-tuned run's parent has no manifest
    plain = make_encoder_dir(tmp_path / "plain")
    cases = [
        (["predict", "--model", str(plain), "--input", str(dev), "--out", str(tmp_path / "x.jsonl"), "--runtime",
          "onnx"], "no ONNX graph"),
        (["evaluate", "--model", str(folder), "--test", str(dev), "--runtime", "onnx", "--compile"],
         "exclude each other"),
        (["convert", "--from-hf", str(plain), "--out", str(tmp_path / "q"), "--quantize", "int8"],
         "--quantize is an option of --to-onnx"),
        (["convert", "--to-onnx", str(folder), "--out", str(tmp_path / "x"), "--hf-layout", "bert"],
         "--hf-layout chooses"),
    ]
    for argv, message in cases:
        assert main(["-q", *argv]) != 0, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    assert run.exists()
    (tmp_path / "broken").mkdir()
    for item in folder.iterdir():
        if item.is_file():
            (tmp_path / "broken" / item.name).write_bytes(item.read_bytes())
    (tmp_path / "broken" / "onnx").mkdir()
    (tmp_path / "broken" / "onnx" / "manifest.json").write_text("{\"format\": \"other\"}")
    with pytest.raises(LmforgeError, match="not an lmforge ONNX manifest"):
        load_pretrained(tmp_path / "broken", runtime="onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if the extra were not installed
    with pytest.raises(LmforgeError, match=r"lmforge\[onnx\]"):
        require_onnxruntime()


def test_an_unsupported_model_is_refused_before_writing(tmp_path, capsys):
    from lmforge.config import ModelConfig
    from lmforge.models import architecture
    from lmforge.persistence import save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer
    from tests.toy_tasks import vocab

    tokenizer = WordPieceTokenizer(vocab())
    config = ModelConfig(arch="xlnet", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    folder = save_pretrained(architecture("xlnet").load()(config), tmp_path / "xlnet", tokenizer=tokenizer)
    assert main(["-q", "convert", "--to-onnx", str(folder), "--out", str(tmp_path / "out")]) != 0
    assert "exports Transformer encoders" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_fill_mask_on_the_onnx_encoder_equals_eager(tmp_path):
    import lmforge
    from lmforge.heads import TaskModel, build_head
    from lmforge.persistence import load_backbone, save_pretrained

    loaded = load_backbone(make_encoder_dir(tmp_path / "enc"))
    torch.manual_seed(0)
    model = TaskModel(loaded.model, build_head({"type": "mlm"}, loaded.config, loaded.model))  # tied un-embedding
    folder = export(save_pretrained(model, tmp_path / "mlm", tokenizer=loaded.tokenizer), tmp_path / "mlm-onnx")
    texts = ["alice went to [MASK] today", "bob [MASK] carol"]
    want = lmforge.pipeline("fill-mask", model=folder)(texts)
    got = lmforge.pipeline("fill-mask", model=folder, runtime="onnx")(texts)
    for a, b in zip(want, got, strict=True):
        assert [x["token_id"] for x in a] == [x["token_id"] for x in b]
        assert max(abs(x["score"] - y["score"]) for x, y in zip(a, b, strict=True)) <= TOL
