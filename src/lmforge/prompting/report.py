"""``FewShotReport``: what ``fewshot_evaluate`` measured, as rows, JSON and a picture."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.utils.io import atomic_write_text

__all__ = ["FewShotReport"]


@dataclass
class FewShotReport:
    """Accuracy per number of demonstrations K.

    Attributes:
        rows: one dict per K, in the order of ``config.shots``: ``shots``, ``accuracy_mean``, ``accuracy_std``
            (sample standard deviation over the draws; 0 with one draw), ``accuracies`` (one per draw),
            ``dropped_demos`` (demonstrations dropped for length, all draws), ``n_test``.
        config: the ``FewShotConfig`` as a dict.
        labels: the candidate labels, in scoring order.
        chance: 1 / number of labels (classify mode), else None.
        majority: the accuracy of always answering the test set's most common label.
        predictions: K -> per test example of the first draw: index, line, label, prediction, correct, the
            demonstrations shown (training indices), and the label scores and probabilities (classify) or the
            generated text (generate).
        n_train: the size of the demonstration pool.
        cut_queries: prompts whose query alone was too long and was cut from the left (all K and draws).
    """

    rows: list[dict[str, Any]]
    config: dict[str, Any]
    labels: list[str]
    chance: float | None
    majority: float
    predictions: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    n_train: int = 0
    cut_queries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "labels": self.labels, "chance": self.chance, "majority": self.majority,
                "n_train": self.n_train, "cut_queries": self.cut_queries, "rows": self.rows,
                "predictions": {str(k): v for k, v in self.predictions.items()}}

    def save_json(self, path: str | Path) -> Path:
        """Write ``to_dict()`` as indented JSON, atomically; returns the path."""
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")
        return path

    def table(self) -> str:
        """The rows as an aligned text table: K, accuracy mean +- std, draws, dropped demonstrations."""
        lines = [f"{'K':>4}  {'accuracy':<17}  {'draws':>5}  {'dropped':>7}"]
        for row in self.rows:
            acc = f"{row['accuracy_mean']:.4f}"
            if len(row["accuracies"]) > 1:
                acc += f" ± {row['accuracy_std']:.4f}"
            lines.append(f"{row['shots']:>4}  {acc:<17}  {len(row['accuracies']):>5}  {row['dropped_demos']:>7}")
        extra = [f"majority {self.majority:.4f}"]
        if self.chance is not None:
            extra.insert(0, f"chance {self.chance:.4f}")
        lines.append(f"({', '.join(extra)}; {self.rows[0]['n_test'] if self.rows else 0} test examples)")
        return "\n".join(lines)

    def plot(self, path: str | Path, *, title: str | None = None) -> Path:
        """Write the accuracy-vs-K curve (error bars: std over draws; chance and majority lines) as a PNG."""
        from lmforge.viz.fewshot_plot import plot_fewshot

        return plot_fewshot(self.rows, path, chance=self.chance, majority=self.majority, title=title)
