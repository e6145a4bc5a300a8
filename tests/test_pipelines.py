"""``lmforge.pipeline`` on the toy fine-tuned models (tests/conftest.py ``finetuned``) and a tiny MLM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lmforge
from lmforge.errors import LmforgeError


def test_text_classification_single_and_batch(finetuned):
    out, _, _ = finetuned("sequence")
    clf = lmforge.pipeline("text-classification", model=out)
    one = clf("alice great today")
    assert set(one) == {"label", "score"} and one["label"] in ("pos", "neg") and 0.5 <= one["score"] <= 1.0
    many = clf(["alice great today", "bob awful later"])
    assert [m["label"] for m in many] == [clf("alice great today")["label"], clf("bob awful later")["label"]]
    assert clf("carol superb")["label"] == "pos" and clf("carol dreadful")["label"] == "neg"


def test_pair_classification_needs_pairs(finetuned):
    out, _, _ = finetuned("pair")
    clf = lmforge.pipeline("text-classification", model=out)
    assert clf({"text": "paris", "text_pair": "rome"})["label"] in ("same", "different")
    with pytest.raises(LmforgeError, match="sentence pairs"):
        clf("paris")


def test_token_classification_entities_have_character_offsets(finetuned):
    out, _, _ = finetuned("token")
    tagger = lmforge.pipeline("token-classification", model=out)
    text = "today  alice bob went to paris"
    entities = tagger(text)
    assert entities, "the toy tagger finds the entities"
    for entity in entities:
        assert text[entity["start"]:entity["end"]] == entity["word"]
        assert entity["entity_group"] in ("PER", "LOC") and 0.0 < entity["score"] <= 1.0
    assert {(e["word"], e["entity_group"]) for e in entities} == {("alice bob", "PER"), ("paris", "LOC")}


def test_span_model_through_the_token_pipeline(finetuned):
    out, _, _ = finetuned("span")
    tagger = lmforge.pipeline("token-classification", model=out)
    text = "later carol met erin in rome"
    for entity in tagger(text):
        assert text[entity["start"]:entity["end"]] == entity["word"]


def test_question_answering_returns_a_span_of_the_context(finetuned):
    out, _, _ = finetuned("qa")
    qa = lmforge.pipeline("question-answering", model=out)
    context = "alice lives in paris . bob lives in rome ."
    answer = qa({"question": "where lives bob ?", "context": context})
    assert context[answer["start"]:answer["end"]] == answer["answer"] and answer["answer"]
    with pytest.raises(LmforgeError, match="question and context"):
        qa({"question": "where?"})


def test_feature_extraction_equals_embed_texts(tiny_encoder_dir):
    from lmforge.embeddings.contextual import embed_texts
    from lmforge.persistence import load_backbone

    fe = lmforge.pipeline("feature-extraction", model=tiny_encoder_dir, layers="-2,-1", combine="concat")
    vectors = fe(["alice lives in paris", "bob"])
    loaded = load_backbone(tiny_encoder_dir)
    expected = embed_texts(loaded.model, loaded.tokenizer, ["alice lives in paris", "bob"], layers=[-2, -1],
                           combine="concat")
    np.testing.assert_allclose(np.stack(vectors), expected, rtol=1e-6, atol=1e-6)
    assert fe("bob").shape == (48,)


def test_fill_mask_ranks_the_mlm_head_logits(tiny_encoder_dir, tmp_path):
    from lmforge.heads import TaskModel, build_head
    from lmforge.persistence import load_backbone, save_pretrained

    loaded = load_backbone(tiny_encoder_dir)
    torch.manual_seed(0)
    model = TaskModel(loaded.model, build_head({"type": "mlm"}, loaded.config, loaded.model))
    save_pretrained(model, tmp_path / "mlm", tokenizer=loaded.tokenizer)
    fill = lmforge.pipeline("fill-mask", model=tmp_path / "mlm", top_k=3)
    top = fill("alice lives in [MASK] .")
    assert len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]
    assert top[0]["sequence"] == "alice lives in [MASK] .".replace("[MASK]", top[0]["token"])
    enc = loaded.tokenizer("alice lives in [MASK] .", return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(enc["input_ids"][None], enc["attention_mask"][None], enc["token_type_ids"][None])
    position = enc["input_ids"].tolist().index(loaded.tokenizer.mask_id)
    assert top[0]["token_id"] == int(logits.mlm_logits[0, position].argmax())
    two = fill("[MASK] lives in [MASK] .")
    assert len(two) == 2 and all(len(m) == 3 for m in two)
    with pytest.raises(LmforgeError, match="no \\[MASK\\]"):
        fill("alice lives in paris")


def test_wrong_model_or_task_is_a_clear_error(finetuned, tiny_encoder_dir):
    out, _, _ = finetuned("sequence")
    with pytest.raises(LmforgeError, match="fine-tuned for 'sequence'"):
        lmforge.pipeline("question-answering", model=out)
    with pytest.raises(LmforgeError, match="not a fine-tuned model"):
        lmforge.pipeline("text-classification", model=tiny_encoder_dir)
    with pytest.raises(LmforgeError, match="no masked-LM head"):
        lmforge.pipeline("fill-mask", model=tiny_encoder_dir)
    with pytest.raises(LmforgeError, match="unknown pipeline"):
        lmforge.pipeline("summarization", model=out)


# ---------------------------------------------------------------------------- top_k and probabilities (issue 23)
def test_text_classification_top_k_ranks_the_class_probabilities(finetuned):
    out, _, _ = finetuned("sequence")
    best = lmforge.pipeline("text-classification", model=out)("alice great today")
    ranked = lmforge.pipeline("text-classification", model=out, top_k=2)("alice great today")
    assert [r["label"] for r in ranked] == [best["label"], {"pos": "neg", "neg": "pos"}[best["label"]]]
    assert ranked[0]["score"] == pytest.approx(best["score"]) and ranked[0]["score"] >= ranked[1]["score"]
    assert sum(r["score"] for r in ranked) == pytest.approx(1.0, abs=1e-5)  # both classes: a distribution
    many = lmforge.pipeline("text-classification", model=out, top_k=1)(["alice great today", "bob awful later"])
    assert len(many) == 2 and all(len(m) == 1 for m in many)
    with pytest.raises(LmforgeError, match="top_k must be an integer >= 1"):
        lmforge.pipeline("text-classification", model=out, top_k=0)


def test_top_k_is_refused_where_there_is_one_answer(finetuned):
    out, _, _ = finetuned("token")
    with pytest.raises(LmforgeError, match="one answer per input"):
        lmforge.pipeline("token-classification", model=out, top_k=3)


def test_question_answering_score_is_the_start_end_probability_product(finetuned):
    """Reproduction: the score was start_logit + end_logit (any real number); transformers' pipeline reports
    softmax(start)[i] * softmax(end)[j] over the window, and so does lmforge's now."""
    out, _, _ = finetuned("qa")
    qa = lmforge.pipeline("question-answering", model=out)
    item = {"question": "where lives bob ?", "context": "alice lives in paris . bob lives in rome ."}
    answer = qa(item)
    assert 0.0 < answer["score"] <= 1.0
    from lmforge.data.readers import QAExample

    example = QAExample("0", "", item["question"], item["context"], [], False)
    (feature,) = qa.task.featurize([example], qa.tokenizer, training=False)  # the context fits one window
    batch = qa.task.collate([feature], qa.tokenizer.pad_id)
    batch = {k: v for k, v in batch.items() if k not in ("start_positions", "end_positions")}
    with torch.no_grad():
        logits = qa.model(**batch)
    p_start, p_end = logits.start_logits[0].float().softmax(-1), logits.end_logits[0].float().softmax(-1)
    longest = qa.task.config.max_answer_length
    spans = torch.outer(p_start, p_end).triu().tril(longest - 1)  # (T, T): i <= j < i + max_answer_length
    spans[0] = 0.0  # [CLS] is the empty answer, not a span
    assert answer["score"] == pytest.approx(float(spans.max()), rel=1e-4)
    ranked = lmforge.pipeline("question-answering", model=out, top_k=3)(item)
    assert len(ranked) == 3 and ranked[0] == answer
    assert ranked[0]["score"] >= ranked[1]["score"] >= ranked[2]["score"] > 0.0
    assert sum(r["score"] for r in ranked) <= 1.0 + 1e-6


