"""The one-layer AR fast decoder (`ARFastDecoder`): drafting, strict hybrid decoding, save/load, the
pipeline's choice of fast decoder, and transformers' assisted generation with it as the assistant."""

import json
import shutil

import pytest
import torch
from transformers import WhisperForCausalLM

from mmspec import MMSpecError
from mmspec.decoding import SpeculativeDecoder
from mmspec.speech import ARFastDecoder, ARHybridDrafter, WhisperTarget, hybrid_drafter_for, load_audio
from mmspec.speech.ar_fast_decoder import check_ar_fast_decoder
from mmspec.speech.hybrid import HybridDrafter, hybrid_policy, hybrid_rule
from mmspec.speech.pipeline import TranscriptionPipeline
from mmspec.speech.target import encoder_outputs_of

from .conftest import MAX_NEW, PROMPT_LENGTH, assert_same
from .test_pipeline import greedy, speechy, write_wav
from .tiny_asr import make_asr_folder
from .tiny_whisper import BLANK, EOT, VOCAB, features, tiny_whisper


@pytest.fixture(scope="module")
def one_layer():
    """A one-layer target and its exact copy as fast decoder: the draft IS the greedy transcript."""
    model = tiny_whisper(decoder_layers=1)
    return model, ARFastDecoder.for_target(model)


def ar_hybrid(model, fast, x, mode="strict", max_new_tokens=MAX_NEW, drafter=None):
    target = WhisperTarget(model)
    decoder = SpeculativeDecoder(target, drafter or ARHybridDrafter(fast), policy=hybrid_policy(), rule=hybrid_rule(mode))
    inputs = {"input_features": x}
    prompt = target.prompt_ids(inputs)
    return decoder.generate(None, max_new_tokens=max_new_tokens, decoder_input_ids=prompt, **inputs)


def transcript_of(sequences):
    tokens = sequences[0, PROMPT_LENGTH:].tolist()
    return tokens[:-1] if tokens and tokens[-1] == EOT else tokens


def test_copy_of_a_one_layer_target_drafts_its_greedy_transcript(one_layer):
    model, fast = one_layer
    for seed in range(4):
        x = features(seed)
        expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        inputs = {"input_features": x}
        prompt = WhisperTarget(model).prompt_ids(inputs)
        states = encoder_outputs_of(model, inputs).last_hidden_state
        hypothesis = fast.hypothesis(states, prompt_ids=prompt, max_new_tokens=MAX_NEW)[0]
        assert hypothesis == transcript_of(expected)
        out = ar_hybrid(model, fast, x)
        assert_same(out.sequences, expected)
        # the whole transcript is accepted in the prefill's verification: one big-decoder pass
        assert out.stats.target_forwards == 1 and out.stats.drafted == out.stats.accepted
        assert out.stats.drafter_forwards == fast.last_steps >= 1


@pytest.mark.parametrize("layers", [1, 2])
def test_lean_steps_match_the_transformers_forward(whisper, layers):
    """LeanWhisperDecoder runs the same maths as WhisperForCausalLM: same logits, same hypothesis."""
    fast = ARFastDecoder.for_target(whisper, num_layers=layers, init_layer=-1)
    with torch.no_grad():  # distinct layers and a non-zero bias, so a swapped weight would show
        for p in fast.parameters():
            p.add_(0.02 * torch.randn_like(p))
    states = torch.cat([encoder_outputs_of(whisper, {"input_features": features(s)}).last_hidden_state for s in (0, 1)])
    head = fast.proj_out.weight
    lean, reference = fast._lean_steps(states, head), fast._transformers_steps(states, head, None)
    prompt = torch.tensor([[119, 120, 123, 124]] * 2)
    torch.testing.assert_close(lean(prompt), reference(prompt), rtol=1e-4, atol=1e-4)
    for token in (5, 17, 42):
        ids = torch.tensor([[token], [token + 1]])
        torch.testing.assert_close(lean(ids), reference(ids), rtol=1e-4, atol=1e-4)
    assert fast.hypothesis(states, prompt_ids=prompt[0], max_new_tokens=12) == fast.hypothesis(
        states, prompt_ids=prompt[0], max_new_tokens=12, lean=False)


