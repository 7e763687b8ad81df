"""The Whisper feature drafter (EAGLE-style): slot bookkeeping, losslessness, training, save/load, bench rows."""

import json

import pytest
import torch

from mmspec import MMSpecError
from mmspec.decoding import SpeculativeDecoder
from mmspec.speech import WhisperTarget
from mmspec.speech.feature_drafter import WhisperFeatureDrafter, WhisperFeatureDrafterModel, load_feature_drafter
from mmspec.speech.hybrid import hybrid_policy, hybrid_rule
from mmspec.speech.target import encoder_outputs_of
from mmspec.speech.train_fast import Example
from mmspec.speech.train_feature import target_features, train_feature_drafter

from .conftest import MAX_NEW, PROMPT_LENGTH, assert_same
from .tiny_whisper import VOCAB, features, tiny_whisper


def decode(model, drafter, x, k=4, sampling=None, generator=None):
    target = WhisperTarget(model)
    decoder = SpeculativeDecoder(target, drafter, policy=hybrid_policy(k), rule=hybrid_rule("strict"))
    inputs = {"input_features": x}
    return decoder.generate(None, max_new_tokens=MAX_NEW, decoder_input_ids=target.prompt_ids(inputs),
                            sampling=sampling, generator=generator, **inputs)


def examples_of(model, seeds):
    """Encoder states, prompt and the target's own greedy transcript for each seed's input."""
    out = []
    for seed in seeds:
        x = features(seed)
        inputs = {"input_features": x}
        prompt = WhisperTarget(model).prompt_ids(inputs)[0].tolist()
        states = encoder_outputs_of(model, inputs).last_hidden_state[0]
        tokens = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW).tolist()[0][len(prompt):]
        out.append(Example(states=states, prompt=prompt, labels=[t for t in tokens if t != model.generation_config.eos_token_id]))
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_whisper(decoder_layers=2)


@pytest.fixture(scope="module")
def trained(model):
    torch.manual_seed(0)
    drafter, losses = train_feature_drafter(model, examples_of(model, range(8)), 150, batch_size=4, learning_rate=3e-3,
                                            progress_bar=False)
    return drafter, losses


def test_greedy_output_is_the_models_own_and_drafts_are_rejected_sometimes(model):
    drafter = WhisperFeatureDrafterModel.for_target(model)  # untrained: drafts are often wrong
    rejected = 0
    for seed in range(4):
        x = features(seed)
        expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        out = decode(model, WhisperFeatureDrafter(drafter), x)
        assert_same(out.sequences, expected)
        assert out.stats.drafted > 0
        rejected += out.stats.drafted - out.stats.accepted
    assert rejected > 0  # control: the check above saw wrong drafts and still matched


def test_each_first_draft_reads_the_targets_features_of_every_committed_position(model):
    """The drafter's cached slots equal one teacher-forced pass over the target's true features: slot j pairs
    feature j with token j + 1, across rounds with rejections (a shifted pairing would change the draft)."""
    drafter_model = WhisperFeatureDrafterModel.for_target(model)
    seen = []

    class Spy(WhisperFeatureDrafter):
        def propose(self, view):
            proposal = super().propose(view)
            seen.append((view.sequence.clone(), proposal.tokens[0, 0].item()))
            return proposal

    drafter = Spy(drafter_model)
    x = features(1)
    out = decode(model, drafter, x, k=3)
    assert len(seen) > 2
    with torch.inference_mode():
        states = encoder_outputs_of(model, {"input_features": x}).last_hidden_state
        hidden = model(input_features=x, decoder_input_ids=out.sequences, output_hidden_states=True).decoder_hidden_states[-1]
        for sequence, first_draft in seen:
            n = sequence.shape[1]
            predicted = drafter_model(hidden[:, : n - 1], sequence[:, 1:n], states)[0, -1]
            expected = drafter_model.bound[2][drafter_model.draft_logits(predicted).argmax()].item()
            assert first_draft == expected


@pytest.mark.slow
def test_training_raises_acceptance_and_stays_lossless(model, trained):
    drafter, losses = trained
    assert losses[-1] < losses[0] * 0.5
    untrained = WhisperFeatureDrafterModel.for_target(model)
    gains = []
    for seed in range(4):  # the training inputs: the drafter learnt the target's continuation there
        x = features(seed)
        expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        good, bad = decode(model, WhisperFeatureDrafter(drafter), x), decode(model, WhisperFeatureDrafter(untrained), x)
        assert_same(good.sequences, expected)
        gains.append((good.stats.accepted, bad.stats.accepted))
    assert sum(g for g, _ in gains) > 2 * sum(b for _, b in gains)


