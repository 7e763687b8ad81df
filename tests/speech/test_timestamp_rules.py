"""`BatchedTimestampRules` gives exactly the scores of transformers' `WhisperTimeStampLogitsProcessor` (the per-row
loop it replaces): random batches of prefixes and scores, and the edge cases of the rules."""

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from mmspec.speech.timestamp_rules import BatchedTimestampRules

VOCAB, EOS, NO_TIMESTAMPS = 90, 30, 40
BEGIN = NO_TIMESTAMPS + 1


def config(max_initial: int | None) -> GenerationConfig:
    settings = {"max_initial_timestamp_index": max_initial} if max_initial is not None else {}
    return GenerationConfig(eos_token_id=EOS, bos_token_id=EOS, no_timestamps_token_id=NO_TIMESTAMPS, **settings)


def check(ids: torch.Tensor, scores: torch.Tensor, begin_index: int, max_initial: int | None, detect: bool) -> None:
    reference = WhisperTimeStampLogitsProcessor(config(max_initial), begin_index, _detect_timestamp_from_logprob=detect)
    ours = BatchedTimestampRules(config(max_initial), begin_index, _detect_timestamp_from_logprob=detect)
    expected = reference(ids.clone(), scores.clone())
    got = ours(ids.clone(), scores.clone())
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected), (ids.tolist(), begin_index, max_initial, detect)


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_score_alike(seed):
    generator = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 9, (1,), generator=generator))
    length = int(torch.randint(1, 14, (1,), generator=generator))
    stamp_share = float(torch.rand(1, generator=generator))  # from mostly text to mostly timestamps
    text = torch.randint(0, BEGIN, (rows, length), generator=generator)
    stamps = torch.randint(BEGIN, VOCAB, (rows, length), generator=generator)
    ids = torch.where(torch.rand(rows, length, generator=generator) < stamp_share, stamps, text)
    scores = torch.randn(rows, VOCAB, generator=generator) * 4
    scores[:, BEGIN:] += float(torch.randn(1, generator=generator)) * 6  # timestamps sometimes favoured as a whole
    scores[torch.rand(rows, VOCAB, generator=generator) < 0.05] = -float("inf")
    begin_index = int(torch.randint(0, length + 2, (1,), generator=generator))  # past the end too
    for max_initial in (None, 0, 5):
        for detect in (True, False):
            check(ids, scores, begin_index, max_initial, detect)


@pytest.mark.parametrize("tail", [[], [5], [BEGIN], [5, BEGIN], [BEGIN, BEGIN + 3], [BEGIN + 2, 5], [BEGIN + 7, 5, BEGIN + 7],
                                  [BEGIN + 9, 5, BEGIN + 4], [BEGIN + 4, BEGIN + 4, 6, 7], [VOCAB - 1], [5, VOCAB - 1]])
@pytest.mark.parametrize("prompt", [1, 3])
def test_rule_edges_score_alike(tail, prompt):
    """Empty prefix (the first position: only timestamps, `max_initial_timestamp_index`), a lone timestamp, pairs, text
    after a pair, a timestamp lower than an earlier one, the last timestamp; with different prompt lengths."""
    ids = torch.tensor([[1] * prompt + tail, [2] * prompt + list(reversed(tail))])
    generator = torch.Generator().manual_seed(len(tail) + prompt)
    for scale in (0.1, 8.0):
        scores = torch.randn(2, VOCAB, generator=generator) * scale
        for max_initial in (None, 3):
            for detect in (True, False):
                check(ids, scores, prompt, max_initial, detect)


def test_whisper_target_uses_the_batched_rules(whisper):
    from mmspec.speech.target import WhisperTarget

    target = WhisperTarget(whisper, timestamps=True)
    built = target.build_logits_processors(whisper.generation_config, 3, [])
    assert any(isinstance(p, BatchedTimestampRules) for p in built)


@pytest.mark.parametrize("vocab", [VOCAB, 51864])
def test_stacked_rows_score_as_rows_one_by_one(vocab):
    """Rows of one length are processed in one call (`Target._processed_batch`): Whisper's processors (suppression, the
    timestamp rules with their log-softmax) give each row the scores it gets alone."""
    from transformers.generation.logits_process import LogitsProcessorList

    from mmspec.generation import process_prefixed_rows
    from mmspec.speech.suppression import SuppressedTokens

    no_timestamps = vocab - 50 if vocab > VOCAB else NO_TIMESTAMPS
    settings = GenerationConfig(eos_token_id=EOS, bos_token_id=EOS, no_timestamps_token_id=no_timestamps,
                                max_initial_timestamp_index=5)
    processors = LogitsProcessorList([SuppressedTokens([1, 7], begin_index=3), SuppressedTokens([2, 9]),
                                      BatchedTimestampRules(settings, begin_index=3)])
    generator = torch.Generator().manual_seed(vocab)
    for length in (3, 4, 9):
        ids = torch.randint(0, vocab, (6, length), generator=generator)
        logits = torch.randn(6, 1, vocab, generator=generator) * 5
        together = process_prefixed_rows(processors, [ids], logits)
        alone = torch.cat([process_prefixed_rows(processors, [ids[b:b + 1]], logits[b:b + 1]) for b in range(6)])
        assert torch.equal(together, alone)


def test_a_batch_of_equal_rows_is_processed_in_one_call(whisper):
    """Greedy rows that started together have prefixes of one length: the processors run once per step, not per row."""
    from mmspec.ragged import RaggedBatch
    from mmspec.speech.target import WhisperTarget
    from mmspec.targets import TargetStep

    calls = []

    class Spy:
        def __call__(self, input_ids, scores):
            calls.append(input_ids.shape[0])
            return scores

    target = WhisperTarget(whisper, timestamps=True)
    target.processors = [Spy()]
    batch = RaggedBatch.__new__(RaggedBatch)
    tokens = torch.randint(0, 50, (3, 6))
    batch.tokens, batch.mask, batch.prompt_width = tokens, torch.ones(3, 6, dtype=torch.long), 4
    batch.rows = torch.arange(3)
    logits = torch.randn(3, 1, 60)
    out = target._processed_batch(TargetStep(logits=logits), batch, 5)
    assert calls == [3] and torch.equal(out.logits, logits.float())
    calls.clear()
    batch.mask = batch.mask.clone()
    batch.mask[1, 4] = 0  # a hole: that row's prefix is shorter, so rows are processed one by one
    target._processed_batch(TargetStep(logits=logits), batch, 5)
    assert calls == [1, 1, 1]
