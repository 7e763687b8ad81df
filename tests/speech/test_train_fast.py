"""`mmspec train-fast-decoder` and speech/train_fast.py: the clip folder format, labels, both kinds of
fast decoder trained for a few steps on a tiny random Whisper, and reloading (bad arguments: test_cli_errors.py)."""

import json

import pytest
import torch

from mmspec import MMSpecError
from mmspec.cli import main
from mmspec.speech import ARFastDecoder, CTCFastDecoder, read_clip_folder, train_ar_fast_decoder
from mmspec.speech.pipeline import TranscriptionPipeline, load_fast_decoder, load_whisper
from mmspec.speech.train_fast import Example, clip_features, prepare_examples, train_ctc_fast_decoder

from .conftest import PROMPT_LENGTH
from .test_pipeline import speechy, write_wav
from .tiny_asr import TEXTS, make_asr_folder, make_clip_folder
from .tiny_whisper import EOT, VOCAB


@pytest.fixture(scope="module")
def asr(tmp_path_factory):
    return make_asr_folder(tmp_path_factory.mktemp("asr"), ctc=False, ar=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_clip_folder(tmp_path_factory.mktemp("clips"), count=4)


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_read_clip_folder(data):
    clips = read_clip_folder(data)
    assert [c.text for c in clips] == TEXTS and all(c.path.is_file() and c.path.parent == data for c in clips)


@pytest.mark.parametrize("content, message", [
    (None, "has no metadata.jsonl"),
    ("", "lists no clips"),
    ("\n\n", "lists no clips"),
    ("{not json", "line 1 is not valid JSON"),
    ('{"file": "clip_00000.wav"}', 'line 1 needs string fields "file" and "text"'),
    ('["clip_00000.wav", "text"]', 'line 1 needs string fields'),
    ('{"file": "clip_00000.wav", "text": "ok"}\n{"file": "missing.wav", "text": "x"}', "line 2: audio file 'missing.wav' not found"),
])
def test_bad_clip_folders(tmp_path, content, message):
    write_wav(tmp_path / "clip_00000.wav", speechy(0.5))
    if content is not None:
        (tmp_path / "metadata.jsonl").write_text(content)
    with pytest.raises(MMSpecError, match=message):
        read_clip_folder(tmp_path)


def test_missing_or_file_data(tmp_path):
    with pytest.raises(MMSpecError, match="does not exist"):
        read_clip_folder(tmp_path / "nowhere")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(MMSpecError, match="is not a folder"):
        read_clip_folder(tmp_path / "file.txt")


def test_examples_labels_are_greedy_transcripts_or_the_text(asr, data):
    model, processor = load_whisper("tiny", str(asr))
    clips = read_clip_folder(data)
    distilled = prepare_examples(model, processor, clips, "target", label_batch_size=3, progress_bar=False)
    truth = prepare_examples(model, processor, clips[:1], "truth", progress_bar=False)
    for clip, example in zip(clips, distilled):
        features = clip_features(processor, clip.path, "audio")  # the padding the distillation labels are decoded with
        sequences = model.generate(features, do_sample=False, max_new_tokens=59, return_dict_in_generate=True).sequences
        expected = sequences[0, PROMPT_LENGTH:].tolist()
        assert example.labels == (expected[:-1] if expected[-1] == EOT else expected)
        assert example.prompt == sequences[0, :PROMPT_LENGTH].tolist() and example.states.shape == (32, 48)
    assert truth[0].labels == processor.tokenizer(" " + TEXTS[0], add_special_tokens=False).input_ids
    with pytest.raises(MMSpecError, match="unknown labels"):
        prepare_examples(model, processor, clips, "guess")


def test_clip_longer_than_the_window_is_refused(asr, tmp_path):
    model, processor = load_whisper("tiny", str(asr))
    write_wav(tmp_path / "long.wav", speechy(1.5))
    with pytest.raises(MMSpecError, match="longer than the model's 1.0 s window"):
        clip_features(processor, tmp_path / "long.wav")


def test_ar_training_lowers_the_loss_and_leaves_the_target_alone(whisper, references):
    examples = [Example(states=whisper.get_encoder()(x).last_hidden_state[0].detach(), prompt=seq[0, :PROMPT_LENGTH].tolist(),
                        labels=transcript[:12]) for x, seq, transcript in references.values()]
    before = {name: p.clone() for name, p in whisper.named_parameters()}
    fast, losses = train_ar_fast_decoder(whisper, examples, steps=20, batch_size=3, learning_rate=3e-3, progress_bar=False)
    assert len(losses) == 20 and sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4
    assert not fast.training and fast.config.draft_prompt_ids == examples[0].prompt
    for name, p in whisper.named_parameters():
        assert torch.equal(p, before[name]), name
    ctc, ctc_losses = train_ctc_fast_decoder(whisper, examples, steps=2, batch_size=2, hidden_size=16, num_attention_heads=2,
                                             intermediate_size=32, progress_bar=False)
    assert len(ctc_losses) == 2 and ctc.config.upsample == 1  # 2 x 12 + 1 label frames fit 32 encoder frames
    with pytest.raises(MMSpecError, match="empty"):
        train_ar_fast_decoder(whisper, [], steps=1)
    with pytest.raises(MMSpecError, match="steps must be >= 1"):
        train_ctc_fast_decoder(whisper, examples, steps=0)
    with pytest.raises(MMSpecError, match="outside the target's vocabulary"):
        train_ctc_fast_decoder(whisper, [Example(examples[0].states, [], [VOCAB + 1])], steps=1)


@pytest.mark.parametrize("kind, labels, cls", [("ctc", "target", CTCFastDecoder), ("ar", "truth", ARFastDecoder)])
def test_cli_trains_saves_and_reloads(asr, data, tmp_path, capsys, kind, labels, cls):
    out = tmp_path / "fast"
    code, stdout, err = run(["train-fast-decoder", "--target", str(asr), "--data", str(data), "--out", str(out), "--kind", kind,
                             "--labels", labels, "--steps", "3", "--batch-size", "2", "--lr", "1e-3", "--threads", "1"], capsys)
    assert code == 0, err
    assert f"saved the {kind} fast decoder to {out} (4 clips, {labels} labels, 3 steps" in stdout
    assert "train" in err and "3/3" in err  # the progress bar
    report = json.loads((out / "training.json").read_text())
    assert report["kind"] == kind and report["steps"] == 3 and report["clips"] == 4
    fast = load_fast_decoder(out)
    assert isinstance(fast, cls)
    pipe = TranscriptionPipeline.from_pretrained(asr, fast_decoder=out)
    clip = read_clip_folder(data)[0].path
    hybrid = pipe(clip, method="hybrid", max_new_tokens=20, progress_bar=False)
    assert hybrid.chunks[0].tokens == pipe(clip, method="ar", max_new_tokens=20, progress_bar=False).chunks[0].tokens


def test_cli_init_from_continues_a_saved_fast_decoder(asr, data, tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    shared = ["--target", str(asr), "--data", str(data), "--batch-size", "2", "--threads", "1"]
    common = [*shared, "--kind", "ar"]
    assert run(["train-fast-decoder", *common, "--out", str(first), "--steps", "2"], capsys)[0] == 0
    # lr tiny: the continued decoder must still be (almost) the first one, not a fresh copy of the target's layer.
    code, _, err = run(["train-fast-decoder", *common, "--out", str(second), "--steps", "1", "--lr", "1e-12",
                        "--init-from", str(first)], capsys)
    assert code == 0, err
    before, after = load_fast_decoder(first).state_dict(), load_fast_decoder(second).state_dict()
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)
    assert json.loads((second / "training.json").read_text())["init_from"] == str(first)
    # A fast decoder of the other kind is refused with one clear line.
    ctc = tmp_path / "ctc"
    assert run(["train-fast-decoder", *shared, "--kind", "ctc", "--out", str(ctc), "--steps", "1"], capsys)[0] == 0
    code, _, err = run(["train-fast-decoder", *common, "--out", str(tmp_path / "bad"), "--steps", "1", "--init-from", str(ctc)],
                       capsys)
    assert code == 2 and "Traceback" not in err and "holds a CTCFastDecoder, not the --kind ar fast decoder" in err.strip().splitlines()[-1]
