"""The self-drafter: an `ARFastDecoder` that IS its model's decoder (`share_decoder`), drafting over a
reduced vocabulary and re-drafting every round from one lean cache. Nothing is copied or saved."""

import pytest
import torch

from mmspec import MMSpecError
from mmspec.kernels.int8_linear import Int8Linear
from mmspec.speech import ARFastDecoder, ARHybridDrafter, hybrid_drafter_for
from mmspec.speech.ar_fast_decoder import AR_FAST_DECODER_FOLDER, attach_ar_fast_decoder
from mmspec.speech.lean_decoder import LeanWhisperDecoder
from mmspec.speech.pipeline import TranscriptionPipeline, load_fast_decoder
from mmspec.speech.target import WhisperTarget, encoder_outputs_of

from .conftest import MAX_NEW, assert_same
from .test_ar_fast_decoder import ar_hybrid, transcript_of
from .test_pipeline import speechy, write_wav
from .tiny_asr import make_asr_folder
from .tiny_whisper import EOT, VOCAB, features, tiny_whisper


def self_drafter(model, vocab=None, redraft_tokens=None):
    fast = ARFastDecoder.for_target(model, share_decoder=True, draft_vocab=vocab)
    fast.config.draft_redraft, fast.config.draft_redraft_tokens = True, redraft_tokens
    return fast


def test_the_self_drafter_is_the_model_decoder(whisper):
    fast = self_drafter(whisper)
    assert fast.model.decoder is whisper.get_decoder() and fast.proj_out is whisper.get_output_embeddings()
    assert fast.config.decoder_layers == whisper.config.decoder_layers
    # over the whole vocabulary its hypothesis is the model's own greedy transcript
    for seed in range(3):
        x = features(seed)
        expected = whisper.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        states = encoder_outputs_of(whisper, {"input_features": x}).last_hidden_state
        prompt = expected[0, :4].tolist()
        assert fast.hypothesis(states, prompt_ids=prompt, max_new_tokens=MAX_NEW)[0] == transcript_of(expected)


@pytest.mark.parametrize("redraft_tokens", [None, 3])
def test_a_reduced_vocabulary_stays_lossless(whisper, references, redraft_tokens):
    """Tokens outside the drafting vocabulary are never drafted: the model supplies them (control: rejections happen)."""
    everything = sorted({t for _, sequences, _ in references.values() for t in sequences[0, 4:].tolist()})
    vocab = [EOT] + [t for t in range(VOCAB) if t != EOT and t not in everything[::2]]  # every other token used is missing
    fast = self_drafter(whisper, vocab, redraft_tokens)
    rejected = 0
    for x, sequences, _ in references.values():
        drafter = hybrid_drafter_for(fast)
        assert drafter.redraft and drafter.redraft_tokens == redraft_tokens  # the config's setting
        out = ar_hybrid(whisper, fast, x, drafter=drafter)
        assert_same(out.sequences, sequences)
        rejected += out.stats.drafted - out.stats.accepted
    assert rejected > 0


@pytest.mark.parametrize("vocab", [None, "reduced"])
def test_int8_drafting_weights_stay_lossless_and_are_made_once(whisper, references, vocab):
    """`draft_weights: int8`: the lean steps run int8 copies of every linear layer and of the head (made at first
    use, reused while the weights are the same); the model verifies with its own weights, so the output is
    its greedy output. Control: the int8 draft logits are close to, not equal to, the float ones."""
    ids = None if vocab is None else [EOT] + [t for t in range(0, VOCAB, 2) if t != EOT]
    fast = self_drafter(whisper, ids, redraft_tokens=3)
    fast.config.draft_weights = "int8"
    head, _ = fast.draft_head()
    runner = fast.lean_runner(head)
    layers = [m for m in whisper.get_decoder().layers.modules() if isinstance(m, torch.nn.Linear)]
    assert set(runner.linears) == set(layers) and runner.head is not None
    assert fast.lean_runner(head).linears[layers[0]] is runner.linears[layers[0]]  # made once
    states = encoder_outputs_of(whisper, {"input_features": features(0)}).last_hidden_state
    plain = LeanWhisperDecoder(whisper.get_decoder(), whisper.get_output_embeddings(), head_weight=head)
    prompt = torch.tensor([[119, 120, 123, 124]])
    exact, rounded = plain.step(plain.start(states), prompt), runner.step(runner.start(states), prompt)
    assert not torch.equal(exact, rounded) and (exact - rounded).abs().max() < 0.05 * exact.abs().max()
    for x, sequences, _ in references.values():
        assert_same(ar_hybrid(whisper, fast, x, drafter=hybrid_drafter_for(fast)).sequences, sequences)
    fast.config.draft_weights = None
    assert fast.lean_runner(head).linears == {}


