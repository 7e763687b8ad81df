"""The captioner with `compile=True`: the same greedy captions as the model's own `generate`, every method."""

import pytest
import torch

from mmspec import MMSpecError
from mmspec import static_target as st
from mmspec.static_steps import StaticSteps
from mmspec.vision.pipeline import CaptionPipeline

from .test_pipeline import frames, tiny_captioner_folder  # noqa: F401  (fixtures)
from .test_sparse_to_dense import tiny_llava  # noqa: F401  (fixture)


@pytest.fixture(autouse=True, scope="module")
def forget_compiled_graphs():
    """Every transformers forward runs through one decorator, whose code dynamo caches graphs under: this module's
    many graphs would leave later tests' compiled calls (transformers' own static-cache generate) no room."""
    yield
    torch._dynamo.reset()



@pytest.fixture(scope="module")
def pipe(tiny_captioner_folder):  # noqa: F811
    return CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter")


@pytest.mark.parametrize("method", ["ar", "text", "std"])
def test_compiled_captions_equal_generate(pipe, frames, method, monkeypatch):  # noqa: F811
    monkeypatch.setattr(st, "DEFAULT_BACKEND", "eager")  # the same graphs without inductor's code generation
    inputs = pipe.prepare_inputs(video=frames)
    expected = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=16)
    for _ in range(2):  # the second call reuses the first one's static target and caches
        seen = []
        out = pipe(video=frames, max_new_tokens=16, method=method, progress_bar=False, compile=True,
                   callback_on_round=lambda index, info: seen.append(index))
        assert out.sequences[0].tolist() == expected[0].tolist()
    shared = st.static_wrappers(pipe.model)
    assert shared
    assert all(isinstance(target, StaticSteps) for target in shared.values())


def test_compiled_lists_caption_one_at_a_time(pipe, frames):  # noqa: F811
    with pytest.raises(MMSpecError, match="one item at a time"):
        pipe(video=[frames, frames], max_new_tokens=4, method="text", progress_bar=False, compile=True, batch_size=2)


def test_bench_vision_compiled_twins(tiny_llava, monkeypatch):  # noqa: F811
    """`mmspec bench vision --compile`: a compiled twin of the greedy loop and each chain row, identical output."""
    from mmspec.testing import tiny_llama
    from mmspec.vision.bench import bench_vision

    from .test_bench_vision import inputs

    monkeypatch.setattr(st, "DEFAULT_BACKEND", "eager")
    drafter = tiny_llama(vocab_size=100, num_layers=1, hidden_size=32, seed=7)
    report, _ = bench_vision(tiny_llava, inputs(), drafter=drafter, max_new_tokens=8, repeats=1, std_settings=(),
                             progress=False, compiled=True)
    rows = {r.name: r for r in report.results}
    assert {"greedy-loop compiled", "text-only k=5 compiled"} <= set(rows)
    assert all(r.identical for r in rows.values())
    assert "compile_s[text-only k=5 compiled]" in report.settings
