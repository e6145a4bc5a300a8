"""``lmforge convert --to-hf`` names the Hugging Face class that matches the heads present (issue 23).

Reproduction: a bare encoder used to be exported as ``BertForPreTraining``; ``transformers.AutoModel`` then warned
that the checkpoint "seems corrupted" / had weights newly initialised, and added random heads.
"""

from __future__ import annotations

import io
import logging

import torch

from lmforge.persistence import load_pretrained
from tests.interop.parity import close, export_cli, transformers


def _transformers_log(load):
    """Run ``load()`` and return (its result, everything transformers logged at WARNING or above)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        result = load()
    finally:
        logger.removeHandler(handler)
    return result, stream.getvalue()


def test_bare_encoder_exports_as_bert_model_and_loads_without_warnings(tiny_encoder_dir, tmp_path):
    config = export_cli(tiny_encoder_dir, tmp_path / "hf")
    assert config["architectures"] == ["BertModel"]
    hf, warnings = _transformers_log(lambda: transformers.AutoModel.from_pretrained(
        str(tmp_path / "hf"), attn_implementation="eager"))
    assert type(hf).__name__ == "BertModel"
    assert warnings == "", f"transformers warned while loading the export: {warnings}"
    # the class the config names (what tools that read ``architectures`` build) loads cleanly too: with the old
    # "BertForPreTraining" it warned "This checkpoint seem corrupted" and initialised random MLM/NSP heads
    named = getattr(transformers, config["architectures"][0])
    _, warnings = _transformers_log(lambda: named.from_pretrained(str(tmp_path / "hf")))
    assert warnings == "", f"transformers warned while loading the export: {warnings}"
    ours = load_pretrained(tiny_encoder_dir).model
    ids = torch.tensor([[2, 7, 9, 11, 3], [2, 8, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        mine = ours(ids, attention_mask=mask)
        theirs = hf(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    close(theirs.last_hidden_state[real], mine.last_hidden_state[real], rtol=1e-5)
    close(theirs.pooler_output, mine.pooled_output, rtol=1e-5)


def test_encoder_with_pretraining_heads_still_exports_as_bert_for_pretraining(tiny_encoder_dir, tmp_path):
    from lmforge.heads import TaskModel, build_head

    loaded = load_pretrained(tiny_encoder_dir)
    model = TaskModel(loaded.model, build_head({"type": "pretraining"}, loaded.config, loaded.model))
    model.save_pretrained(tmp_path / "pre", tokenizer=loaded.tokenizer)
    config = export_cli(tmp_path / "pre", tmp_path / "hf")
    assert config["architectures"] == ["BertForPreTraining"]
    hf, warnings = _transformers_log(lambda: transformers.AutoModelForPreTraining.from_pretrained(
        str(tmp_path / "hf")))
    assert type(hf).__name__ == "BertForPreTraining" and warnings == ""
