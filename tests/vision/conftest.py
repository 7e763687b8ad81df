"""Fixtures for the vision adapter: tiny random VLMs built once per test run (the root conftest
already sets offline mode and one torch thread)."""

import pytest

from .tiny_vlms import Case, all_cases, text_drafter_lm


@pytest.fixture(scope="session")
def vlm_cases() -> dict[str, Case]:
    return all_cases()


@pytest.fixture(scope="session")
def text_lm():
    """A small random text-only LM with the VLMs' vocabulary: the TextOnlyDrafter's model."""
    return text_drafter_lm()
