"""Losses that need a model and a batch; each follows the contract of ``lmforge.objectives.base``."""

from lmforge.objectives.base import ObjectiveOutput
from lmforge.objectives.causal_lm import CausalLMObjective
from lmforge.objectives.masked_lm import MaskedLMObjective, mlm_objective_for
from lmforge.objectives.seq2seq import Seq2SeqObjective

__all__ = ["CausalLMObjective", "MaskedLMObjective", "ObjectiveOutput", "Seq2SeqObjective", "mlm_objective_for"]