def test_question_answering_ranks_as_evaluate_over_several_windows(finetuned):
    # the pipeline picks the span BERT's SQuAD code (and `lmforge evaluate`) picks, by logit sum over all windows;
    # only the reported score is the window probability (issue 38)
    from lmforge.data.qa_features import decode_qa
    from lmforge.data.readers import QAExample

    out, _, _ = finetuned("qa")
    qa = lmforge.pipeline("question-answering", model=out, top_k=3)
    context = " ".join(["alice lives in paris . bob lives in rome . carol lives in oslo ."] * 3)
    item = {"question": "where lives carol ?", "context": context}
    example = QAExample("0", "", item["question"], context, [], False)
    features = qa.task.featurize([example], qa.tokenizer, training=False)
    assert len(features) > 1  # the context takes several windows
    starts, ends = [], []
    for feature in features:
        batch = qa.task.collate([feature], qa.tokenizer.pad_id)
        batch = {k: v for k, v in batch.items() if k not in ("start_positions", "end_positions")}
        with torch.no_grad():
            logits = qa.model(**batch)
        starts.append(logits.start_logits[0].float().numpy())
        ends.append(logits.end_logits[0].float().numpy())
    c = qa.task.config
    reference = decode_qa([example], features, starts, ends, n_best=c.n_best, max_answer_length=c.max_answer_length,
                          version_2=bool(c.version_2), null_threshold=c.null_threshold)["0"]
    ranked = qa(item)
    assert [(r["start"], r["end"]) for r in ranked] == [(e["start"], e["end"]) for e in reference["n_best"][:3]]
    assert all(0.0 < r["score"] <= 1.0 for r in ranked)


