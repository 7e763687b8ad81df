"""After speculative rounds with rejections, the cache equals a fresh prefill of the committed tokens."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, T5Config

from mmspec import Target
from mmspec.testing import reload_from_disk


def assert_caches_equal(a, b):
    assert a.get_seq_length() == b.get_seq_length()
    for layer_a, layer_b in zip(a.layers, b.layers):
        torch.testing.assert_close(layer_a.keys, layer_b.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(layer_a.values, layer_b.values, rtol=1e-4, atol=1e-5)


def test_decoder_only_rollback_matches_fresh_prefill(target, prompt):
    wrapped = Target(target)
    with torch.inference_mode():
        wrapped.start(prompt)
        committed = prompt
        for drafts, keep in [([5, 6, 7, 8], 1), ([9, 10], 2), ([11, 12, 13], 0)]:
            block = torch.tensor([[drafts[0] + 20, *drafts]])
            wrapped.verify(block[:, :1], block[:, 1:])
            # keep the fed last token plus `keep` drafts, drop the rest
            committed = torch.cat([committed, block[:, : 1 + keep]], dim=1)
            wrapped.truncate(committed.shape[1])
        fresh = Target(target)
        fresh.start(committed)
    assert_caches_equal(wrapped.cache, fresh.cache)


def tiny_t5():
    torch.manual_seed(0)
    config = T5Config(vocab_size=61, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                      decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    return reload_from_disk(AutoModelForSeq2SeqLM.from_config(config))


def test_encoder_decoder_rollback_keeps_cross_attention():
    model = tiny_t5()
    encoder_ids = torch.tensor([[5, 9, 14, 3, 1]])
    wrapped = Target(model)
    with torch.inference_mode():
        decoder = wrapped.initial_sequence(encoder_ids, model_inputs := {})
        wrapped.start(decoder, **model_inputs)
        wrapped.verify(torch.tensor([[7]]), torch.tensor([[8, 9, 10]]))
        wrapped.truncate(3)
        fresh = Target(model)
        fresh.start(torch.tensor([[0, 7, 8]]), input_ids=encoder_ids)
    assert_caches_equal(wrapped.cache.self_attention_cache, fresh.cache.self_attention_cache)
    assert_caches_equal(wrapped.cache.cross_attention_cache, fresh.cache.cross_attention_cache)


def test_processors_set_after_the_prefill_are_refused(target, prompt):
    # Without processors at the prefill the target keeps no fed tokens, so processors set later could not
    # see their prefixes: refused instead of applied to nothing.
    from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    from mmspec import MMSpecError

    wrapped = Target(target)
    with torch.inference_mode():
        wrapped.start(prompt)
        wrapped.processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
        with pytest.raises(MMSpecError, match="after its prefill"):
            wrapped.verify(prompt, torch.tensor([[5, 6]]))
