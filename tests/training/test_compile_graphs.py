"""``--compile`` and lmforge's own code (issue 39, item 3): the input value checks are skipped while TorchDynamo traces
and no size is formatted into a message, so a batch without padding compiles each Transformer family into ONE graph
with no break. A padded batch keeps the breaks of the branches that pay for themselves on a CPU (unpadding, the
all-real-mask shortcut, the empty-row test, XLNet's one-hot test of its query stream; BENCHMARKS.md, issue 39), and
none comes from a check or a message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.config import model_config_from_preset
from lmforge.data.permutation import plm_example
from lmforge.data.pretraining import collate_plm
from lmforge.heads import build_model
from lmforge.models.loading import build_backbone

V = 300


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, V, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    return ids, mask


def _case(name: str, padded: bool = False):
    ids, mask = _padded()
    if not padded:
        mask = torch.ones_like(mask)
    if name == "bert-tiny sequence head":
        model = build_model(model_config_from_preset("bert-tiny", vocab_size=V),
                            {"type": "sequence_classification", "labels": ["a", "b", "c"]})
        return model, (ids,), {"attention_mask": None if not padded else mask}
    if name == "xlnet-tiny plm":
        batch = collate_plm([plm_example(np.asarray(row), rng=np.random.default_rng(i), special_mask=np.zeros(12, bool))
                             for i, row in enumerate(ids.tolist())], 0)
        return (build_backbone(model_config_from_preset("xlnet-tiny", vocab_size=V)), (batch["input_ids"],),
                {"perm_mask": batch["perm_mask"], "target_mapping": batch["target_mapping"], "return_logits": "query"})
    return (build_backbone(model_config_from_preset(name, vocab_size=V)), (ids,),
            {"attention_mask": None if not padded else mask})


def _explain(model, args, kwargs):
    import torch._dynamo as dynamo

    model.train()
    dynamo.reset()
    try:
        return dynamo.explain(model)(*args, **kwargs)
    finally:
        dynamo.reset()


FAMILIES = ["bert-tiny sequence head", "albert-mini", "electra-tiny", "gpt-nano", "transformer-xl-tiny"]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_transformer_family_without_padding_is_one_graph(name):
    explained = _explain(*_case(name))
    reasons = [str(r.reason).splitlines()[0] for r in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons


@pytest.mark.parametrize("name", [*FAMILIES, "xlnet-tiny plm"])
def test_no_break_comes_from_an_input_check_or_a_message(name):
    explained = _explain(*_case(name, padded=True))
    places = {Path(r.user_stack[-1].filename).name for r in explained.break_reasons if r.user_stack}
    assert not places & {"inputs.py", "positional.py", "masks.py"}, places


def test_the_eager_checks_still_run_outside_compile():
    from lmforge.errors import LmforgeError

    model = build_backbone(model_config_from_preset("bert-tiny", vocab_size=V))
    with pytest.raises(LmforgeError, match="token id 300 at"):
        model(torch.full((1, 4), V))


@pytest.mark.parametrize("name", ["bert-tiny", "xlnet-tiny"])
def test_varying_lengths_stop_recompiling_after_the_dynamic_shape(name):
    """No size is formatted into a message while tracing: after the automatic-dynamic recompile (PyTorch marks the
    changed sizes symbolic) new lengths and batch sizes reuse the graphs."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    model = build_backbone(model_config_from_preset(name, vocab_size=V)).train()
    compiled = torch.compile(model, backend=counter)
    frames = []
    try:
        for T, B in ((5, 4), (9, 4), (12, 3), (17, 4), (23, 2)):
            ids = torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(T))
            mask = torch.ones(B, T, dtype=torch.long)
            mask[0, T - 2:] = 0
            if name == "xlnet-tiny":
                batch = collate_plm([plm_example(np.asarray(r), rng=np.random.default_rng(i), num_predict=2,
                                                 special_mask=np.zeros(T, dtype=bool))
                                     for i, r in enumerate(ids.tolist())], 0)
                loss = compiled(batch["input_ids"], perm_mask=batch["perm_mask"],
                                target_mapping=batch["target_mapping"], return_logits="query").logits.sum()
            else:  # no padding: a padded batch's unpadding compiles per count of real tokens until it is dynamic
                loss = compiled(ids).last_hidden_state.sum()
            loss.backward()
            frames.append(counter.frame_count)
    finally:
        torch._dynamo.reset()
    assert frames[-1] == frames[2], frames


def _explain_one_graph(model, args, kwargs):
    """``dynamo.explain`` as ``compile_in_place`` traces: eval mode, no gradients, inside ``one_graph_capture``."""
    import torch._dynamo as dynamo

    from lmforge.nn.capture import one_graph_capture

    model.eval()
    dynamo.reset()
    try:
        with torch.no_grad(), one_graph_capture():
            return dynamo.explain(model)(*args, **kwargs)
    finally:
        dynamo.reset()


@pytest.mark.parametrize("name", ["bert-tiny sequence head", "albert-mini", "electra-tiny", "gpt-nano"])
def test_compiled_inference_is_one_graph_with_padding_too(name):
    """Compiled for inference (``compile_in_place``), a padded batch is one graph as well: unpadding's token count
    is captured as a size of the graph and the all-real-mask shortcut takes its general path; the same model
    compiled for training keeps its breaks there (the test above)."""
    model, args, kwargs = _case(name, padded=True)
    explained = _explain_one_graph(model, args, kwargs)
    reasons = [str(r.reason).splitlines()[0] for r in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons
    assert _explain(model, args, kwargs).graph_break_count > 0  # outside it: the per-batch choices break the graph


def test_one_graph_is_only_true_while_capturing_inside_the_context():
    from lmforge.nn.capture import one_graph, one_graph_capture

    with one_graph_capture():
        assert not one_graph()  # eager code inside the context still chooses per batch
    assert not one_graph()
