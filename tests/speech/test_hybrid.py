"""Hybrid decoding, strict mode: identical to Whisper's greedy `generate` whatever the fast decoder drafts."""

import pytest
import torch

from mmspec import SpeculativeDecoder
from mmspec.speech import CTCFastDecoder, HybridDrafter, WhisperTarget, hybrid_generate, hybrid_rule
from mmspec.speech.hybrid import hybrid_policy

from .conftest import MAX_NEW, assert_same

WRONG = [9, 10, 11]


def hypotheses(transcript):
    t = list(transcript)
    half = len(t) // 2
    return {
        "exact": t,
        "wrong_start": WRONG[:1] + t[1:],
        "wrong_start_3": WRONG + t[3:],
        "wrong_middle": t[:half] + WRONG[:1] + t[half + 1:],
        "wrong_middle_3": t[:half] + WRONG + t[half + 3:],
        "inserted_middle": t[:half] + WRONG[:2] + t[half:],
        "deleted_middle": t[:half] + t[half + 2:],
        "wrong_end": t[:-1] + WRONG[:1],
        "too_short": t[:half],
        "too_long": t + WRONG,
        "empty": [],
        "garbage": [5, 6] * 20,
        "shifted": t[2:],
    }


KINDS = list(hypotheses(range(10)))


@pytest.mark.parametrize("kind", KINDS)
def test_strict_equals_generate(whisper, references, fixed_hypothesis, kind):
    for x, sequences, transcript in references.values():
        out = hybrid_generate(whisper, fixed_hypothesis(hypotheses(transcript)[kind]), x, mode="strict", max_new_tokens=MAX_NEW)
        assert_same(out.sequences, sequences)
        assert out.stats.new_tokens == sequences.shape[1] - 4


def test_exact_hypothesis_takes_one_decoder_pass(whisper, references, fixed_hypothesis):
    for x, sequences, transcript in references.values():
        out = hybrid_generate(whisper, fixed_hypothesis(transcript), x, max_new_tokens=MAX_NEW)
        assert out.stats.target_forwards == 1  # prefill + whole-draft verification + end-of-text bonus
        assert out.stats.drafter_forwards == 1


def test_realignment_saves_passes(whisper, references, fixed_hypothesis):
    """One wrong token in the middle costs one extra pass, not the rest of the transcript."""
    for x, sequences, transcript in references.values():
        if len(transcript) < 8:
            continue
        for kind in ("wrong_middle", "inserted_middle", "wrong_start"):
            out = hybrid_generate(whisper, fixed_hypothesis(hypotheses(transcript)[kind]), x, max_new_tokens=MAX_NEW)
            assert out.stats.target_forwards <= 3, (kind, out.drafter.stats)


def test_random_ctc_head(whisper, references):
    torch.manual_seed(0)
    head = CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4, upsample=2).eval()
    head.head.bias.data[head.blank_id] = -5.0  # mostly non-blank frames: a long, wrong hypothesis
    for x, sequences, _ in references.values():
        out = hybrid_generate(whisper, head, x, max_new_tokens=MAX_NEW)
        assert_same(out.sequences, sequences)
        assert out.drafter.stats.hypothesis_length > 0


def test_encoder_runs_once(whisper, references, fixed_hypothesis):
    calls = []
    hook = whisper.get_encoder().register_forward_hook(lambda *args: calls.append(1))
    try:
        x, _, transcript = references[0]
        hybrid_generate(whisper, fixed_hypothesis(transcript[:3]), x, max_new_tokens=MAX_NEW)
        # Through the plain decoder object too (language detection inside the target).
        decoder = SpeculativeDecoder(WhisperTarget(whisper), HybridDrafter(fixed_hypothesis(transcript)), policy=hybrid_policy())
        decoder.generate(None, max_new_tokens=MAX_NEW, input_features=x)
    finally:
        hook.remove()
    assert len(calls) == 2


def test_long_drafts_are_allowed(whisper, references, fixed_hypothesis):
    x, sequences, transcript = references[2]
    double = fixed_hypothesis(transcript)
    decoder = SpeculativeDecoder(WhisperTarget(whisper), HybridDrafter(double), policy=hybrid_policy(64), rule=hybrid_rule("strict"))
    out = decoder.generate(None, max_new_tokens=MAX_NEW, input_features=x)
    assert_same(out.sequences, sequences)
    assert out.stats.drafted == len(transcript)


def test_relaxed_mode_runs_and_equals_strict_on_an_exact_hypothesis(whisper, references, fixed_hypothesis):
    for x, sequences, transcript in references.values():
        out = hybrid_generate(whisper, fixed_hypothesis(transcript), x, mode="relaxed", max_new_tokens=MAX_NEW)
        assert_same(out.sequences, sequences)
        wrong = hybrid_generate(whisper, fixed_hypothesis(hypotheses(transcript)["wrong_middle_3"]), x, mode="relaxed",
                                max_new_tokens=MAX_NEW)
        assert wrong.sequences.shape[1] <= 4 + MAX_NEW


def test_relaxed_mode_can_keep_a_near_tie(whisper, references, fixed_hypothesis):
    """With a huge margin and top_r, the relaxed rule accepts any finite-probability draft: the hypothesis wins."""
    x, sequences, transcript = references[0]
    hypothesis = hypotheses(transcript)["wrong_middle"]
    out = hybrid_generate(whisper, fixed_hypothesis(hypothesis), x, mode="relaxed", top_r=200, margin=1e9,
                          max_new_tokens=len(hypothesis) + 1)
    assert out.sequences[0, 4 : 4 + len(hypothesis)].tolist() == hypothesis
    assert out.stats.target_forwards == 1


def test_plain_core_call_with_prompt(references, fixed_hypothesis):
    """speculative_generate(model, HybridDrafter, None, input_features=..., decoder_input_ids=prompt) on a
    model without suppression settings: the core's own Target is then exact too, and the drafter shares
    the encoder output with it."""
    from mmspec import speculative_generate

    from .tiny_whisper import features, tiny_whisper

    model = tiny_whisper(suppress=False)
    x = features(5)
    expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
    transcript = expected[0, 4:].tolist()
    calls = []
    hook = model.get_encoder().register_forward_hook(lambda *args: calls.append(1))
    try:
        out = speculative_generate(model, HybridDrafter(fixed_hypothesis(transcript[:5] + [9] + transcript[6:])), None,
                                   max_new_tokens=MAX_NEW, num_draft_tokens=64, input_features=x,
                                   decoder_input_ids=expected[:, :4])
    finally:
        hook.remove()
    assert_same(out.sequences, expected)
    assert len(calls) == 1


def test_vocabulary_mismatch_is_refused(whisper, references):
    from mmspec import MMSpecError

    head = CTCFastDecoder.for_target(whisper, hidden_size=16, intermediate_size=16, num_attention_heads=2)
    head.config.vocab_size = 99
    with pytest.raises(MMSpecError, match="vocabular"):
        hybrid_generate(whisper, head, references[0][0], max_new_tokens=4)
