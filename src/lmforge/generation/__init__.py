"""Text generation for decoder-only and encoder-decoder models: greedy search, beam search, sampling.

    from lmforge.generation import generate
    out = generate(model, input_ids, attention_mask, strategy="beam", num_beams=4, num_return_sequences=2,
                   length_penalty="gnmt:0.6", eos_id=tokenizer.sep_id, max_new_tokens=30)
    out.sequences[i][j]   # new token ids of hypothesis j of input i, best first, without the stop token

``config.py`` holds the settings (``GenerationConfig``) and the result (``GenerationOutput``), ``processors.py`` the
logits processors (repetition penalty, n-gram blocking, temperature, top-k, top-p), ``adapters.py`` how each model
family starts and steps (with or without the key/value cache), ``search.py`` the search loops.
"""

from __future__ import annotations

from lmforge.generation.adapters import (
    DecoderAdapter,
    EncoderDecoderAdapter,
    GenerationAdapter,
    ModelAdapter,
    RecurrentAdapter,
    XLNetAdapter,
    adapter_for,
)
from lmforge.generation.config import GenerationConfig, GenerationOutput, length_penalty
from lmforge.generation.processors import (
    NoRepeatNGram,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
    build_processors,
    build_warpers,
)
from lmforge.generation.search import beam_search, generate, greedy_or_sample

__all__ = [
    "DecoderAdapter", "EncoderDecoderAdapter", "GenerationAdapter", "GenerationConfig", "GenerationOutput",
    "ModelAdapter", "NoRepeatNGram", "RecurrentAdapter", "RepetitionPenalty", "Temperature", "TopK", "TopP",
    "XLNetAdapter", "adapter_for", "beam_search", "build_processors", "build_warpers", "generate", "greedy_or_sample",
    "length_penalty",
]