@pytest.mark.parametrize("init_layer", [0, -1])
def test_strict_hybrid_with_the_ar_fast_decoder_equals_greedy(whisper, references, init_layer):
    fast = ARFastDecoder.for_target(whisper, init_layer=init_layer)
    for x, sequences, _ in references.values():
        out = ar_hybrid(whisper, fast, x)
        assert_same(out.sequences, sequences)
        assert out.stats.drafter_forwards >= 1
    relaxed = ar_hybrid(whisper, fast, references[0][0], mode="relaxed")
    assert relaxed.stats.new_tokens >= 1


def test_redraft_after_rejections_equals_greedy(whisper, references):
    """Re-drafting from the corrected transcript stays lossless, and happens after rejections."""
    fast = ARFastDecoder.for_target(whisper, init_layer=-1)
    total_redrafts = 0
    for x, sequences, _ in references.values():
        for cap in (None, 2):
            drafter = ARHybridDrafter(fast, redraft=True, redraft_tokens=cap)
            out = ar_hybrid(whisper, fast, x, drafter=drafter)
            assert_same(out.sequences, sequences)
            assert out.drafter.redrafts < out.stats.rounds  # at most one per round that followed a rejection
            total_redrafts += out.drafter.redrafts
    assert total_redrafts > 0  # a one-layer copy of a two-layer random model disagrees somewhere
    with pytest.raises(MMSpecError, match="redraft_tokens"):
        ARHybridDrafter(fast, redraft=True, redraft_tokens=0)


def test_initialised_from_the_target(whisper):
    fast = ARFastDecoder.for_target(whisper, init_layer=1)
    assert isinstance(fast, WhisperForCausalLM) and fast.config.decoder_layers == 1 and not fast.config.is_encoder_decoder
    decoder = whisper.model.decoder
    assert torch.equal(fast.model.decoder.embed_tokens.weight, decoder.embed_tokens.weight)
    assert torch.equal(fast.model.decoder.embed_positions.weight, decoder.embed_positions.weight)
    assert torch.equal(fast.model.decoder.layers[0].fc1.weight, decoder.layers[1].fc1.weight)
    assert torch.equal(fast.proj_out.weight, whisper.proj_out.weight)
    # suppression lives in draft_* fields only, so an HF assistant does not apply it twice
    assert fast.config.draft_begin_suppress_tokens == [BLANK, EOT] and fast.generation_config.begin_suppress_tokens is None
    with pytest.raises(MMSpecError, match="init_layer 5 is out of range"):
        ARFastDecoder.for_target(whisper, init_layer=5)


def test_save_and_load(whisper, tmp_path):
    fast = ARFastDecoder.for_target(whisper, prompt_ids=[119, 120, 123, 124])
    fast.save_pretrained(tmp_path)
    loaded = ARFastDecoder.from_pretrained(tmp_path).eval()
    states = encoder_outputs_of(whisper, {"input_features": features(2)}).last_hidden_state
    assert loaded.config.draft_prompt_ids == [119, 120, 123, 124]
    assert loaded.hypothesis(states) == fast.hypothesis(states)  # the config's prompt by default
    assert isinstance(WhisperForCausalLM.from_pretrained(tmp_path), WhisperForCausalLM)  # a plain transformers checkpoint


def test_plain_hybrid_drafter_refused_and_factory(whisper):
    fast = ARFastDecoder.for_target(whisper)
    assert isinstance(hybrid_drafter_for(fast), ARHybridDrafter)
    assert type(hybrid_drafter_for(object())) is HybridDrafter
    with pytest.raises(MMSpecError, match="needs an ARFastDecoder"):
        ARHybridDrafter(object())
    other = ARFastDecoder.for_target(tiny_whisper(decoder_layers=1))
    other.resize_token_embeddings(VOCAB + 2)
    with pytest.raises(MMSpecError, match="predicts 130 tokens"):
        check_ar_fast_decoder(other, whisper)


