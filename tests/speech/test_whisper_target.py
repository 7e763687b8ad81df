"""WhisperTarget: forced prompt and suppression exactly as Whisper's own `generate`."""

import pytest
import torch
from transformers.generation.logits_process import LogitsProcessorList

from mmspec import MMSpecError, NoDrafter, PromptLookupDrafter, Target, speculative_generate
from mmspec.speech.target import WhisperTarget, whisper_logits_processors, whisper_prompt_ids

from .conftest import MAX_NEW, PROMPT_LENGTH, assert_same
from .tiny_whisper import EOT, LANG_EN, LANG_FR, NO_TIMESTAMPS, SOT, TRANSCRIBE, TRANSLATE, features, tiny_whisper


def test_prompt_matches_generate(whisper, references):
    for x, sequences, _ in references.values():
        inputs = {"input_features": x}
        prompt = whisper_prompt_ids(whisper, inputs)
        assert prompt[0].tolist() == sequences[0, :PROMPT_LENGTH].tolist()
        assert "encoder_outputs" in inputs and "input_features" not in inputs  # the encoder ran once, kept
    x = features(0)
    for language, task in [("fr", None), ("english", "translate"), ("<|en|>", "transcribe"), (None, "translate")]:
        expected = whisper.generate(x, do_sample=False, max_new_tokens=2, language=language, task=task,
                                    return_dict_in_generate=True).sequences
        prompt = whisper_prompt_ids(whisper, {"input_features": x}, language=language, task=task)
        assert prompt[0].tolist() == expected[0, : prompt.shape[1]].tolist()
    assert whisper_prompt_ids(whisper, language="fr", task="translate")[0].tolist() == [SOT, LANG_FR, TRANSLATE, NO_TIMESTAMPS]
    assert whisper_prompt_ids(whisper, language="en")[0].tolist() == [SOT, LANG_EN, TRANSCRIBE, NO_TIMESTAMPS]
    with pytest.raises(MMSpecError, match="language"):
        whisper_prompt_ids(whisper, language="klingon")
    with pytest.raises(MMSpecError, match="task"):
        whisper_prompt_ids(whisper, task="summarise")


@pytest.mark.parametrize("drafter", ["none", "self", "lookup"])
def test_greedy_equals_generate(whisper, references, drafter):
    make = {"none": NoDrafter, "self": lambda: whisper, "lookup": PromptLookupDrafter}[drafter]
    for x, sequences, _ in references.values():
        out = speculative_generate(WhisperTarget(whisper), make(), None, max_new_tokens=MAX_NEW, num_draft_tokens=6,
                                   input_features=x)
        assert_same(out.sequences, sequences)


def test_greedy_verification_takes_its_choices_from_the_certified_head(whisper, references):
    """Greedy verification on a float32 CPU Whisper reads each row's argmax from a `CertifiedHead` (bfloat16 head
    product, float32 for the rows that could win); outputs stay generate's. Sampling keeps the float32 head."""
    target = WhisperTarget(whisper)
    for x, sequences, _ in references.values():
        out = speculative_generate(target, whisper, None, max_new_tokens=MAX_NEW, num_draft_tokens=6, input_features=x)
        assert_same(out.sequences, sequences)
    assert out.target.certified_head is not None and out.target.certified_head.calls > 0
    sampled = WhisperTarget(whisper)
    x = references[0][0]
    out = speculative_generate(sampled, whisper, None, max_new_tokens=8, num_draft_tokens=6, input_features=x, do_sample=True)
    assert out.target.certified_head is None


def test_plain_generate_output_is_the_transcript(whisper, references):
    """whisper.generate without return_dict returns the new tokens with the final end-of-text removed."""
    x, sequences, transcript = references[1]
    assert whisper.generate(x, do_sample=False, max_new_tokens=MAX_NEW)[0].tolist() == transcript
    assert sequences[0, -1] == EOT


class UnprocessedTarget(Target):
    """Control: a target that ignores the generation config's logits processors."""

    def build_logits_processors(self, *args, **kwargs):
        return LogitsProcessorList()


