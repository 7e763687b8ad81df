"""Fixtures for the speech adapter: tiny random Whisper models built once per test run (the root
conftest already sets offline mode and one torch thread)."""

import pytest
import torch

from .tiny_whisper import EOT, features, tiny_whisper

PROMPT_LENGTH = 4  # <|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>
MAX_NEW = 40


@pytest.fixture(scope="session")
def whisper():
    return tiny_whisper()


@pytest.fixture(scope="session")
def references(whisper):
    """Whisper's own greedy `generate` for a few inputs: {seed: (features, sequences, transcript)}."""
    refs = {}
    for seed in range(6):
        x = features(seed)
        sequences = whisper.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        transcript = sequences[0, PROMPT_LENGTH:].tolist()
        if transcript and transcript[-1] == EOT:
            transcript = transcript[:-1]
        refs[seed] = (x, sequences, transcript)
    return refs


class FixedHypothesis:
    """Test double of the fast decoder: always returns the given hypothesis."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.calls = 0

    def hypothesis(self, encoder_hidden_states):
        self.calls += 1
        assert encoder_hidden_states.dim() == 3
        return [list(self.tokens)]


@pytest.fixture
def fixed_hypothesis():
    return FixedHypothesis


def assert_same(out_sequences: torch.Tensor, expected: torch.Tensor) -> None:
    if not torch.equal(out_sequences, expected):
        raise AssertionError(f"differs from whisper.generate:\n  expected {expected[0].tolist()}\n  got      {out_sequences[0].tolist()}")