@pytest.fixture(scope="module")
def asr_both(tmp_path_factory):
    return make_asr_folder(tmp_path_factory.mktemp("asr-both"))


def test_pipeline_picks_the_fast_decoder_kind(asr_both, tmp_path):
    clip = write_wav(tmp_path / "clip.wav", speechy(0.8, seed=1))
    assert TranscriptionPipeline.from_pretrained(asr_both).fast_decoder_kind == "ctc"  # the default when both exist
    carded = tmp_path / "carded"
    shutil.copytree(asr_both, carded)
    (carded / "zoo_card.json").write_text(json.dumps({"default_fast_decoder": "ar"}))  # measured fastest
    assert TranscriptionPipeline.from_pretrained(carded).fast_decoder_kind == "ar"
    pipe = TranscriptionPipeline.from_pretrained(asr_both, fast_decoder="ar")
    assert pipe.fast_decoder_kind == "ar" and isinstance(pipe.make_drafter("hybrid"), ARHybridDrafter)
    out = pipe(clip, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False)
    assert out.chunks[0].tokens == greedy(pipe, load_audio(clip), MAX_NEW)
    assert out.chunks[0].tokens == pipe(clip, method="ar", max_new_tokens=MAX_NEW, progress_bar=False).chunks[0].tokens
    assert out.stats.drafter_forwards > 1  # every autoregressive draft step counts
    by_path = TranscriptionPipeline.from_pretrained(asr_both, fast_decoder=asr_both / "ar_fast_decoder")
    assert by_path.fast_decoder_kind == "ar"
    only_ar = make_asr_folder(tmp_path / "only-ar", ctc=False)
    assert TranscriptionPipeline.from_pretrained(only_ar).fast_decoder_kind == "ar"
    with pytest.raises(MMSpecError, match="has no ctc fast decoder"):
        TranscriptionPipeline.from_pretrained(only_ar, fast_decoder="ctc")
    with pytest.raises(MMSpecError, match="holds a full Whisper model"):
        TranscriptionPipeline.from_pretrained(asr_both, fast_decoder=asr_both)


def test_hf_assisted_generation_with_the_ar_fast_decoder(one_layer):
    """transformers 5.x: a decoder-only WhisperForCausalLM assistant reads the target's encoder output."""
    model, fast = one_layer
    seen = []
    encoder_calls = []
    enc_hook = model.get_encoder().register_forward_hook(lambda m, a, out: encoder_calls.append(out.last_hidden_state))
    asst_hook = fast.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("encoder_outputs")), with_kwargs=True)
    try:
        x = features(1)
        plain = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        plain_encoder_calls = len(encoder_calls)
        encoder_calls.clear()
        assisted = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, assistant_model=fast,
                                  return_dict_in_generate=True).sequences
    finally:
        enc_hook.remove()
        asst_hook.remove()
    assert torch.equal(assisted, plain)
    assert len(encoder_calls) == plain_encoder_calls  # no extra encoder pass for the assistant
    assert seen and all(s is not None for s in seen)
    states = [s[0] if isinstance(s, (tuple, list)) or hasattr(s, "last_hidden_state") else s for s in seen]
    assert all(s is encoder_calls[-1] for s in states)  # the very encoder output tensor the target decodes with


def test_hf_assisted_generation_drops_begin_suppress_tokens(one_layer):
    """Documents a transformers 5.x behaviour the bench reports: with an assistant, Whisper's generate
    clears begin_suppress_tokens, so the first token may be one plain greedy decoding forbids."""
    model, fast = one_layer
    x = features(0)
    first = model.generate(x, do_sample=False, max_new_tokens=4, return_dict_in_generate=True).sequences[0, PROMPT_LENGTH]
    saved = list(model.generation_config.begin_suppress_tokens)
    model.generation_config.begin_suppress_tokens = saved + [int(first)]
    try:
        plain = model.generate(x, do_sample=False, max_new_tokens=4, return_dict_in_generate=True).sequences
        assisted = model.generate(x, do_sample=False, max_new_tokens=4, assistant_model=fast, return_dict_in_generate=True).sequences
    finally:
        model.generation_config.begin_suppress_tokens = saved
    assert plain[0, PROMPT_LENGTH] != first and assisted[0, PROMPT_LENGTH] == first


