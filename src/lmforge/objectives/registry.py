"""The pretraining objectives: one registry entry each, the single source of their names.

An entry says everything the pretraining recipe needs, so that nothing else branches on an objective's name:

- ``arch``: the model family it trains (``"encoder"``, ``"decoder"``, ``"xlnet"``, ...);
- ``head``: the head spec put on the backbone (``None``: the backbone's own LM head), with options taken from the
  ``DataConfig`` by ``head_options``;
- ``plan``: how examples are cut from the prepared corpus (one of ``lmforge.data.instances.PLANS``: segment pairs
  with NSP labels, packed sentences, contiguous single segments, causal blocks);
- ``masking``: ``"config"`` (the run's ``data.masking``), a fixed strategy (SpanBERT's ``"span"``), or ``None``;
- ``loss``: builds the ``objective(model, batch)`` callable the Trainer runs, from the run's ``DataConfig`` (and, for
  an objective with ``loss_options``, an instance of them: ``loss(data, options)``);
- ``loss_options``: the dataclass of the objective's own loss settings (``--loss.X`` / a ``[loss]`` table: ELECTRA's
  ``rtd_weight``, the AWD-LSTM's ``ar_alpha`` / ``tar_beta``, Transformer-XL's ``eval_mem_len``), or None;
- ``fallback``: the objective used instead when the corpus is too small for this one (NSP needs two documents).
- ``check_model``: ``check_model(model_config, data_config)`` raises ``LmforgeError`` for a model of the right family
  that the objective still cannot train (Transformer-XL: bidirectional attention, no memory length); the recipe
  calls it before training starts.

Adding an objective = ``register_objective(PretrainingObjective(...))`` in its own file (imported by this module, or
by the user's code before the run); ``lmforge pretrain --objective NAME`` then offers it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.objectives.options import AWDLMLoss, BiLMLoss, ElectraLoss, TXLLoss


@dataclass(frozen=True)
class PretrainingObjective:
    """One pretraining objective (see the module docstring)."""

    name: str
    description: str
    arch: str
    plan: str
    # DataConfig -> objective(model, batch); (DataConfig, loss options) -> ... for an objective with loss_options
    loss: Callable[..., Callable]
    head: dict[str, Any] | None = None
    masking: str | None = "config"
    head_options: Callable[[Any], dict[str, Any]] = field(default=lambda data: {})
    fallback: str | None = None
    check_model: Callable[[Any, Any], None] | None = None
    loss_options: type | None = None

    def head_spec(self, data: Any) -> dict[str, Any] | None:
        """The head to put on the backbone for a run with this ``DataConfig``."""
        return None if self.head is None else {**self.head, **self.head_options(data)}

    def options(self, values: dict[str, Any] | None = None, where: str = "loss") -> Any:
        """The objective's loss options from ``values`` (the run's ``[loss]`` table; strict: an unknown key lists the
        valid ones); None for an objective without options.

        Raises:
            LmforgeError: a value is invalid, or options are given to an objective that has none.
        """
        if self.loss_options is None:
            if values:
                raise LmforgeError(f"{where}: objective {self.name!r} has no loss options (got "
                                   f"{', '.join(map(repr, values))}); objectives with loss options: "
                                   f"{', '.join(n for n, o in OBJECTIVES.items() if o.loss_options)}")
            return None
        from lmforge.config import from_dict

        return from_dict(self.loss_options, dict(values or {}), where=f"{where} (objective {self.name})")

    def build_loss(self, data: Any, values: dict[str, Any] | None = None) -> Callable:
        """The ``objective(model, batch)`` callable of a run with this ``DataConfig`` and ``[loss]`` table."""
        options = self.options(values)
        return self.loss(data) if self.loss_options is None else self.loss(data, options)

    def masking_for(self, data: Any) -> str | None:
        """The masking strategy of a run with this ``DataConfig``."""
        return data.masking if self.masking == "config" else self.masking


OBJECTIVES: dict[str, PretrainingObjective] = {}


def register_objective(objective: PretrainingObjective) -> PretrainingObjective:
    """Add ``objective`` to the registry (a name already taken is an error) and return it."""
    from lmforge.data.instances import PLANS

    if objective.name in OBJECTIVES:
        raise LmforgeError(f"a pretraining objective named {objective.name!r} is already registered")
    if objective.plan not in PLANS:
        raise LmforgeError(f"objective {objective.name!r}: plan {objective.plan!r} is not one of {', '.join(PLANS)}")
    OBJECTIVES[objective.name] = objective
    return objective


def get_objective(name: str) -> PretrainingObjective:
    """The registered objective ``name``; an unknown name is an error that lists the choices."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise LmforgeError(f"objective={name!r} is not one of {', '.join(OBJECTIVES)}") from None


def _masked_lm(**flags: Any) -> Callable[[Any], Callable]:
    def build(data: Any) -> Callable:
        from lmforge.objectives.masked_lm import MaskedLMObjective

        return MaskedLMObjective(**flags)

    return build


def _causal_lm(data: Any) -> Callable:
    from lmforge.objectives.causal_lm import CausalLMObjective

    return CausalLMObjective()


register_objective(PretrainingObjective(
    "mlm+nsp", "BERT (Devlin et al. 2019): masked LM + next-sentence prediction", arch="encoder", plan="nsp",
    head={"type": "pretraining"}, loss=_masked_lm(nsp=True), fallback="mlm"))
register_objective(PretrainingObjective(
    "mlm+sop", "ALBERT (Lan et al. 2020): masked LM + sentence-order prediction (consecutive segments, swapped or not)",
    arch="encoder", plan="sop", head={"type": "pretraining"}, loss=_masked_lm(nsp=True, pair_task="sop")))
