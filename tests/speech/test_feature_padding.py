"""Feature padding: "audio" (transformers' extractor, zero samples to 30 s) and "log-mel" (openai-whisper's and
faster-whisper's zero frames after the audio's own log-mel). Same frames over the audio, other padding frames; the
pipeline uses the one it is given, and hybrid strict equals greedy decoding of those features."""

import json

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from mmspec import MMSpecError
from mmspec.speech.features import FEATURE_PADDINGS, check_feature_padding, log_mel_features
from mmspec.speech.pipeline import TranscriptionPipeline

from .conftest import MAX_NEW
from .test_pipeline import speechy, write_wav
from .tiny_asr import make_asr_folder

EXTRACTOR = WhisperFeatureExtractor()  # Whisper's 80 bins, 30 s windows


@pytest.mark.parametrize("seconds", [0.5, 3.3, 29.99])
def test_the_paddings_share_the_audios_frames_and_differ_after_it(seconds):
    samples = speechy(seconds, seed=1)
    own = samples.shape[0] // EXTRACTOR.hop_length
    audio, log_mel = (log_mel_features(EXTRACTOR, samples, p) for p in ("audio", "log-mel"))
    assert audio.shape == log_mel.shape == (1, 80, EXTRACTOR.nb_max_frames)
    assert np.allclose(audio[..., :own], log_mel[..., :own], atol=1e-4)
    assert np.all(log_mel[..., own:] == 0)  # zero frames: log10 = -4 after Whisper's normalisation
    floor = (audio.max() * 4 - 4 - 8 + 4) / 4  # silence: the extractor's dynamic-range floor, max - 8 (normalised)
    assert np.allclose(audio[..., own + 2:], floor, atol=1e-4)


def test_log_mel_padding_is_faster_whispers_features():
    fw = pytest.importorskip("faster_whisper.feature_extractor")
    from faster_whisper.audio import pad_or_trim

    extractor = fw.FeatureExtractor()
    for seconds, seed in ((0.5, 0), (4.2, 1), (30.0, 2)):
        samples = speechy(seconds, seed=seed)
        theirs = extractor(samples)
        theirs = pad_or_trim(theirs[:, :theirs.shape[-1] - 1])  # the frames faster-whisper's transcribe encodes
        assert np.abs(log_mel_features(EXTRACTOR, samples, "log-mel")[0] - theirs).max() < 1e-4


def test_feature_padding_names():
    assert FEATURE_PADDINGS == ("audio", "log-mel") and check_feature_padding(None) == "log-mel"
    with pytest.raises(MMSpecError, match="unknown feature padding 'zeros'"):
        check_feature_padding("zeros")
    with pytest.raises(MMSpecError, match="needs a Whisper feature extractor"):
        log_mel_features(object(), np.zeros(160, dtype=np.float32), "log-mel")


def test_the_pipeline_pads_as_asked_and_hybrid_equals_greedy_of_those_features(tmp_path):
    folder = make_asr_folder(tmp_path / "asr", ctc=False)
    clip = write_wav(tmp_path / "clip.wav", speechy(0.8, seed=3))
    with pytest.raises(MMSpecError, match="unknown feature padding"):
        TranscriptionPipeline.from_pretrained(folder, feature_padding="zeros")
    features = {}
    for padding in FEATURE_PADDINGS:
        pipe = TranscriptionPipeline.from_pretrained(folder, fast_decoder="ar", feature_padding=padding)
        assert pipe.feature_padding == padding
        samples = speechy(0.8, seed=3)
        x = pipe.features(samples)
        assert torch.equal(x, torch.from_numpy(log_mel_features(pipe.feature_extractor, samples, padding)))
        features[padding] = x
        hybrid = pipe(str(clip), method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False, silence_threshold=None)
        plain = pipe(str(clip), method="ar", max_new_tokens=MAX_NEW, progress_bar=False, silence_threshold=None)
        assert hybrid.chunks[0].tokens == plain.chunks[0].tokens
        generated = pipe.model.generate(x, do_sample=False, max_new_tokens=MAX_NEW).tolist()[0]
        tokens = [t for t in plain.chunks[0].tokens if t != pipe.model.generation_config.eos_token_id]
        assert generated[len(generated) - len(tokens):] == tokens
    assert not torch.equal(features["audio"], features["log-mel"])
    assert pipe.feature_padding == "log-mel" == TranscriptionPipeline.from_pretrained(folder).feature_padding  # the default
    pipe = TranscriptionPipeline.from_pretrained(folder, fast_decoder="ar", feature_padding="audio")
    pipe.save_pretrained(tmp_path / "saved")  # the setting is saved with the pipeline
    assert TranscriptionPipeline.from_pretrained(tmp_path / "saved").feature_padding == "audio"


def test_cli_transcribe_feature_padding(tmp_path, capsys):
    from mmspec.cli import main

    folder = make_asr_folder(tmp_path / "asr", ctc=False)
    clip = write_wav(tmp_path / "clip.wav", speechy(0.8, seed=3))
    outputs = []
    for padding in FEATURE_PADDINGS:
        code = main(["transcribe", str(clip), "--model", str(folder), "--feature-padding", padding, "--method", "ar",
                     "--max-new-tokens", str(MAX_NEW), "--format", "json"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        outputs.append(json.loads(captured.out)["text"])
    pipe = TranscriptionPipeline.from_pretrained(folder, fast_decoder="ar", feature_padding="log-mel")
    expected = pipe(str(clip), method="ar", max_new_tokens=MAX_NEW, progress_bar=False).text
    assert outputs[1] == expected and outputs[0] != outputs[1]  # the flag reached the pipeline
