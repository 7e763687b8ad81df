"""At int8 and bfloat16 a decoder prefill attends in one call per attention layer (greedy decoding's prefill makes
the same call), drafts never ride along with it, and hybrid strict still equals that precision's greedy `generate`
with a long prompt (the previous text of long audio)."""

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

from mmspec.decoding import SpeculativeDecoder
from mmspec.speech import precision
from mmspec.speech.hybrid import hybrid_drafter_for, hybrid_policy, hybrid_rule
from mmspec.speech.precision import apply_compute_type
from mmspec.speech.target import WhisperTarget

from .conftest import assert_same
from .test_compute_types import inputs_for, model_at
from .tiny_whisper import LANG_EN, NO_TIMESTAMPS, PREV, SOT, TRANSCRIBE, tiny_whisper

ROW_ATTENTION_TYPES = ("int8", "bfloat16")
PROMPT = [PREV, *range(10, 40), SOT, LANG_EN, TRANSCRIBE, NO_TIMESTAMPS]  # 30 tokens of "previous text", then the prompt


def counted_calls(monkeypatch):
    calls = []
    plain = precision.sdpa_attention_forward

    def counting(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return plain(module, query, *args, **kwargs)

    monkeypatch.setattr(precision, "sdpa_attention_forward", counting)
    return calls


@pytest.mark.parametrize("compute_type", ROW_ATTENTION_TYPES)
def test_a_prefill_attends_in_one_call_per_attention_and_later_rows_one_by_one(compute_type, monkeypatch):
    model, _ = model_at(compute_type)
    layers = model.config.decoder_layers
    with torch.inference_mode():
        states = model.get_encoder()(inputs_for(model, 0)).last_hidden_state
        calls = counted_calls(monkeypatch)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        decoder = model.get_decoder()
        decoder(input_ids=torch.tensor([PROMPT]), encoder_hidden_states=states, cache=cache, use_cache=True)
        assert calls == [len(PROMPT)] * (2 * layers)  # self- and cross-attention of each layer: one call each
        calls.clear()
        decoder(input_ids=torch.tensor([[50, 51, 52]]), encoder_hidden_states=states, cache=cache, use_cache=True)
        assert calls == [1] * (2 * layers * 3)  # a verification's rows: one call per row, as greedy's one-token steps


@pytest.mark.parametrize("compute_type", ROW_ATTENTION_TYPES)
def test_drafts_do_not_join_a_row_attention_prefill(compute_type):
    drafts = torch.tensor([[10, 11]])
    assert WhisperTarget(tiny_whisper(0)).drafts_can_join_prefill(drafts, {})
    assert not WhisperTarget(apply_compute_type(tiny_whisper(0), compute_type)).drafts_can_join_prefill(drafts, {})


@pytest.mark.parametrize("compute_type", ROW_ATTENTION_TYPES)
def test_hybrid_equals_greedy_after_a_long_prompt(compute_type):
    model, fast = model_at(compute_type)
    prompt = torch.tensor([PROMPT])
    drafted = 0
    for seed in range(3):
        x = inputs_for(model, seed)
        limit = model.config.max_target_positions - len(PROMPT)
        expected = model.generate(x, decoder_input_ids=prompt, do_sample=False, max_new_tokens=limit,
                                  return_dict_in_generate=True).sequences
        decoder = SpeculativeDecoder(WhisperTarget(model), hybrid_drafter_for(fast), policy=hybrid_policy(),
                                     rule=hybrid_rule("strict"))
        out = decoder.generate(None, max_new_tokens=limit, decoder_input_ids=prompt, input_features=x)
        assert_same(out.sequences, expected)
        drafted += out.stats.drafted
    assert drafted > 0
