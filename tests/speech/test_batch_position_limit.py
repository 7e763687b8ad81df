"""A batch whose rows reach the decoder's last learned position at different rounds: drafts are capped by the row
with the least room, so no row is fed past Whisper's position table, and each row equals its own greedy `generate`."""

import torch

from mmspec.speech import hybrid_generate
from mmspec.speech.target import WhisperTarget

from .test_whisper_batches import PerRowHypotheses
from .tiny_whisper import MAX_TARGET_POSITIONS, features, tiny_whisper

PROMPT = 4
NEW = MAX_TARGET_POSITIONS - PROMPT - 1  # as many as Whisper's `generate` allows: up to its last position


def test_rows_at_the_position_limit_in_one_batch():
    model = tiny_whisper(0, eos_scale=0.0)  # a toy that never ends: every row runs to the limit
    inputs = [features(seed) for seed in (0, 1)]
    alone = [model.generate(x, do_sample=False, max_new_tokens=NEW, return_dict_in_generate=True).sequences[0]
             for x in inputs]
    assert all(row.shape[0] == PROMPT + NEW for row in alone)
    # row 0 has 40 tokens accepted with the prefill, row 1 two: then both get long drafts, row 0 with little room left
    rows = [alone[0][PROMPT:PROMPT + 40].tolist() + [5, 6] * 20, alone[1][PROMPT:PROMPT + 2].tolist() + [5, 6] * 20]
    out = hybrid_generate(WhisperTarget(model), PerRowHypotheses(rows), torch.cat(inputs), max_new_tokens=NEW)
    for row, expected in enumerate(alone):
        assert out.sequences[row, : expected.shape[0]].tolist() == expected.tolist()
