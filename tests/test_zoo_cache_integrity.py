"""The user cache of derived zoo models: a corrupt entry (a flipped byte, a truncated file) is rebuilt, not
trusted, and a disk that fills while writing is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmspec.errors import MMSpecError
from mmspec.zoo import entries, resolve
from mmspec.zoo.derived import WEIGHTS, cached_build

needs_zoo = pytest.mark.skipif(not any(e.name == "shapes-caption-lm" for e in entries()), reason="needs the zoo")


@needs_zoo
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_cache_entry_is_rebuilt(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path / "cache"))
    folder = resolve("shapes-caption-lm")
    weights = Path(folder) / WEIGHTS
    good = weights.read_bytes()
    bad = bytearray(good)
    if damage == "flip":
        bad[len(bad) // 2] ^= 0xFF
    else:
        del bad[len(bad) // 2:]
    weights.write_bytes(bytes(bad))
    assert resolve("shapes-caption-lm") == folder
    assert weights.read_bytes() == good


def test_a_disk_that_fills_while_writing_is_one_error(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path / "cache"))

    def write(out):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    with pytest.raises(MMSpecError, match="cannot write zoo model 'toy'"):
        cached_build("toy", "0" * 64, write)
