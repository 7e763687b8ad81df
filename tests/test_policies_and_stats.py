import pytest

from mmspec import (
    ConfidenceStopDraftLength,
    HeuristicDraftLength,
    MMSpecError,
    SpecStats,
    make_policy,
    speculative_generate,
)


def test_heuristic_schedule_matches_transformers():
    policy = HeuristicDraftLength(5)
    policy.update(5, 5)
    assert policy.max_tokens() == 7
    policy.update(7, 3)
    assert policy.max_tokens() == 6
    for _ in range(10):
        policy.update(policy.max_tokens(), 0)
    assert policy.max_tokens() == 1
    assert policy.fresh().max_tokens() == 5


def test_confidence_stop():
    policy = ConfidenceStopDraftLength(8, threshold=0.5)
    assert policy.keep_drafting(0.6) and not policy.keep_drafting(0.4)


def test_adaptive_policy_drafts_fewer_when_unsure(target, prompt):
    # A random tiny LM is never confident: a high threshold stops after one draft each round.
    out = speculative_generate(target, target, prompt, max_new_tokens=16, policy=ConfidenceStopDraftLength(8, threshold=0.99))
    assert len(out.stats.position_attempts) == 1  # never a second draft in a round


def test_unknown_policy():
    with pytest.raises(MMSpecError, match="unknown draft-length policy"):
        make_policy("magic", 4)


def test_stats_bookkeeping():
    stats = SpecStats()
    stats.record_round(drafted=4, accepted=2)
    stats.record_round(drafted=4, accepted=4)
    stats.new_tokens, stats.target_forwards = 9, 3
    assert stats.alpha == 6 / 8
    assert stats.tau == 3.0
    assert stats.position_attempts == [2, 2, 2, 1]
    assert stats.per_position_acceptance == [1.0, 1.0, 0.5, 1.0]
    total = stats + stats
    assert total.drafted == 16 and total.position_accepts == [4, 4, 2, 2]
    assert {"tau", "alpha", "tokens_per_second", "per_position_acceptance"} <= set(stats.to_dict())


def test_plain_decoding_has_tau_one(target, prompt):
    from mmspec.testing import NeverAgreeDrafter

    out = speculative_generate(target, NeverAgreeDrafter(target), prompt, max_new_tokens=10)
    assert out.stats.tau == 1.0 and out.stats.alpha == 0.0


def test_raw_models_get_their_adapters_target():
    from mmspec.targets import as_target
    from mmspec.testing import tiny_llama

    assert type(as_target(tiny_llama())).__name__ == "Target"
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(vision_config=CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                        num_attention_heads=2, image_size=28, patch_size=14),
                         text_config=LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2), image_token_id=49)
    assert type(as_target(LlavaForConditionalGeneration(config))).__name__ == "VisionTarget"