register_objective(PretrainingObjective(
    "mlm", "RoBERTa (Liu et al. 2019): masked LM on packed full sentences", arch="encoder", plan="packed",
    head={"type": "mlm"}, loss=_masked_lm()))
register_objective(PretrainingObjective(
    "span", "SpanBERT (Joshi et al. 2020): span masking + span-boundary objective", arch="encoder",
    plan="segments", head={"type": "span"}, head_options=lambda data: {"max_span_len": data.max_span_len},
    masking="span", loss=_masked_lm(sbo=True)))
register_objective(PretrainingObjective(
    "clm", "GPT (Radford et al. 2018): causal LM on contiguous blocks", arch="decoder", plan="causal",
    head=None, masking=None, loss=_causal_lm))


def _bilm(data: Any, options: Any = None) -> Callable:
    from lmforge.objectives.bilm import BiLMObjective

    return BiLMObjective(carry_states=(options or BiLMLoss()).carry_states)


# plan "stream": consecutive windows of one stream, the backward LM's from the rows' ends (the recipe asks the data
# for both directions), each direction's LSTM state carried from window to window as bilm-tf trains
register_objective(PretrainingObjective(
    "bilm", "ELMo (Peters et al. 2018): forward + backward LSTM LMs, states carried across stream windows",
    arch="bilm", plan="stream", head=None, masking=None, loss=_bilm, loss_options=BiLMLoss))


def _awd_lm(data: Any, options: Any = None) -> Callable:
    from lmforge.objectives.awd_lm import AWDLMObjective

    options = options or AWDLMLoss()
    return AWDLMObjective(ar_alpha=options.ar_alpha, tar_beta=options.tar_beta)


# Its own entry rather than "clm": the family (awd_lstm), the data plan (a stream read in consecutive windows, not
# independent blocks) and the loss (which carries the LSTM state from batch to batch) all differ.
register_objective(PretrainingObjective(
    "awd_lm", "AWD-LSTM / ULMFiT (Merity et al. 2018; Howard & Ruder 2018): LSTM LM, stateful truncated BPTT",
    arch="awd_lstm", plan="stream", head=None, masking=None, loss=_awd_lm, loss_options=AWDLMLoss))


def _plm(data: Any) -> Callable:
    from lmforge.objectives.plm import PLMObjective

    return PLMObjective(reuse_len=getattr(data, "reuse_len", None))


def _check_plm(config: Any, data: Any = None) -> None:
    if getattr(config, "lm_stream", "query") != "query":
        raise LmforgeError("objective plm trains the query stream, so generation must read it: unset "
                           "--model.lm_stream (or set it to query)")
    if getattr(data, "reuse_len", None) is not None and getattr(config, "mem_len", None) is None:
        raise LmforgeError(f"data.reuse_len={data.reuse_len} carries the states of each sequence's first reuse_len "
                           "tokens to the next sequence as memory: set --model.mem_len too (XLNet: reuse_len 256, "
                           "mem_len 384); mem_len=None would keep the whole stream")


# XLNet's own LM head (head None) reads the query stream; no masking strategy: the plan "plm" draws the targets and the
# factorisation order (data.partial_k, data.plm_max_span, data.num_predict).
register_objective(PretrainingObjective(
    "plm", "XLNet (Yang et al. 2019): permutation LM, span targets (1/partial_k) in a random factorisation order",
    arch="xlnet", plan="plm", head=None, masking=None, loss=_plm, check_model=_check_plm))


def _txl(data: Any, options: Any = None) -> Callable:
    from lmforge.objectives.txl import TXLObjective

    return TXLObjective(eval_mem_len=(options or TXLLoss()).eval_mem_len)


def _check_txl(config: Any, data: Any) -> None:
    from lmforge.objectives.txl import check_txl_model

    check_txl_model(config, data)


# The XLNet family with causal attention, read as the AWD-LSTM's stream (plan "stream": each row continues the previous
# batch's row) so that the memory of a row's previous segment is the right context of its next one.
register_objective(PretrainingObjective(
    "txl", "Transformer-XL (Dai et al. 2019): causal LM over consecutive segments with memory", arch="xlnet",
    plan="stream", head=None, masking=None, loss=_txl, check_model=_check_txl,
    loss_options=TXLLoss))


def _denoise(data: Any) -> Callable:
    from lmforge.objectives.denoise import DenoisingObjective

    return DenoisingObjective()


# The encoder-decoder (its own LM head, head None) reads a corrupted text and writes the original; no masking strategy:
# plan "denoise" corrupts by DataConfig's rates (data.infill_rate, data.permute_sentences, data.rotate_prob, ...).
register_objective(PretrainingObjective(
    "denoise", "BART (Lewis et al. 2020): an encoder-decoder reconstructs the text from a corruption of it (text "
    "infilling + sentence permutation by default)", arch="seq2seq", plan="denoise", head=None, masking=None,
    loss=_denoise))


def _electra(data: Any, options: Any = None) -> Callable:
    from lmforge.objectives.electra import ElectraObjective

    return ElectraObjective(options=options or ElectraLoss())


# The discriminator is the backbone (what a saved run's folder loads as an encoder); the head holds the generator, which
# shares its embeddings, and both output heads. RoBERTa's packed full sentences, masked by the run's data.masking.
register_objective(PretrainingObjective(
    "electra", "ELECTRA (Clark et al. 2020): a small MLM generator fills the masked tokens, the discriminator detects "
    "which tokens were replaced (loss MLM + rtd_weight x BCE)", arch="encoder", plan="packed",
    head={"type": "electra"}, loss=_electra, loss_options=ElectraLoss))