def test_a_self_drafter_hands_its_cross_attention_to_the_model(whisper, references):
    """The self-drafter projects the encoder states through the model's own cross-attention layers before the
    model's prefill; the model takes them (its k_proj never runs on them) and its logits are bit for bit the
    ones it computes itself. Control: drafting whole hypotheses keeps no cache, so the model projects them."""
    x = features(2)
    target, inputs = WhisperTarget(whisper), {"input_features": x}
    sequence = target.initial_sequence(None, inputs)
    own = target.start(sequence, **inputs).logits
    states = inputs["encoder_outputs"].last_hidden_state
    runner = LeanWhisperDecoder(whisper.get_decoder(), whisper.get_output_embeddings())
    target.reuse_cross_attention(states, runner.start(states).cross)
    assert torch.equal(target.start(sequence, **inputs).logits, own)
    fast = self_drafter(whisper, redraft_tokens=3)
    calls = []
    hook = whisper.get_decoder().layers[0].encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    try:
        for x, sequences, _ in references.values():
            calls.clear()
            assert_same(ar_hybrid(whisper, fast, x, drafter=hybrid_drafter_for(fast)).sequences, sequences)
            handed_over = len(calls)  # (the language detection step before decoding projects them too)
        calls.clear()
        fast.config.draft_redraft = False
        assert_same(ar_hybrid(whisper, fast, x, drafter=hybrid_drafter_for(fast)).sequences, sequences)
        assert len(calls) == handed_over + 1
    finally:
        hook.remove()


@pytest.mark.parametrize("inner", [64, 75])  # 75: not a multiple of 16, which the CPU kernel needs (padded)
def test_int8_linear_is_the_product_within_its_rounding(inner):
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, inner), torch.randn(96), torch.randn(2, 3, inner)
    exact = torch.nn.functional.linear(x, weight, bias)
    y = Int8Linear(weight, bias)(x)
    assert y.shape == exact.shape and y.dtype == x.dtype
    assert (y - exact).abs().max() < 0.02 * exact.abs().max() and not torch.equal(y, exact)


def test_saved_with_no_weights_and_bound_on_attach(whisper, tmp_path):
    fast = self_drafter(whisper, vocab=[EOT] + list(range(64)), redraft_tokens=4)
    fast.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "generation_config.json"]
    loaded = load_fast_decoder(tmp_path)
    assert isinstance(loaded, ARFastDecoder) and loaded.shares_target_decoder and loaded.config.draft_redraft_tokens == 4
    states = encoder_outputs_of(whisper, {"input_features": features(1)}).last_hidden_state
    with pytest.raises(MMSpecError, match="attach it to the model first"):
        loaded.hypothesis(states, prompt_ids=[119, 120, 123, 124])
    attach_ar_fast_decoder(loaded, whisper)
    assert not any(p.is_meta for p in loaded.parameters())
    assert loaded.hypothesis(states, prompt_ids=[119, 120, 123, 124]) == fast.hypothesis(states, prompt_ids=[119, 120, 123, 124])
    deeper = tiny_whisper(decoder_layers=3)
    with pytest.raises(MMSpecError, match="made for a model with 2 decoder layers"):
        attach_ar_fast_decoder(load_fast_decoder(tmp_path), deeper)


def test_pipeline_transcribes_with_a_self_drafter(tmp_path):
    folder = make_asr_folder(tmp_path / "asr", ctc=False, ar=False)
    pipe = TranscriptionPipeline.from_pretrained(folder)
    self_drafter(pipe.model, redraft_tokens=4).save_pretrained(folder / AR_FAST_DECODER_FOLDER)
    pipe = TranscriptionPipeline.from_pretrained(folder)
    assert pipe.fast_decoder_kind == "ar" and pipe.fast_decoder.model.decoder is pipe.model.get_decoder()
    drafter = pipe.make_drafter("hybrid")
    assert isinstance(drafter, ARHybridDrafter) and drafter.redraft and drafter.redraft_tokens == 4
    clips = [write_wav(tmp_path / f"clip{i}.wav", speechy(0.8, seed=i)) for i in range(3)]
    alone = [pipe(c, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False) for c in clips]
    plain = [pipe(c, method="ar", max_new_tokens=MAX_NEW, progress_bar=False) for c in clips]
    assert [o.chunks[0].tokens for o in alone] == [o.chunks[0].tokens for o in plain]
    # in a batch it drafts whole hypotheses (re-drafting follows one recording): the same transcripts
    batched = pipe(clips, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False, batch_size=3)
    assert [o.chunks[0].tokens for o in batched] == [o.chunks[0].tokens for o in plain]
    assert pipe.batching_methods() == ["hybrid", "ar"]


def test_bench_counts_big_decoder_passes_apart_from_a_self_drafting_assistant(tmp_path):
    """As transformers' assistant the self-drafter runs through the model's own decoder module: the bench
    must not count its forwards as big-decoder passes (the draft is the model's own greedy choice, so
    every draft is accepted and each round costs one pass)."""
    from mmspec.speech.bench import bench_speech
    from mmspec.speech.pipeline import load_whisper
    from mmspec.speech.train_fast import read_clip_folder

    from .tiny_asr import make_clip_folder

    folder = make_asr_folder(tmp_path / "asr", ctc=False, ar=False)
    model, processor = load_whisper("tiny", str(folder))
    clips = read_clip_folder(make_clip_folder(tmp_path / "clips", 2))
    report = bench_speech(model, processor, clips, ar_fast_decoder=self_drafter(model, redraft_tokens=3), repeats=1,
                          progress=False)
    # hybrid-strict-ar drafts as configured (3 tokens a round), hybrid-strict-ar-whole whole hypotheses
    configured, whole = report.row("hybrid-strict-ar"), report.row("hybrid-strict-ar-whole")
    assert configured.identical_to_greedy and whole.identical_to_greedy
    assert configured.drafter_forwards != whole.drafter_forwards
    row = report.row("hf-assisted-ar")
    assert row.identical_to_greedy and row.drafter_forwards > 0
    assert row.tau > 1.5 and row.decoder_passes_per_utterance < report.row("plain-greedy").decoder_passes_per_utterance
