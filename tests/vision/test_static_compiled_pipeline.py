"""The captioner with `compile=True`: the same greedy captions as the model's own `generate`, every method."""

import pytest

from mmspec import MMSpecError
from mmspec import static_target as st
from mmspec.static_steps import StaticSteps
from mmspec.vision.pipeline import CaptionPipeline

from .test_pipeline import frames, tiny_captioner_folder  # noqa: F401  (fixtures)


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
    shared = st._WRAPPERS[pipe.model]
    assert all(isinstance(target, StaticSteps) for target in shared.values())


def test_compiled_lists_caption_one_at_a_time(pipe, frames):  # noqa: F811
    with pytest.raises(MMSpecError, match="one item at a time"):
        pipe(video=[frames, frames], max_new_tokens=4, method="text", progress_bar=False, compile=True, batch_size=2)
