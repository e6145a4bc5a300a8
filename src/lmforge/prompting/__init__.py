"""Prompting a causal language model: GPT-2 zero-shot and GPT-3 few-shot in-context learning.

    from lmforge.prompting import FewShotConfig, fewshot_evaluate
    report = fewshot_evaluate(model, tokenizer, train, test,
                              FewShotConfig(template="Review: {text}\\nSentiment: {label}",
                                            verbalizer={"pos": "positive", "neg": "negative"}, shots=(0, 4)))
    report.rows          # per K: shots, accuracy_mean, accuracy_std, accuracies, dropped_demos, n_test
    report.save_json("fewshot.json"); report.plot("fewshot.png")

``templates.py`` builds prompts (template, verbalizer, demonstrations, the ids a document starts with),
``scoring.py`` scores candidate answers left to right (sum / mean / unconditional) and calibrates (Zhao et al.
2021), ``fewshot.py`` runs the evaluation over K and draws, ``report.py`` holds the results.
"""

from __future__ import annotations

from lmforge.prompting.fewshot import (
    DEMOS,
    MODES,
    SCORINGS,
    FewShotConfig,
    content_free_inputs,
    cut_at_stop,
    fewshot_evaluate,
)
from lmforge.prompting.report import FewShotReport
from lmforge.prompting.scoring import (
    SUPPORTED_FAMILIES,
    CandidateScores,
    CausalLM,
    calibrate,
    causal_lm_for,
    label_probabilities,
    score_candidates,
    score_continuations,
)
from lmforge.prompting.templates import (
    Example,
    Prompt,
    PromptBuilder,
    PromptTemplate,
    as_examples,
    document_end_id,
    document_start_ids,
    draw_demonstrations,
    resolve_verbalizer,
)

__all__ = [
    "DEMOS", "MODES", "SCORINGS", "SUPPORTED_FAMILIES", "CandidateScores", "CausalLM", "Example", "FewShotConfig",
    "FewShotReport", "Prompt", "PromptBuilder", "PromptTemplate", "as_examples", "calibrate", "causal_lm_for",
    "content_free_inputs", "cut_at_stop", "document_end_id", "document_start_ids", "draw_demonstrations",
    "fewshot_evaluate", "label_probabilities", "resolve_verbalizer", "score_candidates", "score_continuations",
]
