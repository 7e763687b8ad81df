"""One image pipeline serves two threads at once: each call's guidance scale, prompts and caches are its own,
so two threads with different settings give what the same two calls give one after the other."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mmspec.image_ar import JanusImagePipeline, SpeculativeImagePipeline

from .pipeline_checks import OPTIONS
from .tiny_class_conditional import mar_pipeline, var_pipeline
from .tiny_image_folder import build_tiny_folder
from .tiny_janus import build_janus_folder

# Two calls that differ in every per-call setting: conditions, guidance scale, seed.
LLAMAGEN_CALLS = [{"class_labels": [0, 2], "guidance_scale": 1.0, "seed": 3},
                  {"class_labels": [1, 0], "guidance_scale": 4.0, "seed": 5}]
JANUS_CALLS = [{"prompt": ["a red circle", "a blue square"], "guidance_scale": 1.0, "seed": 3},
               {"prompt": ["a green triangle", "a red square"], "guidance_scale": 4.0, "seed": 5}]


@pytest.fixture(scope="module")
def llamagen(tmp_path_factory):
    return SpeculativeImagePipeline.from_pretrained(build_tiny_folder(tmp_path_factory.mktemp("reentrant-llamagen")))


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    return JanusImagePipeline.from_pretrained(build_janus_folder(tmp_path_factory.mktemp("reentrant-janus")))


def generate(pipe: Any, call: dict[str, Any], method: str, temperature: float,
             meet: Any = None) -> list[list[list[int]]]:
    def on_round(index: int, info: Any) -> None:
        if meet is not None:
            meet()

    out = pipe(**call, method=method, temperature=temperature, output_type="np", progress_bar=False,
               callback_on_round=on_round, **OPTIONS.get(method, {}))
    return out.tokens.tolist()


def in_two_threads(pipe: Any, calls: list[dict[str, Any]], method: str, temperature: float) -> list[Any]:
    """Both calls at once. Each waits at its first round until the other has begun (its settings chosen), then the
    two interleave round by round, so a setting one call leaves on a shared object reaches the other's next image."""
    started = [threading.Event(), threading.Event()]
    results: list[Any] = [None, None]

    def run(i: int) -> None:
        def meet() -> None:
            started[i].set()
            started[1 - i].wait(timeout=30)
            time.sleep(0.001)  # hand the interpreter to the other thread

        try:
            results[i] = generate(pipe, calls[i], method, temperature, meet)
        except Exception as error:  # noqa: BLE001 - reported below as a mismatch
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize(("method", "temperature"), [("ar", 0.0), ("sjd", 1.0), ("sd", 1.0), ("lantern", 1.0)],
                         ids=["ar-greedy", "sjd-seeded", "sd-seeded", "lantern-seeded"])
def test_two_threads_through_one_llamagen_pipeline_match_sequential_calls(llamagen, method, temperature):
    expected = [generate(llamagen, call, method, temperature) for call in LLAMAGEN_CALLS]
    assert expected[0] != expected[1]
    assert in_two_threads(llamagen, LLAMAGEN_CALLS, method, temperature) == expected
    assert llamagen.runner.target.guidance_scale == llamagen.default_guidance_scale  # the shared target untouched


@pytest.mark.parametrize(("method", "temperature"), [("ar", 0.0), ("sjd", 1.0)], ids=["ar-greedy", "sjd-seeded"])
def test_two_threads_through_one_janus_pipeline_match_sequential_calls(janus, method, temperature):
    expected = [generate(janus, call, method, temperature) for call in JANUS_CALLS]
    assert expected[0] != expected[1]
    assert in_two_threads(janus, JANUS_CALLS, method, temperature) == expected


@pytest.mark.parametrize(("build", "method"), [(var_pipeline, "code"), (mar_pipeline, "cspd")], ids=["var", "mar"])
def test_two_threads_through_one_var_or_mar_pipeline_match_sequential_calls(build, method):
    """VAR and MAR keep a call's state in the call (a `VARState`, the masked loop's locals); this guards it."""
    pipe = build()
    calls = [{"class_labels": [0, 2], "guidance_scale": 1.0, "seed": 3},
             {"class_labels": [1, 0], "guidance_scale": 3.0, "seed": 5}]

    def run(call: dict[str, Any]) -> list:
        return pipe(**call, method=method, output_type="np", progress_bar=False).tokens.tolist()

    expected = [run(call) for call in calls]
    results: list[Any] = [None, None]
    start = threading.Barrier(2)

    def worker(i: int) -> None:
        start.wait()
        results[i] = run(calls[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert expected[0] != expected[1] and results == expected
