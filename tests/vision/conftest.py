"""Fixtures for the vision adapter: tiny random VLMs built once per session (the root conftest
already sets offline mode and one torch thread)."""

import pytest

from .tiny_vlms import BUILDERS, Case, qwen2_vl_image, qwen2_vl_model, qwen2_vl_video, text_drafter_lm


@pytest.fixture(scope="session")
def vlm_cases() -> dict[str, Case]:
    cases = {name: build() for name, build in BUILDERS.items() if not name.startswith("qwen2vl")}
    qwen = qwen2_vl_model()
    cases["qwen2vl-image"] = qwen2_vl_image(model=qwen)
    cases["qwen2vl-video"] = qwen2_vl_video(model=qwen)
    return cases


@pytest.fixture(scope="session")
def text_lm():
    """A small random text-only LM with the VLMs' vocabulary: the TextOnlyDrafter's model."""
    return text_drafter_lm()