def test_suppression_is_what_makes_it_exact():
    """Control: suppress the token greedy decoding would pick first; a target without processors then differs."""
    model = tiny_whisper(suppress=False)
    x = features(3)
    free = model.generate(x, do_sample=False, max_new_tokens=12, return_dict_in_generate=True).sequences
    first, later = int(free[0, PROMPT_LENGTH]), int(free[0, PROMPT_LENGTH + 2])
    model.generation_config.begin_suppress_tokens = [first]
    model.generation_config.suppress_tokens = [later]
    expected = model.generate(x, do_sample=False, max_new_tokens=12, return_dict_in_generate=True).sequences
    assert not torch.equal(expected, free)
    prompt = expected[:, :PROMPT_LENGTH]
    plain = speculative_generate(UnprocessedTarget(model), NoDrafter(), None, max_new_tokens=12, input_features=x,
                                 decoder_input_ids=prompt)
    assert not torch.equal(plain.sequences, expected)
    generic = speculative_generate(Target(model), NoDrafter(), None, max_new_tokens=12, input_features=x, decoder_input_ids=prompt)
    assert_same(generic.sequences, expected)  # the core target builds the same processors from the config
    exact = speculative_generate(WhisperTarget(model), NoDrafter(), None, max_new_tokens=12, input_features=x,
                                 decoder_input_ids=prompt)
    assert_same(exact.sequences, expected)
    processors = whisper_logits_processors(model, begin_index=PROMPT_LENGTH)
    assert len(processors) == 2


def test_explicit_decoder_prompt_is_used(whisper, references):
    x, sequences, _ = references[2]
    out = speculative_generate(WhisperTarget(whisper), NoDrafter(), None, max_new_tokens=MAX_NEW, input_features=x,
                               decoder_input_ids=sequences[:, :PROMPT_LENGTH])
    assert_same(out.sequences, sequences)


def test_encoder_runs_once(whisper, references):
    calls = []
    hook = whisper.get_encoder().register_forward_hook(lambda *args: calls.append(1))
    try:
        x = references[0][0]
        speculative_generate(WhisperTarget(whisper), NoDrafter(), None, max_new_tokens=8, input_features=x)
    finally:
        hook.remove()
    assert len(calls) == 1  # language detection and the prefill share one encoder pass


def test_bad_inputs_and_unsupported_settings(whisper):
    target = WhisperTarget(whisper)
    with pytest.raises(MMSpecError, match="input_features"):
        speculative_generate(target, NoDrafter(), None, max_new_tokens=4)
    with pytest.raises(MMSpecError, match="mel bins"):
        speculative_generate(target, NoDrafter(), None, max_new_tokens=4, input_features=torch.zeros(1, 3, 64))
    with pytest.raises(MMSpecError, match="input_ids"):
        speculative_generate(target, NoDrafter(), torch.tensor([[1, 2]]), max_new_tokens=4, input_features=features(0))
    model = tiny_whisper(seed=1)
    model.generation_config.return_timestamps = True
    with pytest.raises(MMSpecError, match="return_timestamps"):
        WhisperTarget(model)
    assert target.max_new_tokens_for(PROMPT_LENGTH, 500) == whisper.config.max_target_positions - PROMPT_LENGTH


def test_masks_equal_transformers_processors_row_by_row(whisper):
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    extra = NoRepeatNGramLogitsProcessor(2)
    target = WhisperTarget(whisper, logits_processors=[extra])
    inputs = {"input_features": features(4)}
    prompt = target.initial_sequence(None, inputs)
    # As the loop does once per call: the processors generate would build, set on the target.
    target.processors = target.build_logits_processors(whisper.generation_config, prompt.shape[1], [])
    sequence = torch.cat([prompt, torch.tensor([[5, 6, 5, 6]])], dim=1)
    step = target.start(sequence[:, :-5], sequence[:, -5:], **inputs)  # the prompt's last 2 positions onwards
    # As the loop does: the cache drops the newest token, which is fed again with the next drafts.
    target.truncate(sequence.shape[1] - 1)
    more = target.verify(torch.tensor([[6]]), torch.tensor([[5, 8]]))
    full = torch.cat([sequence, torch.tensor([[5, 8]])], dim=1)
    with torch.inference_mode():
        raw = whisper(encoder_outputs=inputs["encoder_outputs"], decoder_input_ids=full).logits
    processors = whisper_logits_processors(whisper, begin_index=prompt.shape[1])
    processors.append(extra)
    expected = torch.stack([processors(full[:, : i + 1], raw[:, i].clone()) for i in range(full.shape[1])], dim=1)
    got = torch.cat([step.logits, more.logits], dim=1)
    want = torch.cat([expected[:, sequence.shape[1] - 6 : sequence.shape[1]], expected[:, sequence.shape[1] - 1 :]], dim=1)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], atol=1e-4, rtol=1e-4)
    assert torch.isinf(got[0, 1, 7])  # the begin-suppressed blank, on the row predicting the first new token
