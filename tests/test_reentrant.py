"""One decoder serves several calls at once: a call keeps its state in its own `DecodeState` and working copies
of the target and drafter, never on the shared objects, so two threads give what two sequential calls give."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from mmspec import SpeculativeDecoder
from mmspec.drafters import ModelDrafter
from mmspec.testing import tiny_llama
from mmspec.trees import TreeConfig

PROMPTS = [torch.tensor([[1, 17, 5, 44, 9, 61, 23, 8]]), torch.tensor([[1, 70, 71, 72, 33, 12]])]
BATCH = torch.tensor([[1, 17, 5, 44, 9, 61, 23, 8], [0, 0, 1, 70, 71, 72, 33, 12]])
BATCH_MASK = torch.tensor([[1] * 8, [0, 0] + [1] * 6])


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(seed=0, initializer_range=0.3, eos_token_id=3)
    small = tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3, eos_token_id=3)
    return target, small


def snapshot(obj: Any, depth: int = 3) -> dict[str, Any]:
    """An object's attributes: plain values as they are, other objects by identity, mmspec objects opened."""
    state: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if value is None or isinstance(value, (bool, int, float, str)):
            state[name] = value
        elif (depth and type(value).__module__.startswith("mmspec") and hasattr(value, "__dict__")
              and not isinstance(value, torch.nn.Module)):
            state[name] = snapshot(value, depth - 1)
        else:
            state[name] = (type(value).__name__, id(value), len(value) if isinstance(value, (list, dict, set)) else None)
    return state


def snapshots(decoder: SpeculativeDecoder) -> tuple[dict[str, Any], ...]:
    return snapshot(decoder), snapshot(decoder.target), snapshot(decoder.drafter)


CASES = {
    "chain": ({}, None),
    "sampled": ({"do_sample": True, "temperature": 1.3}, None),
    "tree": ({}, TreeConfig(num_nodes=8, top_k=2, depth=3)),
}


@pytest.mark.parametrize("case", [*CASES, "batch"])
def test_a_call_leaves_decoder_target_and_drafter_untouched(models, case):
    target, small = models
    settings, tree = CASES.get(case, ({}, None))
    decoder = SpeculativeDecoder(target, ModelDrafter(small), tree=tree)
    before = snapshots(decoder)
    during: list[tuple[dict[str, Any], ...]] = []

    def look(*_: Any) -> None:
        during.append(snapshots(decoder))

    if case == "batch":
        decoder.generate(BATCH, attention_mask=BATCH_MASK, max_new_tokens=10, on_tokens=look)
    else:
        decoder.generate(PROMPTS[0], max_new_tokens=10, on_round=look, generator=torch.Generator().manual_seed(0),
                         **settings)
    assert during and all(seen == before for seen in during)
    assert snapshots(decoder) == before


def decode(decoder: SpeculativeDecoder, prompt: torch.Tensor, sampled: bool, pause: bool) -> list[int]:
    # The pause after each round hands the interpreter to the other thread mid-call.
    def yield_now(_: int) -> None:
        if pause:
            time.sleep(0.001)

    kwargs: dict[str, Any] = {"do_sample": True, "generator": torch.Generator().manual_seed(7)} if sampled else {}
    out = decoder.generate(prompt, max_new_tokens=16, on_tokens=yield_now, **kwargs)
    return out.sequences[0].tolist()


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_two_threads_through_one_decoder_match_sequential_calls(models, sampled):
    target, small = models
    decoder = SpeculativeDecoder(target, ModelDrafter(small))
    expected = [decode(decoder, prompt, sampled, pause=False) for prompt in PROMPTS]
    for _ in range(3):
        results: list[Any] = [None, None]
        start = threading.Barrier(2)

        def run(i: int, results: list[Any] = results, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                results[i] = decode(decoder, PROMPTS[i], sampled, pause=True)
            except Exception as error:  # noqa: BLE001 - reported below as a mismatch
                results[i] = error

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == expected
