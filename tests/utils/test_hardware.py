"""``lmforge.utils.hardware``: cache sizes read from a sysfs-like tree (the chunked kernels size their chunks by them),
with fall-backs where the tree cannot be read."""

from __future__ import annotations

from pathlib import Path

from lmforge.utils import hardware


def _index(root: Path, name: str, level: str, size: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "level").write_text(level + "\n", encoding="ascii")
    (folder / "size").write_text(size + "\n", encoding="ascii")


def test_each_level_reads_its_largest_cache(tmp_path):
    _index(tmp_path, "index0", "1", "48K")  # L1 data
    _index(tmp_path, "index1", "1", "32K")  # L1 instructions
    _index(tmp_path, "index2", "2", "2048K")
    _index(tmp_path, "index3", "3", "32M")
    _index(tmp_path, "index4", "2", "garbage")  # unreadable entries are skipped
    assert hardware._cache_sizes(tmp_path) == {1: 48 * 2**10, 2: 2 * 2**20, 3: 32 * 2**20}


def test_unreadable_trees_fall_back(tmp_path, monkeypatch):
    assert hardware._cache_sizes(tmp_path / "missing") == {}
    monkeypatch.setattr(hardware, "_cache_sizes", lambda root=None: {})
    assert hardware.l2_cache_bytes.__wrapped__() == hardware.FALLBACK_L2_BYTES
    assert hardware.last_level_cache_bytes.__wrapped__() == hardware.FALLBACK_CACHE_BYTES
    monkeypatch.setattr(hardware, "_cache_sizes", lambda root=None: {1: 2**15, 3: 2**25})  # no level 2
    assert hardware.l2_cache_bytes.__wrapped__() == hardware.FALLBACK_L2_BYTES
    assert hardware.last_level_cache_bytes.__wrapped__() == 2**25
