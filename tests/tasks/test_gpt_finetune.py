"""GPT-1 fine-tuning (Radford et al. 2018): input transformations token by token, the extract token's state under
either padding, the auxiliary LM loss by formula, the added special tokens, multiple choice, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from lmforge.cli import main
from lmforge.config import ModelConfig, TaskConfig
from lmforge.data.readers import ClassificationExample, read_choices
from lmforge.errors import InputFileError, LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models import Decoder
from lmforge.persistence import load_pretrained
from lmforge.recipes.finetune import resolve_task_inputs
from lmforge.tasks import TaskObjective, make_task
from lmforge.tasks.gpt_inputs import DELIM, EXTRACT, START, add_gpt_tokens, grow_embeddings
from lmforge.tokenizers import WordPieceTokenizer
from tests.conftest import FINETUNE_ARGS
from tests.toy_tasks import make_decoder_dir, make_encoder_dir, vocab, write_task_data

GPT = ModelConfig(arch="decoder", vocab_size=len(vocab()), d_model=16, n_heads=2, n_layers=2, d_ff=32,
                  max_seq_len=48, dropout=0.0, attention_dropout=0.0, norm_first=True)


@pytest.fixture(scope="module")
def tok():
    return add_gpt_tokens(WordPieceTokenizer(vocab()))[0]


def _gpt_task(task="sequence", **options):
    return make_task(resolve_task_inputs(TaskConfig(task=task, max_length=32, **options), GPT))


def _tokens(tok, ids):
    return tok.convert_ids_to_tokens(ids)


# ------------------------------------------------------------------------------------------ input transformations
def test_classification_and_entailment_layouts_token_by_token(tok):
    single = _gpt_task().featurize([ClassificationExample("alice saw rome", None, None, 1)], tok, training=False)
    assert _tokens(tok, single[0]["windows"][0]) == [START, "alice", "saw", "rome", EXTRACT]
    pair = _gpt_task("pair").featurize([ClassificationExample("alice saw rome", "bob met erin", None, 1)], tok,
                                       training=False)
    assert _tokens(tok, pair[0]["windows"][0]) == [START, "alice", "saw", "rome", DELIM, "bob", "met", "erin",
                                                    EXTRACT]
    assert len(pair[0]["windows"]) == 1


def test_similarity_encodes_both_orders(tok):
    task = _gpt_task("pair", symmetric=True)
    rows = task.featurize([ClassificationExample("alice", "bob met", None, 1)], tok, training=False)[0]["windows"]
    assert [_tokens(tok, r) for r in rows] == [[START, "alice", DELIM, "bob", "met", EXTRACT],
                                               [START, "bob", "met", DELIM, "alice", EXTRACT]]
    assert task.head_spec()["combine_windows"] == "sum_states"


def test_multiple_choice_is_one_row_per_option(tok, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "alice lives in rome", "choices": ["rome", "oslo", "lima"],
                                "label": "oslo"}) + "\n")
    examples = read_choices(path)
    assert examples[0].label == 1
    feature = _gpt_task("choice").featurize(examples, tok, training=True)[0]
    assert [_tokens(tok, r) for r in feature["windows"]] == [
        [START, "alice", "lives", "in", "rome", DELIM, c, EXTRACT] for c in ("rome", "oslo", "lima")]
    batch = _gpt_task("choice").collate([feature, feature], tok.pad_id)
    assert batch["doc_index"].tolist() == [0, 0, 0, 1, 1, 1] and batch["option_index"].tolist() == [0, 1, 2] * 2
    assert batch["labels"].tolist() == [1, 1]


def test_qa_and_tagging_rows_keep_their_positions(tok, tmp_path):
    train, _ = write_task_data(tmp_path, "qa", n_train=2, n_dev=1)
    bert = make_task(TaskConfig(task="qa", max_length=32, doc_stride=8, max_query_length=8, input_format="bert"))
    gpt = _gpt_task("qa", doc_stride=8, max_query_length=8)
    examples = bert.read(str(train))
    before = bert.featurize(examples, tok, training=True)
    after = gpt.featurize(examples, tok, training=True)
    for b, a in zip(before, after, strict=True):
        mapped = {tok.cls_id: tok.vocab[START]}
        seps = [i for i, t in enumerate(b["input_ids"]) if t == tok.sep_id]
        expect = [mapped.get(t, t) for t in b["input_ids"]]
        expect[seps[0]], expect[seps[-1]] = tok.vocab[DELIM], tok.vocab[EXTRACT]
        assert a["input_ids"] == expect
        assert {k: v for k, v in a.items() if k != "input_ids"} == {k: v for k, v in b.items() if k != "input_ids"}


def test_new_tokens_join_the_vocabulary_and_the_embeddings():
    base = WordPieceTokenizer(vocab())
    grown, added = add_gpt_tokens(base)
    assert added == [START, DELIM, EXTRACT] and base.vocab_size + 3 == grown.vocab_size
    assert grown.encode_ids(f"alice {EXTRACT}") == [grown.vocab["alice"], grown.vocab[EXTRACT]]  # never split
    assert add_gpt_tokens(grown) == (grown, [])
    torch.manual_seed(0)
    model = Decoder(GPT)
    old = model.token_embedding.weight.detach().clone()
    grow_embeddings(model, grown, added)
    table = model.token_embedding.weight
    assert model.config.vocab_size == grown.vocab_size == table.shape[0]
    assert torch.equal(table[:len(old)], old)
    assert torch.equal(table[grown.vocab[START]], old[base.sep_id])  # what the model saw at document starts
    assert torch.allclose(table[grown.vocab[EXTRACT]], old.mean(0))


# ------------------------------------------------------------------------------------------ the extract token
@pytest.mark.parametrize("side", ["right", "left"])
def test_the_representation_is_the_extract_tokens_state_under_either_padding(side):
    torch.manual_seed(0)
    model = Decoder(GPT).eval()
    rows = [[3, 7, 9, 11, 5], [3, 8, 5]]
    alone = [model(torch.tensor([r])).last_hidden_state[0, -1] for r in rows]
    ids = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.zeros(2, 5, dtype=torch.long)
    for i, r in enumerate(rows):
        where = slice(0, len(r)) if side == "right" else slice(5 - len(r), 5)
        ids[i, where], mask[i, where] = torch.tensor(r), 1
    pooled = model(ids, attention_mask=mask).pooled_output
    for i in range(2):
        torch.testing.assert_close(pooled[i], alone[i], atol=1e-5, rtol=1e-5)


def test_symmetric_pairs_add_the_two_representations_before_the_classifier():
    torch.manual_seed(0)
    backbone = Decoder(GPT)
    head = build_head({"type": "sequence_classification", "labels": ["a", "b"], "combine_windows": "sum_states"},
                      GPT, backbone).eval()
    pooled = torch.randn(4, 16)
    out = head(type("Out", (), {"pooled_output": pooled})(), doc_index=torch.tensor([0, 0, 1, 1]))
    expect = head.classifier(torch.stack([pooled[0] + pooled[1], pooled[2] + pooled[3]]))
    torch.testing.assert_close(out.logits, expect)


# ------------------------------------------------------------------------------------------ the auxiliary loss
@pytest.mark.parametrize("lm_weight", [0.5, 0.0, 2.0])
def test_the_auxiliary_loss_is_task_loss_plus_lambda_lm_loss(tok, lm_weight):
    torch.manual_seed(0)
    config = ModelConfig(**{**GPT.__dict__, "vocab_size": tok.vocab_size})
    task = make_task(resolve_task_inputs(TaskConfig(task="sequence", lm_weight=lm_weight), config))
    task.labels = ["neg", "pos"]
    backbone = Decoder(config)
    model = TaskModel(backbone, build_head(task.head_spec(), config, backbone))
    examples = [ClassificationExample("alice saw rome", None, "pos", 1),
                ClassificationExample("bob met erin in oslo today", None, "neg", 2)]
    batch = task.collate(task.featurize(examples, tok, training=True), tok.pad_id)
    objective = TaskObjective(task, lm_weight)
    out = objective(model, batch)
    counts = objective.counts(batch)
    total = sum(s / counts[name] for name, (s, _) in out.losses.items())

    plain = backbone(batch["input_ids"], attention_mask=batch["attention_mask"])  # one plain forward pass
    last = batch["attention_mask"].sum(1) - 1
    cls = F.cross_entropy(model.head.classifier(plain.last_hidden_state[torch.arange(2), last]), batch["labels"])
    lm_terms = [F.cross_entropy(plain.logits[i, :n - 1], batch["input_ids"][i, 1:n], reduction="sum")
                for i, n in enumerate(batch["attention_mask"].sum(1).tolist())]
    lm = sum(lm_terms) / (batch["attention_mask"].sum() - 2)  # every real token after the first of its row
    torch.testing.assert_close(total, cls + lm_weight * lm)
    assert ("lm" in out.losses) == bool(lm_weight)
    if lm_weight:
        assert counts["lm"] == int(batch["attention_mask"].sum()) - 2


def test_defaults_follow_the_backbone():
    gpt = resolve_task_inputs(TaskConfig(), GPT)
    assert (gpt.input_format, gpt.lm_weight) == ("gpt", 0.5)
    bert = resolve_task_inputs(TaskConfig(), ModelConfig(vocab_size=50))
    assert (bert.input_format, bert.lm_weight) == ("bert", 0.0)
    assert resolve_task_inputs(TaskConfig(input_format="bert", lm_weight=0.0), GPT).lm_weight == 0.0
    with pytest.raises(LmforgeError, match="lm_weight=0.5 adds a GPT's language-model loss.*encoder"):
        resolve_task_inputs(TaskConfig(lm_weight=0.5), ModelConfig(vocab_size=50))
    with pytest.raises(LmforgeError, match="input_format=gpt lays inputs out for a GPT"):
        resolve_task_inputs(TaskConfig(input_format="gpt"), ModelConfig(vocab_size=50))
    with pytest.raises(LmforgeError, match="lm_weight=-1.0 must be a finite number >= 0"):
        TaskConfig(lm_weight=-1.0)
    with pytest.raises(LmforgeError, match="symmetric=true encodes a PAIR"):
        TaskConfig(symmetric=True)


@pytest.mark.parametrize("task", ["token", "span"])
def test_tagging_on_a_decoder_is_refused_unless_asked(task):
    with pytest.raises(LmforgeError, match=f"--task {task} labels every token.*left to right.*allow_causal=true"):
        resolve_task_inputs(TaskConfig(task=task), GPT)
    assert resolve_task_inputs(TaskConfig(task=task, allow_causal=True), GPT).input_format == "gpt"


# ------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    return make_decoder_dir(tmp_path_factory.mktemp("gpt"))


METRIC = {"sequence": "accuracy", "pair": "accuracy", "choice": "accuracy", "qa": "f1", "token": "f1"}


@pytest.mark.parametrize("task", sorted(METRIC))
def test_every_task_fine_tunes_a_decoder_and_evaluates_as_saved(gpt_dir, task, tmp_path, capsys):
    train, dev = write_task_data(tmp_path, task, n_train=24, n_dev=8)
    out = tmp_path / "run"
    extra = ["--task.allow_causal=true"] if task == "token" else []
    code = main(["-q", "finetune", "--task", task, "--model", str(gpt_dir), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "1", "--batch-size", "8", "--lr", "3e-3", "--max-length", "32",
                 "--seed", "0", *FINETUNE_ARGS[task], *extra])
    assert code == 0, capsys.readouterr().err
    loaded = load_pretrained(out)
    assert loaded.head["task"]["input_format"] == "gpt"
    assert all(t in loaded.tokenizer.vocab for t in (START, DELIM, EXTRACT))
    assert loaded.config.vocab_size == loaded.tokenizer.vocab_size
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("lm_loss" in m for m in metrics)  # the auxiliary loss ran (lambda = 0.5 by default)
    recorded = json.loads((out / "eval_results.json").read_text())[METRIC[task]]
    capsys.readouterr()
    assert main(["-q", "evaluate", "--model", str(out), "--test", str(dev)]) == 0
    assert json.loads(capsys.readouterr().out)[METRIC[task]] == pytest.approx(recorded, abs=1e-9)


def test_a_decoder_learns_a_keyword_task(gpt_dir, tmp_path):
    train, dev = write_task_data(tmp_path, "sequence")
    out = tmp_path / "run"
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(gpt_dir), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "15", "--batch-size", "8", "--lr", "3e-3", "--seed",
                 "0", "--max-length", "32"]) == 0
    assert json.loads((out / "eval_results.json").read_text())["accuracy"] >= 0.9


def test_multiple_choice_on_an_encoder(tmp_path, capsys):
    model = make_encoder_dir(tmp_path / "bert")
    train, dev = write_task_data(tmp_path, "choice")
    out = tmp_path / "run"
    assert main(["-q", "finetune", "--task", "choice", "--model", str(model), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "3e-3", "--seed",
                 "0", "--max-length", "32"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["-q", "predict", "--model", str(out), "--input", str(dev), "--out", str(tmp_path / "p.jsonl")]) == 0
    first = json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])
    assert first["choice"] == first["choices"][first["label"]] and len(first["probabilities"]) == len(first["choices"])


def test_choice_reader_errors(tmp_path):
    def read(text, suffix=".jsonl"):
        path = tmp_path / f"c{suffix}"
        path.write_text(text)
        return read_choices(path)

    with pytest.raises(InputFileError, match=r"c.jsonl:1: 1 option\(s\); a multiple-choice example needs two"):
        read('{"text": "a", "choices": ["x"], "label": 0}\n')
    with pytest.raises(InputFileError, match=r":1: the label 2 is neither an option's 0-based index \(0..1\)"):
        read('{"text": "a", "choices": ["x", "y"], "label": 2}\n')
    with pytest.raises(InputFileError, match="'choices' field must be a list"):
        read('{"text": "a", "choices": "x y", "label": 0}\n')
    with pytest.raises(InputFileError, match="no option columns choices0, choices1"):
        read("text,label\na,0\n", ".csv")
    rows = read("text,choices0,choices1,choices2,label\nctx,x,y,,y\nctx2,p,q,r,2\n", ".csv")
    assert [(r.choices, r.label) for r in rows] == [(("x", "y"), 1), (("p", "q", "r"), 2)]


def test_a_fine_tuned_gpt_classifier_exports_as_gpt2_for_sequence_classification(gpt_dir, tmp_path, capsys):
    # GPT-1's classifier has no bias (eq. 3: softmax(h W_y)), which is GPT2ForSequenceClassification's `score`
    transformers = pytest.importorskip("transformers", reason="transformers is the export's reader (dev extra)")
    train, dev = write_task_data(tmp_path, "sequence", n_train=16, n_dev=8)
    out = tmp_path / "run"
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(gpt_dir), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "32"]) == 0
    loaded = load_pretrained(out)
    assert loaded.head["bias"] is False and loaded.model.head.classifier.bias is None
    capsys.readouterr()
    assert main(["convert", "--to-hf", str(out), "--out", str(tmp_path / "hf")]) == 0
    assert "GPT-1's input layout" in capsys.readouterr().err
    hf = transformers.GPT2ForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    task = make_task(resolve_task_inputs(TaskConfig(**loaded.head["task"]), loaded.config))
    rows = [f["windows"][0] for f in task.featurize(task.read(str(dev)), loaded.tokenizer, training=False)]
    with torch.no_grad():
        for row in rows[:4]:
            ids = torch.tensor([row])
            torch.testing.assert_close(loaded.model(ids, torch.ones_like(ids)).logits, hf(ids).logits,
                                       rtol=1e-4, atol=1e-5)
    assert hf.config.id2label == dict(enumerate(loaded.head["labels"]))