def test_compile_gives_the_same_answers_and_refuses_what_it_cannot_compile(finetuned, tiny_encoder_dir,
                                                                           monkeypatch):
    """``compile=True`` compiles the model in place as ``predict --compile`` does (TorchDynamo with the ``eager``
    backend here: the tracing, one graph with unpadding inside, is what is tested, not inductor's code)."""
    import torch._dynamo

    from lmforge.utils.compiling import BACKEND_ENV

    monkeypatch.setenv(BACKEND_ENV, "eager")
    torch._dynamo.reset()
    try:
        out, _, _ = finetuned("sequence")
        texts = ["alice great today", "bob awful later than ever", "carol"]
        plain = lmforge.pipeline("text-classification", model=out, top_k=2)(texts)
        compiled = lmforge.pipeline("text-classification", model=out, top_k=2, compile=True)
        got = compiled(texts)
        assert [[a["label"] for a in row] for row in got] == [[a["label"] for a in row] for row in plain]
        np.testing.assert_allclose([[a["score"] for a in row] for row in got],
                                   [[a["score"] for a in row] for row in plain], atol=1e-5)
        assert compiled.top_k == 2  # the pipeline's own attributes
        fe = lmforge.pipeline("feature-extraction", model=tiny_encoder_dir, compile=True)
        np.testing.assert_allclose(np.stack(fe(texts)),
                                   np.stack(lmforge.pipeline("feature-extraction", model=tiny_encoder_dir)(texts)),
                                   atol=1e-5)
    finally:
        torch._dynamo.reset()
    with pytest.raises(LmforgeError, match="decoding loop runs uncompiled"):
        lmforge.pipeline("text-generation", model=out, compile=True)
    with pytest.raises(LmforgeError, match="exclude each other"):
        lmforge.pipeline("text-classification", model=out, runtime="onnx", compile=True)
