"""The compiled per-pair Word2Vec loop (``_sgns.c``), loaded with ctypes.

``train_chunk`` runs the reference algorithm of the C tool and gensim on one corpus chunk: every (context, centre)
pair (CBOW: every centre word) draws its own negatives and updates both tables at once, one pair after the
other. ctypes releases the GIL for the call, so several Python threads train at once on the shared tables
without locks (Hogwild!), as the C tool's threads do. The library is built when lmforge is installed (``setup.py``;
it needs a C compiler); ``available()`` says whether it was.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache

import numpy as np

from lmforge.errors import LmforgeError

_F32 = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_F64 = np.ctypeslib.ndpointer(np.float64, flags="C_CONTIGUOUS")
_I64 = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")

MISSING = ("Word2Vec's exact mode needs lmforge's compiled loop (lmforge/embeddings/_sgns.c), which was not built "
           "when lmforge was installed (no C compiler?); install a C compiler (gcc, clang or MSVC) and reinstall "
           "lmforge, or use the batched approximation: --mode fast")


@cache
def _library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("lmforge.embeddings._sgns")
    if spec is None or spec.origin is None:
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:
        return None
    lib.sgns_train_chunk.restype = ctypes.c_int
    lib.sgns_train_chunk.argtypes = [
        _F32, _F32, ctypes.c_int64, ctypes.c_int64,  # syn0, syn1, vocab, dim
        _I64, _I64, ctypes.c_int64,  # ids, sentence, n
        ctypes.c_void_p, _F64, _I64,  # keep_prob (or NULL), noise_prob, noise_alias
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,  # window, negative, cbow
        ctypes.c_double, ctypes.c_double, ctypes.c_uint64,  # lr_start, lr_end, seed
        _F64,  # out: [loss, pairs]
    ]
    lib.sgns_build_alias.restype = ctypes.c_int
    lib.sgns_build_alias.argtypes = [_F64, ctypes.c_int64, _F64, _I64]
    return lib


def available() -> bool:
    """Whether the compiled loop was built and loads."""
    return _library() is not None


def require() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise LmforgeError(MISSING)
    return lib


def alias_table(probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias table (prob (V,) float64, alias (V,) int64) of a distribution: a draw is
    ``k = floor(u V)``, then ``k`` if ``frac(u V) < prob[k]`` else ``alias[k]``, exact up to float64 rounding."""
    p = np.ascontiguousarray(probabilities, dtype=np.float64)
    p = p / p.sum()
    prob, alias = np.empty_like(p), np.empty(p.shape[0], dtype=np.int64)
    if require().sgns_build_alias(p, p.shape[0], prob, alias) != 0:
        raise MemoryError("no memory for the noise table")
    return prob, alias


def seed_of(*entropy: int) -> int:
    """A 64-bit seed for one chunk from (seed, epoch, chunk): independent streams for different chunks."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, np.uint64)[0])


def train_chunk(syn0: np.ndarray, syn1: np.ndarray, ids: np.ndarray, sentence: np.ndarray,
                keep_prob: np.ndarray | None, noise: tuple[np.ndarray, np.ndarray], *, window: int, negative: int,
                cbow: bool, lr_start: float, lr_end: float, seed: int) -> tuple[float, int]:
    """Train on one chunk in place; returns (summed loss, pairs) (CBOW: centre words with a context).

    Args:
        syn0, syn1: (V, D) float32 C-contiguous input and output tables, updated in place.
        ids, sentence: (n,) int64 vocabulary ids and sentence numbers (windows stop where the sentence changes).
        keep_prob: (V,) float64 subsampling keep probabilities, or None to keep every word.
        noise: ``alias_table`` of the noise distribution.
        window, negative: W (the dynamic window is drawn from 1..W) and K.
        cbow: CBOW (mean of the context) instead of skip-gram.
        lr_start, lr_end: the learning rate at the chunk's first word and after its last (linear in between).
        seed: the chunk's random stream (subsampling, windows, negatives).
    """
    lib = require()
    vocab, dim = syn0.shape
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    sentence = np.ascontiguousarray(sentence, dtype=np.int64)
    if ids.shape != sentence.shape or (ids.size and (ids.min() < 0 or ids.max() >= vocab)):
        raise LmforgeError(f"a chunk's ids must be in [0, {vocab}) and match its sentence numbers")
    keep_ptr = None
    if keep_prob is not None:
        keep_prob = np.ascontiguousarray(keep_prob, dtype=np.float64)
        keep_ptr = keep_prob.ctypes.data
    out = np.zeros(2, dtype=np.float64)
    status = lib.sgns_train_chunk(syn0, syn1, vocab, dim, ids, sentence, ids.shape[0], keep_ptr, noise[0], noise[1],
                                  window, negative, int(cbow), lr_start, lr_end, seed, out)
    if status != 0:
        raise MemoryError("no memory for a Word2Vec chunk; lower chunk_words")
    return float(out[0]), int(out[1])
