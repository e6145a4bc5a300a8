"""Task models both ways, for every family and head: a transformers task model (random, perturbed) -> ``lmforge convert
--from-hf`` -> our task model with the same logits and labels -> ``lmforge convert --to-hf`` -> transformers'
``from_pretrained`` with the same logits and labels again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lmforge.cli import main
from lmforge.persistence import load_pretrained

from .parity import close, export_cli, hf_model, import_cli

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")

V = 61
SIZES = dict(vocab_size=V, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=20)


def family_config(family: str, **task: Any) -> Any:
    """A tiny transformers config of ``family`` with the task settings ``task`` (labels ...)."""
    if family == "bert":
        return transformers.BertConfig(**SIZES, max_position_embeddings=16, **task)
    if family == "roberta":  # positions start after the padding id (1): 16 real positions need 18 rows
        return transformers.RobertaConfig(**SIZES, max_position_embeddings=18, pad_token_id=1, type_vocab_size=1,
                                          layer_norm_eps=1e-5, **task)
    if family == "albert":
        return transformers.AlbertConfig(**SIZES, embedding_size=8, max_position_embeddings=16, **task)
    if family == "electra":
        return transformers.ElectraConfig(**SIZES, embedding_size=8, max_position_embeddings=16, **task)
    if family == "distilbert":
        return transformers.DistilBertConfig(vocab_size=V, dim=12, n_layers=2, n_heads=3, hidden_dim=20,
                                             max_position_embeddings=16, **task)
    if family == "xlnet":
        return transformers.XLNetConfig(vocab_size=V, d_model=12, n_layer=2, n_head=3, d_inner=20, **task)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=V, n_embd=12, n_layer=2, n_head=3, n_positions=16,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0, **task)
    raise AssertionError(family)


PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "distilbert": "DistilBert", "electra": "Electra",
          "xlnet": "XLNet", "gpt2": "GPT2"}
HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")
CASES = [(family, head) for family in PREFIX for head in HEADS
         if not (family == "gpt2" and head == "ForMultipleChoice")]  # transformers has no GPT-2 choice class
LABELS = {"ForSequenceClassification": ["negative", "neutral", "positive"],
          "ForTokenClassification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}
B, T, K = 3, 7, 4


def class_name(family: str, head: str) -> str:
    if family == "xlnet" and head == "ForQuestionAnswering":
        return "XLNetForQuestionAnsweringSimple"
    return PREFIX[family] + head


def batch(family: str, seed: int) -> dict[str, torch.Tensor]:
    """Ids from 2 up (0 and 1 are the padding ids of GPT-2 and RoBERTa here), row 1 padded from 5 on (none for
    XLNet, which transformers pads on the left, and GPT-2, whose classifier finds the last token by the padding id
    only when it is not also a real token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if family not in ("xlnet", "gpt2"):
        mask[1, 5:] = 0
        ids[1, 5:] = 1 if family == "roberta" else 0
    return {"input_ids": ids, "attention_mask": mask}


def labelled(head: str) -> dict[str, Any]:
    labels = LABELS.get(head)
    if labels is None:
        return {}
    return {"id2label": dict(enumerate(labels)), "label2id": {x: i for i, x in enumerate(labels)}}


def hf_logits(model: torch.nn.Module, head: str, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        if head == "ForMultipleChoice":  # (B, K, T): the rows of the batch are one question's K options
            out = model(**{k: v[:1].expand(K, T).unsqueeze(0) if k == "attention_mask" else
                           _options(v).unsqueeze(0) for k, v in inputs.items()})
            return [out.logits]
        out = model(**inputs)
    if head == "ForQuestionAnswering":
        return [out.start_logits, out.end_logits]
    return [out.logits]


def _options(ids: torch.Tensor) -> torch.Tensor:
    """K options of one question: the first row with its last token varied."""
    rows = ids[:1].repeat(K, 1)
    rows[:, -1] = torch.arange(K) + 2
    return rows


def our_logits(model: torch.nn.Module, head: str, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():
        if head == "ForMultipleChoice":
            out = model(_options(ids), mask[:1].expand(K, T), doc_index=torch.zeros(K, dtype=torch.long),
                        option_index=torch.arange(K))
            return [out.logits]
        if head == "ForTokenClassification":
            word_index = torch.where(mask.bool(), torch.arange(T).expand(B, T), torch.full((B, T), -1))
            return [model(ids, mask, word_index=word_index).subword_logits]
        out = model(ids, mask)
    if head == "ForQuestionAnswering":
        return [out.start_logits, out.end_logits]
    return [out.logits]


def same_logits(ours: list[torch.Tensor], theirs: list[torch.Tensor], inputs: dict[str, torch.Tensor],
                head: str) -> None:
    real = inputs["attention_mask"].bool()
    for a, b in zip(ours, theirs, strict=True):
        if head in ("ForTokenClassification", "ForQuestionAnswering"):  # per token: the real ones
            a, b = a[real], b[real]
        close(a, b)


@pytest.mark.parametrize(("family", "head"), CASES)
def test_task_model_round_trip(family: str, head: str, tmp_path: Path) -> None:
    name = class_name(family, head)
    hf = hf_model(name, family_config(family, **labelled(head)), seed=3)
    hf.save_pretrained(tmp_path / "hf")
    inputs = batch(family, seed=4)
    reference = hf_logits(hf, head, inputs)

    ours_config = import_cli(tmp_path / "hf", tmp_path / "ours")
    assert ours_config["head"]["type"] in ("sequence_classification", "token_classification", "qa",
                                           "multiple_choice")
    if head in LABELS:
        assert ours_config["head"]["labels"] == LABELS[head]
    ours = load_pretrained(tmp_path / "ours")
    same_logits(our_logits(ours.model, head, inputs), reference, inputs, head)

    exported = export_cli(tmp_path / "ours", tmp_path / "back")
    assert exported["architectures"] == [name]
    back = getattr(transformers, name).from_pretrained(tmp_path / "back").eval()
    if head in LABELS:
        assert [back.config.id2label[i] for i in range(len(LABELS[head]))] == LABELS[head]
    same_logits(hf_logits(back, head, inputs), reference, inputs, head)


def test_labels_and_regression_travel(tmp_path: Path) -> None:
    # a one-output sequence head is a regression (problem_type), both ways
    hf = hf_model("BertForSequenceClassification", family_config("bert", num_labels=1), seed=5)
    hf.save_pretrained(tmp_path / "hf")
    assert import_cli(tmp_path / "hf", tmp_path / "ours")["head"]["regression"] is True
    assert export_cli(tmp_path / "ours", tmp_path / "back")["problem_type"] == "regression"
    # multi-label classification is refused with the reason
    hf = hf_model("BertForSequenceClassification",
                  family_config("bert", num_labels=3, problem_type="multi_label_classification"), seed=5)
    hf.save_pretrained(tmp_path / "multi")
    assert main(["-q", "convert", "--from-hf", str(tmp_path / "multi"), "--out", str(tmp_path / "m")]) != 0


def test_a_task_checkpoint_fine_tunes_as_a_backbone(tmp_path: Path) -> None:
    # finetune --model reads the body of a task checkpoint (the head left out), not "unexpected key(s)"
    from lmforge.persistence import load_backbone

    hf = hf_model("BertForSequenceClassification", family_config("bert", **labelled("ForSequenceClassification")),
                  seed=6)
    hf.save_pretrained(tmp_path / "hf")
    backbone = load_backbone(tmp_path / "hf")
    ref = hf.bert.embeddings.word_embeddings.weight
    assert torch.equal(backbone.model.state_dict()["embeddings.tokens.weight"], ref)


def test_a_crf_tagger_keeps_its_crf_beside_the_softmax_tagger(tmp_path: Path, capsys) -> None:
    from lmforge.heads.base import TaskModel
    from lmforge.persistence import save_pretrained

    labels = LABELS["ForTokenClassification"]
    hf = hf_model("BertForTokenClassification", family_config("bert", **labelled("ForTokenClassification")), seed=7)
    hf.save_pretrained(tmp_path / "hf")
    import_cli(tmp_path / "hf", tmp_path / "softmax")
    loaded = load_pretrained(tmp_path / "softmax")
    # the same backbone under a CRF tagger (as `finetune --crf` makes)
    from lmforge.heads import build_head

    spec = {"type": "token_classification", "labels": labels, "crf": True, "scheme": "BIO"}
    head = build_head(spec, loaded.config, loaded.model.backbone)
    with torch.no_grad():
        head.classifier.load_state_dict(loaded.model.head.classifier.state_dict())
        head.crf.transitions.normal_()
    model = TaskModel(loaded.model.backbone, head).eval()
    save_pretrained(model, tmp_path / "crf", config=loaded.config, head=spec)
    config = export_cli(tmp_path / "crf", tmp_path / "hf-crf")
    assert config["lmforge_crf"]["file"] == "crf.safetensors" and (tmp_path / "hf-crf" / "crf.safetensors").is_file()
    # transformers reads the emissions; lmforge reads the CRF back, bit for bit
    transformers.BertForTokenClassification.from_pretrained(tmp_path / "hf-crf")
    import_cli(tmp_path / "hf-crf", tmp_path / "again")
    again = load_pretrained(tmp_path / "again")
    assert again.head["crf"] is True
    assert torch.equal(again.model.head.crf.transitions, head.crf.transitions)


def test_a_head_transformers_lacks_exports_the_backbone_with_a_note(tmp_path: Path, capsys) -> None:
    hf = hf_model("BertForSequenceClassification", family_config("bert", **labelled("ForSequenceClassification")),
                  seed=8)
    hf.save_pretrained(tmp_path / "hf")
    import_cli(tmp_path / "hf", tmp_path / "ours")
    config_path = tmp_path / "ours" / "config.json"
    config = json.loads(config_path.read_text())
    config["head"]["pooling"] = "mean"  # mean pooling: no transformers class computes it
    config_path.write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 0
    err = capsys.readouterr().err
    assert "pooling='mean'" in err and "the backbone was exported as BertModel" in err
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["BertModel"]


def test_predict_reads_a_transformers_classifier_folder(tmp_path: Path, tiny_encoder_dir: Path) -> None:
    # a BertForSequenceClassification as transformers saves it predicts with its own labels, no conversion first
    from lmforge.tokenizers import WordPieceTokenizer

    vocab = WordPieceTokenizer.from_pretrained(tiny_encoder_dir).vocab_size
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=20, max_position_embeddings=40,
                                     **labelled("ForSequenceClassification"))
    hf = hf_model("BertForSequenceClassification", config, seed=9)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_bytes((tiny_encoder_dir / "vocab.txt").read_bytes())
    (tmp_path / "in.csv").write_text("text\nthe cat sat\na dog ran far away\n", encoding="utf-8")
    assert main(["-q", "predict", "--model", str(tmp_path / "hf"), "--input", str(tmp_path / "in.csv"),
                 "--out", str(tmp_path / "pred.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["the cat sat", "a dog ran far away"]
    assert all(set(r["probabilities"]) == set(LABELS["ForSequenceClassification"]) for r in rows)


def _roberta_tokenizer(bbc_dir: Path, n_files: int, vocab_size: int) -> Any:
    """A RoBERTa fast tokenizer (byte-level BPE, <s> A </s>) trained by Hugging Face tokenizers on BBC articles."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    files = [str(p) for p in sorted((bbc_dir / "business").glob("*.txt"))[:n_files]]
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>",
                                                                                 "<mask>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return transformers.RobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                             pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")


def test_a_roberta_classifier_saved_by_transformers_predicts_as_transformers(tmp_path: Path, bbc_dir: Path) -> None:
    # transformers 5 saves a fast tokenizer as tokenizer.json alone: lmforge reads its byte-level BPE, encodes
    # held-out text to the same ids and predicts the same probabilities as transformers, end to end
    fast = _roberta_tokenizer(bbc_dir, 150, 700)
    fast.save_pretrained(tmp_path / "hf")
    config = family_config("roberta", **labelled("ForSequenceClassification"))
    config.vocab_size, config.max_position_embeddings = len(fast), 66
    hf = hf_model("RobertaForSequenceClassification", config, seed=10)
    hf.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf" / "vocab.json").exists()
    held_out = [p.read_text(encoding="utf-8").splitlines()[0] for p in sorted((bbc_dir / "tech").glob("*.txt"))[:6]]
    loaded = load_pretrained(tmp_path / "hf")
    for text in held_out:
        assert [0, *loaded.tokenizer.encode_ids(text), 2] == fast(text)["input_ids"]
    # called as transformers' tokenizers are: RoBERTa's template for texts and pairs, padding, tensors
    assert loaded.tokenizer(held_out[:2], held_out[2:4])["input_ids"] == fast(held_out[:2], held_out[2:4])["input_ids"]
    batch = loaded.tokenizer(held_out, padding=True, return_tensors="pt")
    reference = fast(held_out, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], reference["input_ids"])
    assert torch.equal(batch["attention_mask"], reference["attention_mask"])
    (tmp_path / "lines.txt").write_text("\n".join(held_out) + "\n", encoding="utf-8")
    assert main(["-q", "embed", "--model", str(tmp_path / "hf"), "--input", str(tmp_path / "lines.txt"),
                 "--out", str(tmp_path / "vectors.npy")]) == 0
    (tmp_path / "in.txt").write_text("\n".join(held_out) + "\n", encoding="utf-8")
    assert main(["-q", "predict", "--model", str(tmp_path / "hf"), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "pred.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    with torch.no_grad():
        for text, row in zip(held_out, rows, strict=True):
            probs = torch.softmax(hf(**fast(text, return_tensors="pt")).logits, -1)[0]
            ours = torch.tensor([row["probabilities"][label] for label in LABELS["ForSequenceClassification"]])
            close(ours, probs)


def test_a_roberta_tagger_fine_tunes_on_words_and_finds_entities_in_raw_text(tmp_path: Path, bbc_dir: Path) -> None:
    # byte-level BPE in token tasks: each word after the first is encoded with its space (" Paris"), and the NER
    # pipeline's words come from the tokenizer's offsets (trimmed of the spaces the tokens carry)
    fast = _roberta_tokenizer(bbc_dir, 60, 500)
    fast.save_pretrained(tmp_path / "hf")
    config = family_config("roberta")
    config.vocab_size, config.max_position_embeddings = len(fast), 66
    hf_model("RobertaModel", config, seed=3).save_pretrained(tmp_path / "hf")
    places, others = ["Paris", "London", "Tokyo", "Berlin"], ["the", "market", "rose", "in", "shares", "fell"]
    lines = []
    for i in range(40):
        words = [others[i % 6], others[(i + 1) % 6], "in", places[i % 4], "."]
        tags = ["O", "O", "O", "B-LOC", "O"]
        lines += [f"{w} {t}" for w, t in zip(words, tags, strict=True)] + [""]
    (tmp_path / "train.conll").write_text("\n".join(lines), encoding="utf-8")
    assert main(["-q", "finetune", "--task", "token", "--model", str(tmp_path / "hf"), "--train",
                 str(tmp_path / "train.conll"), "--dev", str(tmp_path / "train.conll"), "--out", str(tmp_path / "run"),
                 "--epochs", "20", "--lr", "1e-2", "--batch-size", "8"]) == 0
    import lmforge

    text = "Shares fell in  Berlin, the market rose in Paris!"
    entities = lmforge.pipeline("token-classification", model=tmp_path / "run")(text)
    assert entities and all(text[e["start"]:e["end"]] == e["word"] for e in entities)
    assert {e["word"] for e in entities} <= {"Berlin", "Paris"} and all(e["entity_group"] == "LOC" for e in entities)


def test_fill_mask_on_a_roberta_folder_equals_transformers_pipeline(tmp_path: Path, bbc_dir: Path) -> None:
    # byte-level BPE in fill-mask: candidates shown decoded (" market", not "Ġmarket") and the filled sentence
    # decoded, with transformers' ids and scores
    import lmforge

    fast = _roberta_tokenizer(bbc_dir, 60, 500)
    fast.save_pretrained(tmp_path / "hf")
    config = family_config("roberta")
    config.vocab_size, config.max_position_embeddings = len(fast), 66
    hf = hf_model("RobertaForMaskedLM", config, seed=4)
    hf.save_pretrained(tmp_path / "hf")
    text = "Shares in the <mask> rose on Monday."
    ours = lmforge.pipeline("fill-mask", model=tmp_path / "hf", top_k=3)(text)
    theirs = transformers.pipeline("fill-mask", model=hf, tokenizer=fast, top_k=3)(text)
    assert [c["token_id"] for c in ours] == [c["token"] for c in theirs]
    assert [c["token"] for c in ours] == [c["token_str"] for c in theirs]
    assert [c["sequence"] for c in ours] == [c["sequence"] for c in theirs]
    close(torch.tensor([c["score"] for c in ours]), torch.tensor([c["score"] for c in theirs]))
