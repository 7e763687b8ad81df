"""Values read from a model card or passed as a seed that are of the wrong type or out of range are one
MMSpecError naming them, not a ValueError / OverflowError from int() or torch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmspec.errors import MMSpecError
from mmspec.sampling import seeded_generator
from mmspec.zoo import entries, resolve

needs_zoo = pytest.mark.skipif(not any(e.name == "shapes-video-captioner" for e in entries()), reason="needs the zoo")


@needs_zoo
@pytest.mark.parametrize("vocab_size", ["many", None, 0, 2.5, True])
def test_a_card_vocab_size_that_is_not_a_count_is_named(tmp_path, vocab_size):
    folder = tmp_path / "model"
    folder.mkdir()
    spec = {"model": "shapes-video-captioner", "language_model": True, "vocab_size": vocab_size}
    (folder / "zoo_card.json").write_text(json.dumps({"name": "odd", "derived_from": spec}))
    with pytest.raises(MMSpecError, match="derived_from.vocab_size must be an integer"):
        resolve(str(folder))


@pytest.mark.parametrize("seed", [10**30, -(2**64), 1.5, "7", True])
def test_a_seed_outside_torchs_range_or_not_an_integer_is_named(seed):
    with pytest.raises(MMSpecError, match="seed must be an integer"):
        seeded_generator("cpu", seed)


@pytest.mark.parametrize("seed", [0, 2**64 - 1, np.int64(7), -1])
def test_seeds_torch_takes_still_work(seed):
    first, again = seeded_generator("cpu", seed), seeded_generator("cpu", seed)
    assert first.initial_seed() == again.initial_seed()
