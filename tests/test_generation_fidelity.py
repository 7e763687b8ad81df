"""The core equals `generate` as users call it: the target's generation config in force, sliding
windows, encoder-decoder drafters, strict acceptance, unknown arguments refused, streamers."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, MistralConfig, T5Config

from mmspec import MMSpecError, PromptLookupDrafter, SamplingConfig, speculative_generate
from mmspec.generation import resolve_generation
from mmspec.rules import speculative_sampling
from mmspec.testing import NeverAgreeDrafter, assert_greedy_equal, reload_from_disk, tiny_llama
from mmspec.types import Proposal

PROMPT = torch.tensor([[1, 17, 5, 44, 9, 61, 23, 8, 30, 12]])


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, initializer_range=0.3, eos_token_id=3)


@pytest.fixture(scope="module")
def small():
    return tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3, eos_token_id=3)


def drafters(model, small):
    return {"self": model, "never": NeverAgreeDrafter(model), "small": small, "lookup": PromptLookupDrafter()}


# --- the target's generation config is in force -----------------------------------------------

SETTINGS = {
    "repetition_penalty": {"repetition_penalty": 1.5},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 1},
    "bad_words_ids": {"bad_words_ids": [[13], [89, 88]]},
    "min_length": {"min_length": 30, "eos_token_id": 36},
    "min_new_tokens": {"min_new_tokens": 18, "eos_token_id": 36},
    "suppress_tokens": {"suppress_tokens": [13, 88]},
    "begin_suppress_tokens": {"begin_suppress_tokens": [2]},
    "sequence_bias": {"sequence_bias": {(13,): -10.0, (88, 24): -10.0}},
    "forced_eos_token_id": {"forced_eos_token_id": 3},
    "exponential_decay_length_penalty": {"exponential_decay_length_penalty": (5, 3.0), "eos_token_id": 36},
    "renormalize_logits": {"renormalize_logits": True},  # argmax-neutral: must simply not break anything
    "combined": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "min_new_tokens": 18, "suppress_tokens": [88],
                 "bad_words_ids": [[89]], "eos_token_id": 36},
}
GREEDY_NEUTRAL = {"renormalize_logits"}


def with_generation_config(model, **settings):
    """A copy of `model` whose shipped generation config carries `settings` (saved and reloaded)."""
    copy = reload_from_disk(model)
    for name, value in settings.items():
        setattr(copy.generation_config, name, value)
    return copy


# Four settings in the fast tier (one of them all at once); each one in the slow tier.
@pytest.mark.parametrize("name", [n if n in ("combined", "repetition_penalty", "suppress_tokens", "min_new_tokens")
                                  else pytest.param(n, marks=pytest.mark.slow) for n in sorted(SETTINGS)])
def test_generation_config_settings_are_in_force(target, small, name):
    model = with_generation_config(target, **SETTINGS[name])
    plain = with_generation_config(target, eos_token_id=SETTINGS[name].get("eos_token_id", 3))
    expected = model.generate(PROMPT, do_sample=False, max_new_tokens=24)
    if name not in GREEDY_NEUTRAL:
        changed = not torch.equal(plain.generate(PROMPT, do_sample=False, max_new_tokens=24), expected)
        assert changed, "the setting must change the output, or the test proves nothing"
    for kind, drafter in drafters(model, small).items():
        assert_greedy_equal(model, drafter, PROMPT, max_new_tokens=24, num_draft_tokens=4)


@pytest.mark.parametrize("name", ["repetition_penalty", "no_repeat_ngram_size", "min_new_tokens", "combined"])
def test_call_arguments_override_like_generate(target, small, name):
    settings = SETTINGS[name]
    expected = target.generate(PROMPT, do_sample=False, max_new_tokens=24, **settings)
    out = speculative_generate(target, small, PROMPT, do_sample=False, max_new_tokens=24, num_draft_tokens=4, **settings)
    assert torch.equal(out.sequences, expected)


def test_max_new_tokens_defaults_like_generate(target):
    model = with_generation_config(target, max_new_tokens=7)
    expected = model.generate(PROMPT, do_sample=False)
    assert expected.shape[1] == PROMPT.shape[1] + 7
    assert torch.equal(speculative_generate(model, model, PROMPT).sequences, expected)
    plain = reload_from_disk(target)
    plain.generation_config.eos_token_id = None
    expected = plain.generate(PROMPT, do_sample=False)  # max_length 20 by default
    assert torch.equal(speculative_generate(plain, plain, PROMPT).sequences, expected)


def test_sampling_defaults_come_from_the_generation_config(target):
    model = with_generation_config(target, do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    settings, _ = resolve_generation(model, {})
    assert settings.sampling == SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8)
    settings, _ = resolve_generation(model, {"do_sample": False})
    assert settings.sampling == SamplingConfig()
    # generate's global default top_k=50 applies when sampling and nothing sets it
    settings, _ = resolve_generation(target, {"do_sample": True})
    assert settings.sampling.top_k == 50


@pytest.mark.slow
def test_sampled_distribution_with_processors(target):
    """Lossless sampling with a repetition penalty in force: exact law of 2 tokens vs draws (and a control)."""
    from mmspec.testing import assert_distribution_preserved

    model = with_generation_config(tiny_llama(vocab_size=12, seed=3, initializer_range=0.6, eos_token_id=None),
                                   repetition_penalty=3.0, do_sample=True, top_k=None)
    prompt = torch.tensor([[1, 4, 7]])
    with torch.inference_mode():
        continuations = torch.cartesian_prod(torch.arange(12), torch.arange(12))
        full = torch.cat([prompt.expand(len(continuations), -1), continuations], dim=1)
        logits = model(full).logits[:, 2:4].float()
        processors = model._get_logits_processor(model.generation_config, input_ids_seq_length=3, device="cpu")
        probs = torch.stack([processors(full[:, : 3 + j], logits[:, j].clone()).softmax(-1) for j in range(2)], dim=1)
        law = probs.gather(-1, continuations[..., None]).squeeze(-1).double().prod(-1)
    expected = {tuple(c.tolist()): float(p) for c, p in zip(continuations, law) if p > 0}
    drafter = tiny_llama(vocab_size=12, seed=4, initializer_range=0.6, eos_token_id=None)

    def draw(generator):
        out = speculative_generate(model, drafter, prompt, max_new_tokens=2, num_draft_tokens=2, generator=generator)
        return tuple(out.sequences[0, 3:].tolist())

    assert_distribution_preserved(draw, expected, 3000)
    unpenalised = reload_from_disk(model)
    unpenalised.generation_config.repetition_penalty = 1.0

    def wrong(generator):
        out = speculative_generate(unpenalised, drafter, prompt, max_new_tokens=2, num_draft_tokens=2, generator=generator)
        return tuple(out.sequences[0, 3:].tolist())

    with pytest.raises(AssertionError):
        assert_distribution_preserved(wrong, expected, 3000)


# --- sliding-window caches --------------------------------------------------------------------

def tiny_mistral(seed: int, layers: int = 2, hidden: int = 64, window: int = 16):
    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           sliding_window=window, initializer_range=0.3, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    return reload_from_disk(AutoModelForCausalLM.from_config(config))


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 4, pytest.param(9, marks=pytest.mark.slow)])
def test_sliding_window_target_and_drafter(k):
    target, small = tiny_mistral(0), tiny_mistral(1, layers=1, hidden=32)
    expected = target.generate(PROMPT, do_sample=False, max_new_tokens=30)
    assisted = target.generate(PROMPT, do_sample=False, max_new_tokens=30, assistant_model=small)
    assert torch.equal(assisted, expected)
    for drafter in (target, NeverAgreeDrafter(target), small, PromptLookupDrafter()):
        assert_greedy_equal(target, drafter, PROMPT, max_new_tokens=30, num_draft_tokens=k)


def test_sliding_window_prompt_longer_than_the_window():
    target, small = tiny_mistral(0), tiny_mistral(1, layers=1, hidden=32)
    prompt = torch.arange(4, 40)[None]  # 36 tokens, window 16: the prefill itself slides
    assert_greedy_equal(target, small, prompt, max_new_tokens=20, num_draft_tokens=5)
    assert_greedy_equal(target, target, prompt, max_new_tokens=20, num_draft_tokens=5)


# --- encoder-decoder drafters run their own encoder ---------------------------------------------

def tiny_t5(seed: int, d_model: int, layers: int):
    torch.manual_seed(seed)
    config = T5Config(vocab_size=61, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=layers, num_heads=4,
                      decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, initializer_factor=3.0)
    return reload_from_disk(AutoModelForSeq2SeqLM.from_config(config))


def test_seq2seq_drafter_of_another_width():
    target, drafter = tiny_t5(0, d_model=32, layers=2), tiny_t5(1, d_model=16, layers=1)
    encoder_ids = torch.tensor([[5, 9, 14, 3, 22, 40, 1]])
    out = assert_greedy_equal(target, drafter, encoder_ids, max_new_tokens=20, num_draft_tokens=4,
                              attention_mask=torch.ones_like(encoder_ids))
    assert out.stats.drafter_forwards > 0


def test_whisper_drafter_of_another_width():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from .speech.tiny_whisper import features, tiny_whisper

    target = tiny_whisper(seed=0)
    config = WhisperConfig(**{**target.config.to_dict(), "d_model": 32, "decoder_layers": 1, "encoder_layers": 1})
    torch.manual_seed(5)
    drafter = reload_from_disk(WhisperForConditionalGeneration(config))
    drafter.generation_config = target.generation_config
    x = features(1)
    expected = target.generate(x, do_sample=False, max_new_tokens=12, return_dict_in_generate=True).sequences
    out = speculative_generate(target, drafter, None, input_features=x, do_sample=False, max_new_tokens=12,
                               decoder_input_ids=expected[:, :4], num_draft_tokens=3)
    assert torch.equal(out.sequences, expected)
    encoder_outputs = target.get_encoder()(x)
    with pytest.raises(MMSpecError, match="its own encoder"):
        speculative_generate(target, drafter, None, encoder_outputs=encoder_outputs, max_new_tokens=4,
                             decoder_input_ids=expected[:, :4])


# --- strict acceptance ----------------------------------------------------------------------------

def test_zero_probability_draft_is_never_accepted(monkeypatch):
    """With u exactly 0, `u * q <= p` would accept a token the target gives probability 0."""
    monkeypatch.setattr("mmspec.rules.rand", lambda shape, generator, device: torch.zeros(shape, device=device))
    logits = torch.tensor([[[0.0, 0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0, 0.0]]])
    proposal = Proposal(tokens=torch.tensor([[2]]), probs=torch.tensor([[[0.0, 0.0, 1.0, 0.0]]]))
    verdict = speculative_sampling(proposal, logits, SamplingConfig(do_sample=True), torch.Generator().manual_seed(0))
    assert int(verdict.num_accepted[0]) == 0
    assert int(verdict.next_token[0]) != 2


# --- arguments: refused when unknown or unsupported; streamer -------------------------------------

@pytest.mark.parametrize("argument, message", [
    ({"num_beams": 4}, "num_beams"),
    ({"max_new_token": 64}, "max_new_token"),
    ({"foo": 1}, "foo"),
    ({"num_return_sequences": 2}, "num_return_sequences"),
    ({"guidance_scale": 3.0}, "guidance_scale"),
    ({"do_sample": True, "min_p": 0.1}, "min_p"),
    ({"stopping_criteria": [lambda *a: True]}, "stopping_criteria"),
])
def test_unknown_and_unsupported_arguments_are_refused(target, argument, message):
    with pytest.raises(MMSpecError, match=message):
        speculative_generate(target, target, PROMPT, max_new_tokens=4, **argument)


def test_shipped_unsupported_setting_is_named(target):
    model = with_generation_config(target, num_beams=3)
    with pytest.raises(MMSpecError, match="num_beams"):
        speculative_generate(model, model, PROMPT, max_new_tokens=4)


def test_streamer_receives_committed_tokens(target):
    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    out = speculative_generate(target, target, PROMPT, max_new_tokens=20, num_draft_tokens=4, streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == PROMPT[0].tolist()  # the prompt first, as generate puts it
    assert sum(streamer.chunks[1:], []) == out.sequences[0, PROMPT.shape[1]:].tolist()
    assert len(streamer.chunks) - 1 < out.stats.new_tokens  # several tokens per round


def test_text_streamer_prints_the_continuation(target, capsys):
    from transformers import TextStreamer

    class Tok:  # the part of a tokenizer TextStreamer uses
        def decode(self, ids, **kwargs):
            return "".join(f"<{i}>" for i in ids)

    out = speculative_generate(target, target, PROMPT, max_new_tokens=8, streamer=TextStreamer(Tok(), skip_prompt=True))
    printed = capsys.readouterr().out
    assert printed.strip() == "".join(f"<{i}>" for i in out.sequences[0, PROMPT.shape[1]:].tolist())