def test_an_utterance_cache_continues_between_re_drafts(whisper):
    """A re-draft through an utterance cache equals a hypothesis drafted from scratch, and feeds only what is new."""
    from mmspec.speech.ar_fast_decoder import UtteranceCache

    fast = ARFastDecoder.for_target(whisper, init_layers=(1, 0))
    fast.config.draft_suppress_tokens = [EOT]  # never ends early: four drafts to accept and reject
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.02 * torch.randn_like(p))
    states = encoder_outputs_of(whisper, {"input_features": features(3)}).last_hidden_state
    prompt = [119, 120, 123, 124]
    draft_cache = UtteranceCache()
    first = fast.hypothesis(states, prompt_ids=prompt, max_new_tokens=4, draft_cache=draft_cache)[0]
    assert first == fast.hypothesis(states, prompt_ids=prompt, max_new_tokens=4)[0] and len(first) == 4
    assert draft_cache.fed == prompt + first[:-1] and draft_cache.state.length == len(draft_cache.fed)
    # two drafts accepted, then the target's own token: the cache keeps prompt + two drafts
    corrected = prompt + first[:2] + [7]
    second = fast.hypothesis(states, prompt_ids=corrected, max_new_tokens=3, draft_cache=draft_cache)[0]
    assert second == fast.hypothesis(states, prompt_ids=corrected, max_new_tokens=3)[0]
    assert fast.last_steps == 3 and draft_cache.fed == corrected + second[:-1]
    # a different utterance starts a new cache
    other = encoder_outputs_of(whisper, {"input_features": features(4)}).last_hidden_state
    third = fast.hypothesis(other, prompt_ids=prompt, max_new_tokens=3, draft_cache=draft_cache)[0]
    assert third == fast.hypothesis(other, prompt_ids=prompt, max_new_tokens=3)[0] and draft_cache.states is other
    with pytest.raises(MMSpecError, match="one utterance"):
        fast.hypothesis(torch.cat([states, other]), prompt_ids=prompt, draft_cache=draft_cache)


def test_capped_redrafting_drafts_a_chain_every_round(whisper, references):
    fast = ARFastDecoder.for_target(whisper, init_layer=-1)
    x, sequences, _ = references[0]
    drafter = ARHybridDrafter(fast, redraft=True, redraft_tokens=3)
    out = ar_hybrid(whisper, fast, x, drafter=drafter)
    assert_same(out.sequences, sequences)
    new = out.stats.new_tokens
    # one chain per round after the first; each chain's steps feed one or two new tokens, never the transcript again
    assert out.drafter.redrafts == out.stats.rounds - 1 >= 1
    assert out.drafter._utterance_cache.state.length <= PROMPT_LENGTH + new + 3


def test_initialised_from_chosen_target_layers(whisper):
    fast = ARFastDecoder.for_target(whisper, init_layers=(1, 0))
    decoder = whisper.model.decoder
    assert fast.config.decoder_layers == 2
    assert torch.equal(fast.model.decoder.layers[0].fc1.weight, decoder.layers[1].fc1.weight)
    assert torch.equal(fast.model.decoder.layers[1].fc1.weight, decoder.layers[0].fc1.weight)
    with pytest.raises(MMSpecError, match="init_layer 2 is out of range"):
        ARFastDecoder.for_target(whisper, init_layers=(0, 2))
    with pytest.raises(MMSpecError, match="at least one layer"):
        ARFastDecoder.for_target(whisper, init_layers=())
