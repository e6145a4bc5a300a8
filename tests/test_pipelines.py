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
    from lmforge.models.pretrained import load_backbone

    fe = lmforge.pipeline("feature-extraction", model=tiny_encoder_dir, layers="-2,-1", combine="concat")
    vectors = fe(["alice lives in paris", "bob"])
    loaded = load_backbone(tiny_encoder_dir)
    expected = embed_texts(loaded.model, loaded.tokenizer, ["alice lives in paris", "bob"], layers=[-2, -1],
                           combine="concat")
    np.testing.assert_allclose(np.stack(vectors), expected, rtol=1e-6, atol=1e-6)
    assert fe("bob").shape == (48,)


def test_fill_mask_ranks_the_mlm_head_logits(tiny_encoder_dir, tmp_path):
    from lmforge.heads import TaskModel, build_head
    from lmforge.models.pretrained import load_backbone, save_pretrained

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
