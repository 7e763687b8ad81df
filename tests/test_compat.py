"""Canaries for every private transformers / diffusers / accelerate internal mmspec uses (`mmspec.compat`):
each fails loudly when the installed library changes the internal, and a missing internal raises
`CompatibilityError` (naming it and the versions) instead of quietly doing less."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler, DiffusionPipeline
from transformers import (
    DynamicCache,
    EncoderDecoderCache,
    GenerationConfig,
    GenerationMixin,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    StaticCache,
)
from transformers.generation import logits_process as lp

from mmspec import MMSpecError, compat, speculative_generate
from mmspec.compat import CompatibilityError
from mmspec.generation import build_logits_processors, resolve_generation
from mmspec.testing import tiny_llama

PROMPT = torch.tensor([[1, 17, 5, 44, 9, 61, 23, 8]])


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, initializer_range=0.3, eos_token_id=3)


def processors_for(model, **settings):
    resolved, _ = resolve_generation(model, settings)
    resolved.fix_lengths(PROMPT.shape[1], 10)
    return build_logits_processors(model, resolved.config, PROMPT.shape[1], resolved.user_processors)


# --- canaries: the internal is there and does what mmspec relies on -------------------------------------------

def test_prepare_generation_config_merges_the_models_config(model):
    model.generation_config.repetition_penalty = 1.3
    try:
        config, leftover = compat.prepare_generation_config(model, None, {"top_k": 7, "pixel_values": 1})
    finally:
        model.generation_config.repetition_penalty = None
    assert config.repetition_penalty == 1.3 and config.top_k == 7 and leftover == {"pixel_values": 1}


def test_get_logits_processor_builds_generates_processors(model):
    built = processors_for(model, repetition_penalty=1.5, no_repeat_ngram_size=2, suppress_tokens=[4])
    kinds = {type(p) for p in built}
    assert {lp.RepetitionPenaltyLogitsProcessor, lp.NoRepeatNGramLogitsProcessor, lp.SuppressTokensLogitsProcessor} <= kinds


def test_get_logits_processor_serves_a_model_without_generate():
    class NoGenerate(PreTrainedModel):
        config_class = LlamaConfig

        def __init__(self, config):
            super().__init__(config)
            self.linear = torch.nn.Linear(2, 2)

    plain = NoGenerate(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2))
    assert not isinstance(plain, GenerationMixin)
    config = GenerationConfig(repetition_penalty=1.2)
    compat.set_eos_token_tensor(config, [], torch.device("cpu"))
    built = compat.get_logits_processor(plain, config, prompt_length=3, encoder_input_ids=None, user_processors=[],
                                        device=torch.device("cpu"))
    assert [type(p) for p in built] == [lp.RepetitionPenaltyLogitsProcessor]


def test_eos_token_tensor_reaches_the_min_length_processors(model):
    built = processors_for(model, min_new_tokens=4, eos_token_id=[3, 5])
    minimum = [p for p in built if isinstance(p, lp.MinNewTokensLengthLogitsProcessor)]
    assert len(minimum) == 1 and minimum[0].eos_token_id.tolist() == [3, 5]
    scores = minimum[0](PROMPT, torch.zeros(1, model.config.vocab_size))
    assert scores[0, 3] == float("-inf") and scores[0, 5] == float("-inf") and scores[0, 4] == 0


def test_eos_token_tensor_reads_what_set_eos_token_tensor_gave(model):
    config = GenerationConfig()
    assert compat.eos_token_tensor(config) is None
    compat.set_eos_token_tensor(config, [3, 5], torch.device("cpu"))
    assert compat.eos_token_tensor(config).tolist() == [3, 5]


def test_compile_on_every_device_sets_generates_flag():
    from transformers import CompileConfig

    config = CompileConfig(dynamic=False)
    compat.compile_on_every_device(config)
    assert config._compile_all_devices is True
    assert "_compile_all_devices" not in config.to_dict()  # transformers still treats it as its private flag


def test_flash_layer_config_keeps_the_drafters_attention_kernel():
    from mmspec.vision.flash_model import FlashConfig

    config = FlashConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_attention_heads=2)
    compat.set_attention_implementation(config, "eager")
    assert compat.attention_implementation(config.layer_config()) == "eager"
    compat.set_attention_implementation(config, "flash_attention_2")  # a kernel the drafter's layer cannot take
    assert compat.attention_implementation(config.layer_config()) == "sdpa"


def test_attention_implementation_reads_and_sets_the_kernel():
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    compat.set_attention_implementation(config, "eager")
    assert compat.attention_implementation(config) == "eager"
    assert compat.attention_implementation(LlamaForCausalLM(config).config) == "eager"


def test_keep_cache_positions_rewrites_every_dynamic_layer():
    cache = DynamicCache()
    for layer in range(2):
        keys = torch.arange(6.0).view(1, 1, 6, 1).repeat(1, 2, 1, 3) + layer
        cache.update(keys, keys * 10, layer)
    compat.keep_cache_positions(cache, torch.tensor([0, 2, 5]))
    assert cache.get_seq_length() == 3
    assert cache.layers[1].keys[0, 0, :, 0].tolist() == [1.0, 3.0, 6.0]
    assert cache.layers[1].values[0, 0, :, 0].tolist() == [10.0, 30.0, 60.0]


def test_cache_layers_reads_every_dynamic_layer():
    cache = DynamicCache()
    for layer in range(2):
        keys = torch.arange(4.0).view(1, 1, 4, 1) + layer
        cache.update(keys, keys * 10, layer)
    layers = compat.cache_layers(cache)
    assert len(layers) == 2 and layers[1][0][0, 0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert layers[1][1][0, 0, :, 0].tolist() == [10.0, 20.0, 30.0, 40.0]


def test_changed_cache_layers_are_refused_when_read():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 0)
    cache.layers[0] = object()
    with pytest.raises(CompatibilityError, match="keys"):
        compat.cache_layers(cache)
    with pytest.raises(CompatibilityError, match="layers"):
        compat.cache_layers(object())


def static_cache_holding(positions, capacity):
    config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2)
    cache = StaticCache(config=config, max_cache_len=capacity)
    for layer in range(2):
        keys = torch.arange(float(positions)).view(1, 1, positions, 1).repeat(1, 2, 1, 4) + layer
        cache.update(keys, keys * 10, layer)
    return config, cache


def test_copy_static_cache_moves_states_and_length():
    config, small = static_cache_holding(5, 8)
    small.crop(-2)  # holds 3: the stale slots past it are not copied
    large = StaticCache(config=config, max_cache_len=16)
    compat.copy_static_cache(small, large, 3)
    assert int(large.get_seq_length()) == 3 and large.get_max_length() == 16
    assert large.layers[1].keys[0, 0, :4, 0].tolist() == [1.0, 2.0, 3.0, 0.0]
    assert large.layers[1].values[0, 0, :3, 0].tolist() == [10.0, 20.0, 30.0]



def test_reset_static_cache_sets_every_length_and_keeps_the_tensors():
    _, cache = static_cache_holding(5, 8)
    keys = cache.layers[0].keys
    compat.reset_static_cache(cache)
    assert int(cache.get_seq_length()) == 0 and cache.layers[0].keys is keys
    assert [int(layer.cumulative_length) for layer in cache.layers] == [0, 0]
    compat.reset_static_cache(cache, 4)
    assert [int(layer.cumulative_length) for layer in cache.layers] == [4, 4]


def test_write_static_cache_fills_the_first_positions_of_each_layer():
    config, _ = static_cache_holding(1, 8)
    cache = StaticCache(config=config, max_cache_len=6)  # not initialised yet: the write initialises it
    states = [(torch.full((1, 2, 6, 4), float(layer)), torch.full((1, 2, 6, 4), 10.0 + layer)) for layer in range(2)]
    compat.write_static_cache(cache, states)
    assert int(cache.get_seq_length()) == 6
    assert torch.equal(cache.layers[1].keys, states[1][0]) and torch.equal(cache.layers[0].values, states[0][1])
    _, held = static_cache_holding(5, 8)
    compat.write_static_cache(held, [(k[:, :, :3], v[:, :, :3]) for k, v in states])  # over older states
    assert int(held.get_seq_length()) == 3 and held.layers[1].keys[0, 0, :4, 0].tolist() == [1.0, 1.0, 1.0, 4.0]
    with pytest.raises(MMSpecError, match="3 layers"):
        compat.write_static_cache(held, states + states[:1])

def cross_filled(layers):
    cross = DynamicCache()
    for index in range(layers):
        cross.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), index)
    return cross


def test_cross_attention_flags_are_what_transformers_sets_and_clears():
    # transformers flags a layer whose cross-attention states the cache already holds, and clears the flags on reset.
    cache = EncoderDecoderCache(DynamicCache(), cross_filled(2))
    assert compat.cross_attention_flags(cache) == {0: True, 1: True}
    cache.reset()
    assert compat.cross_attention_flags(cache) == {0: False, 1: False}


def test_cross_attention_flags_are_marked_set_and_forgotten():
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    compat.mark_cross_attention_filled(cache, 2)
    assert compat.cross_attention_flags(cache) == {0: True, 1: True}
    compat.set_cross_attention_flags(cache, {1: False, 2: True})
    assert compat.cross_attention_flags(cache) == {0: True, 1: False, 2: True}
    read = compat.cross_attention_flags(cache)
    read[0] = False  # a copy: the cache's own flags do not change with it
    assert compat.cross_attention_flags(cache)[0] is True
    compat.forget_cross_attention(cache)
    assert compat.cross_attention_flags(cache) == {0: False, 1: False, 2: False}


def test_missing_cross_attention_flags_are_refused():
    cache = EncoderDecoderCache(DynamicCache(), cross_filled(1))
    del cache.is_updated
    calls = (lambda: compat.cross_attention_flags(cache), lambda: compat.set_cross_attention_flags(cache, {0: True}),
             lambda: compat.mark_cross_attention_filled(cache, 1), lambda: compat.forget_cross_attention(cache))
    for call in calls:
        with pytest.raises(CompatibilityError, match=r"EncoderDecoderCache\.is_updated.*transformers \d") as refused:
            call()
        assert "Whisper" in str(refused.value)


def test_skip_keys_device_placement_is_a_model_attribute(model):
    # A causal LM names its cache argument: accelerate must not move the cache to the drafter's device.
    assert set(compat.skip_keys_device_placement(model)) & {"cache", "past_key_values"}


def test_mark_generation_config_explicit_survives_a_reload(tmp_path):
    config = GenerationConfig(no_repeat_ngram_size=3)
    compat.mark_generation_config_explicit(config)
    config.save_pretrained(tmp_path)
    assert GenerationConfig.from_pretrained(tmp_path).no_repeat_ngram_size == 3
    assert config._from_model_config is False


def test_accelerate_hook_is_found():
    from accelerate.hooks import ModelHook, add_hook_to_module

    module = torch.nn.Linear(2, 2)
    assert compat.accelerate_hook(module) is None
    hook = ModelHook()
    add_hook_to_module(module, hook)
    assert compat.accelerate_hook(module) is hook


def test_scheduler_variance_is_ddpms_posterior_variance():
    scheduler = DDPMScheduler(num_train_timesteps=50)
    scheduler.set_timesteps(50)
    t = 20
    alphas = scheduler.alphas_cumprod
    expected = (1 - alphas[t - 1]) / (1 - alphas[t]) * (1 - alphas[t] / alphas[t - 1])
    assert torch.allclose(compat.scheduler_variance(scheduler, t, "fixed_small"), expected.clamp(min=1e-20))


def test_progress_bar_settings_read_what_set_progress_bar_config_stored():
    pipe = DiffusionPipeline()
    assert compat.progress_bar_settings(pipe) == {}
    pipe.set_progress_bar_config(desc="mine", disable=True)
    settings = compat.progress_bar_settings(pipe)
    assert settings == {"desc": "mine", "disable": True}
    settings["desc"] = "changed"  # a copy: the pipeline's own settings stay
    assert compat.progress_bar_settings(pipe)["desc"] == "mine"


# --- a missing or changed internal raises one CompatibilityError, never a silent fallback ------------------------

def test_missing_get_logits_processor_is_refused(model, monkeypatch):
    monkeypatch.delattr(GenerationMixin, "_get_logits_processor")
    with pytest.raises(CompatibilityError, match=r"_get_logits_processor.*transformers \d"):
        processors_for(model, repetition_penalty=1.5)


def test_missing_prepare_generation_config_is_refused(model, monkeypatch):
    monkeypatch.delattr(GenerationMixin, "_prepare_generation_config")
    with pytest.raises(CompatibilityError, match="_prepare_generation_config"):
        speculative_generate(model, model, PROMPT, max_new_tokens=3)


def test_a_builder_that_drops_a_setting_is_refused(model, monkeypatch):
    # What a silent fallback would do: return no processors. A repetition penalty must not vanish.
    monkeypatch.setattr(GenerationMixin, "_get_logits_processor", lambda self, **kw: lp.LogitsProcessorList())
    with pytest.raises(CompatibilityError, match="repetition_penalty=1.5"):
        speculative_generate(model, model, PROMPT, max_new_tokens=3, repetition_penalty=1.5)


def test_missing_eos_token_tensor_is_refused(model, monkeypatch):
    monkeypatch.setattr(compat, "_logits_processor_source", lambda: "")
    with pytest.raises(CompatibilityError, match="_eos_token_tensor"):
        processors_for(model, min_new_tokens=2)


def test_missing_eos_token_tensor_read_is_refused(monkeypatch):
    monkeypatch.setattr(compat, "_logits_processor_source", lambda: "")
    with pytest.raises(CompatibilityError, match=r"_eos_token_tensor.*transformers \d"):
        compat.eos_token_tensor(GenerationConfig())


def test_missing_compile_all_devices_is_refused(monkeypatch):
    from transformers import CompileConfig

    monkeypatch.delattr(CompileConfig, "_compile_all_devices")
    with pytest.raises(CompatibilityError, match=r"_compile_all_devices.*transformers \d"):
        compat.compile_on_every_device(CompileConfig())


def test_missing_attention_implementation_is_refused(monkeypatch):
    from transformers import PretrainedConfig

    monkeypatch.delattr(PretrainedConfig, "_attn_implementation")
    with pytest.raises(CompatibilityError, match="_attn_implementation"):
        compat.attention_implementation(LlamaConfig())


def test_changed_cache_layers_are_refused():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 0)
    cache.layers[0] = object()
    with pytest.raises(CompatibilityError, match="keys"):
        compat.keep_cache_positions(cache, torch.tensor([0]))


def test_changed_static_cache_layers_are_refused():
    config, small = static_cache_holding(3, 8)
    large = StaticCache(config=config, max_cache_len=16)
    small.layers[0].cumulative_length = 3  # a plain number, as a changed StaticLayer might keep its length
    with pytest.raises(CompatibilityError, match="cumulative_length") as refused:
        compat.copy_static_cache(small, large, 3)
    message = str(refused.value)
    assert "compile=True" in message and compat.installed_versions() in message
    with pytest.raises(CompatibilityError, match="StaticCache.layers"):
        compat.copy_static_cache(object(), large, 3)



def test_changed_static_layers_are_refused_when_reset_or_written():
    _, cache = static_cache_holding(3, 8)
    cache.layers[1].cumulative_length = 3
    with pytest.raises(CompatibilityError, match="cumulative_length") as refused:
        compat.reset_static_cache(cache)
    assert "compile=True" in str(refused.value)
    with pytest.raises(CompatibilityError, match="cumulative_length"):
        compat.write_static_cache(cache, [(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))])
    cache.layers[0] = object()  # a layer that no longer initialises itself lazily
    with pytest.raises(CompatibilityError, match="lazy_initialization"):
        compat.write_static_cache(cache, [(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))])


def test_missing_scheduler_variance_is_refused(monkeypatch):
    monkeypatch.delattr(DDPMScheduler, "_get_variance")
    with pytest.raises(CompatibilityError, match="_get_variance"):
        compat.scheduler_variance(DDPMScheduler(num_train_timesteps=10), 3, "fixed_small")


def test_missing_progress_bar_config_is_refused(monkeypatch):
    monkeypatch.setattr(compat, "_progress_bar_source", lambda: "def set_progress_bar_config(self, **kw): pass")
    with pytest.raises(CompatibilityError, match="_progress_bar_config"):
        compat.progress_bar_settings(DiffusionPipeline())


def test_missing_skip_keys_is_refused(monkeypatch):
    monkeypatch.delattr(PreTrainedModel, "_skip_keys_device_placement")
    with pytest.raises(CompatibilityError, match="_skip_keys_device_placement"):
        compat.skip_keys_device_placement(torch.nn.Linear(1, 1))


def test_compatibility_error_is_an_mmspec_error():
    assert issubclass(CompatibilityError, MMSpecError)