def test_reduced_vocabulary_drafts_only_its_tokens_and_stays_lossless(model):
    vocab = list(range(0, VOCAB, 3))
    drafter = WhisperFeatureDrafterModel.for_target(model, draft_vocab=vocab)
    drafted = []

    class Recording(WhisperFeatureDrafter):
        def propose(self, *args):
            drafted.append(super().propose(*args))
            return drafted[-1]

    feature = Recording(drafter)
    x = features(2)
    expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
    assert_same(decode(model, feature, x).sequences, expected)
    assert drafted and all(t in vocab for p in drafted for t in p.tokens[0].tolist())


def test_sampling_keeps_going_and_repeats_with_a_seed(model, trained):
    drafter, _ = trained
    from mmspec.sampling import SamplingConfig

    x = features(3)
    runs = [decode(model, WhisperFeatureDrafter(drafter), x, sampling=SamplingConfig(do_sample=True, temperature=1.0),
                   generator=torch.Generator().manual_seed(5)).sequences for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and runs[0].shape[1] > PROMPT_LENGTH


def test_save_holds_no_target_weights_and_loads_back(model, trained, tmp_path):
    drafter, _ = trained
    drafter.save_pretrained(tmp_path / "fd")
    names = set()
    from safetensors import safe_open

    with safe_open(str(tmp_path / "fd" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert names and not any("embed_tokens" in n or "proj_out" in n for n in names)
    loaded = load_feature_drafter(tmp_path / "fd")
    assert json.loads((tmp_path / "fd" / "config.json").read_text())["draft_tokens"] == drafter.config.draft_tokens
    x = features(0)
    a, b = decode(model, WhisperFeatureDrafter(drafter), x), decode(model, WhisperFeatureDrafter(loaded), x)
    assert torch.equal(a.sequences, b.sequences) and a.stats.accepted == b.stats.accepted


def test_clear_errors(model, tmp_path):
    with pytest.raises(MMSpecError, match="config.json not found"):
        load_feature_drafter(tmp_path)
    drafter = WhisperFeatureDrafterModel.for_target(model)
    with pytest.raises(MMSpecError, match="bind the feature drafter"):
        drafter.draft_logits(torch.zeros(48))
    other = tiny_whisper(decoder_layers=1)
    other.config.d_model = 32  # a model of another width
    with pytest.raises(MMSpecError, match="d_model"):
        drafter.bind_target(other)
    with pytest.raises(MMSpecError, match="WhisperFeatureDrafterModel"):
        WhisperFeatureDrafter(torch.nn.Linear(2, 2))
    with pytest.raises(MMSpecError, match="0 feature examples for 1 examples"):
        train_feature_drafter(model, examples_of(model, [0]), 1, features=[], progress_bar=False)
    with pytest.raises(MMSpecError, match="training set is empty"):
        train_feature_drafter(model, [], 1, progress_bar=False)


def test_target_features_are_the_decoders_final_normed_states(model):
    example = examples_of(model, [0])[0]
    data = target_features(model, [example], progress_bar=False)[0]
    # precomputed features train exactly as features computed inside
    runs = []
    for given in (None, [data]):
        torch.manual_seed(3)  # the fresh drafter's initialisation
        runs.append(train_feature_drafter(model, [example], 3, batch_size=1, seed=1, features=given, progress_bar=False)[1])
    assert runs[0] == runs[1]
    with torch.no_grad():
        logits = model(encoder_outputs=(example.states[None],), decoder_input_ids=data.sequence[None]).logits[0]
        torch.testing.assert_close(model.proj_out(data.features), logits)
    assert data.features.shape == (len(example.prompt) + len(example.labels) + 1, model.config.d_model)


def test_the_transcription_pipeline_refuses_it_as_a_fast_decoder(model, tmp_path):
    from mmspec.speech.pipeline import TranscriptionPipeline, load_fast_decoder

    from .tiny_asr import make_asr_folder

    WhisperFeatureDrafterModel.for_target(model).save_pretrained(tmp_path / "fd")
    with pytest.raises(MMSpecError, match="feature drafter .* not a fast decoder"):
        load_fast_decoder(tmp_path / "fd")
    folder = make_asr_folder(tmp_path / "asr", ctc=False, ar=False)
    with pytest.raises(MMSpecError, match="feature drafter .* not a fast decoder"):
        TranscriptionPipeline.from_pretrained(folder, fast_decoder=str(tmp_path / "fd"))
    pipe = TranscriptionPipeline.from_pretrained(folder)
    with pytest.raises(MMSpecError, match="feature drafter .* not a fast decoder"):
        TranscriptionPipeline(pipe.model, pipe.processor, fast_decoder=WhisperFeatureDrafterModel.for_target(pipe.model))
