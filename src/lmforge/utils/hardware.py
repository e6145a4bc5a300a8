"""Facts about the CPU this process runs on, read once: the cache sizes and native bf16 arithmetic.

Kept here, below every model module, so that the kernels that size their chunks to the cache
(``lmforge.nn.kernels.linear_ce``, ``lmforge.nn.kernels.packed_dropout``) and the training code that picks a precision
(``lmforge.training.precision``, ``lmforge.training.logging``) read the same facts the same way.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

FALLBACK_CACHE_BYTES = 16 * 2**20  # where the cache size cannot be read (not Linux)


FALLBACK_L2_BYTES = 2**20  # where the level-2 cache cannot be read


CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")


def _cache_sizes(root: Path = CACHE_ROOT) -> dict[int, int]:
    """{cache level: the largest size at that level} of cpu0 as Linux reports it (sysfs); {} where unreadable."""
    sizes: dict[int, int] = {}
    for index in root.glob("index*"):
        try:
            text = (index / "size").read_text(encoding="ascii").strip().upper()
            level = int((index / "level").read_text(encoding="ascii").strip())
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes[level] = max(sizes.get(level, 0), int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return sizes


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes() -> int:
    """The largest CPU cache of cpu0 as Linux reports it (sysfs), else ``FALLBACK_CACHE_BYTES``."""
    return max(_cache_sizes().values(), default=0) or FALLBACK_CACHE_BYTES


@functools.lru_cache(maxsize=1)
def l2_cache_bytes() -> int:
    """cpu0's level-2 cache (one core's own on current x86 CPUs), else ``FALLBACK_L2_BYTES``."""
    return _cache_sizes().get(2, 0) or FALLBACK_L2_BYTES


def native_cpu_bf16() -> bool | None:
    """True when the CPU has AVX512_BF16 or AMX tiles, False when it has neither, None when torch cannot tell."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not all(callable(check) for check in checks):
        return None
    return any(check() for check in checks)
