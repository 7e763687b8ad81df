"""The pipeline base (mmspec.pipelines) as both pipelines use it, on tiny random models.

- save_pretrained / from_pretrained round trips (every component, extra drafters, settings) give the
  same text and the same stats as the pipeline that was saved;
- from_pretrained's dtype / torch_dtype, `.to()`, `.device`, `.dtype`;
- outputs are diffusers BaseOutputs (`out[0]`, `out["text"]`);
- generators (a list of one, a seed, a CPU generator) and the per-round callback;
- the input forms each pipeline takes, and one clear error for a bad one;
- `import mmspec` does not import diffusers; `from mmspec import CaptionPipeline` works.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput
from PIL import Image
from transformers import AutoConfig

from mmspec import MMSpecError
from mmspec.pipelines import (
    RoundInfo,
    RoundReporter,
    SpeculativePipeline,
    SpeculativePipelineOutput,
    TextPipelineOutput,
    resolve_dtype,
)
from mmspec.speech import AR_FAST_DECODER_FOLDER, load_audio
from mmspec.speech.pipeline import TranscriptionOutput, TranscriptionPipeline
from mmspec.vision.pipeline import CaptionOutput, CaptionPipeline

from .speech.test_pipeline import asr_folder, speechy  # noqa: F401 (fixture)
from .speech.tiny_asr import make_asr_folder
from .vision.test_feature_methods import tiny_drafter
from .vision.test_pipeline import frames, tiny_captioner_folder  # noqa: F401 (fixtures)

MAX_NEW = 8
RATE = 16_000
CARD = {"draft_tokens": {"text": 3}, "default_prompt": "what moves?"}
STATS = ("new_tokens", "target_forwards", "drafter_forwards", "rounds", "drafted", "accepted")


def same_stats(a, b):
    return all(getattr(a, name) == getattr(b, name) for name in STATS)


def assert_proposals_explain_rounds(rounds: list[RoundInfo], controls: bool = True) -> None:
    """Each round's draft (`proposed`) begins with the kept tokens; where the target rejected a draft, its
    token there differs from the draft (the correction). Greedy decoding, so a correction always differs.
    `controls`: the rounds must hold both a kept and a rejected draft (else the checks prove little)."""
    for info in rounds:
        assert len(info.proposed) == info.drafted  # none for the prefill's own token
        assert info.proposed[:info.accepted] == info.tokens[:info.accepted]
        if info.accepted < info.drafted and len(info.tokens) > info.accepted:
            assert info.proposed[info.accepted] != info.tokens[info.accepted]
    if controls:
        assert any(info.accepted < info.drafted for info in rounds), "control: no round rejected a draft"
        assert any(info.accepted > 0 for info in rounds), "control: no round kept a draft"


# --- the core loop's round hook ------------------------------------------------------------------

@pytest.fixture(scope="module")
def confident_pair():
    """A tiny LM with peaked next-token choices and a model drafter that is a slightly perturbed copy of it:
    the drafter agrees with the target on some tokens and not on others (kept and rejected drafts both occur)."""
    from mmspec.testing import tiny_llama

    target = tiny_llama(num_layers=2, seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(30)
        drafter = copy.deepcopy(target)
        noise = torch.Generator().manual_seed(0)
        for name, weight in drafter.named_parameters():
            if "layers.1." in name:
                weight.add_(torch.randn(weight.shape, generator=noise) * 0.02)
    return target, drafter


def test_round_hook_gets_each_rounds_proposal(confident_pair, prompt):
    from mmspec.decoding import speculative_generate

    target, drafter = confident_pair
    seen: list[RoundInfo] = []
    reporter = RoundReporter(lambda _index, info: seen.append(info))
    out = speculative_generate(target, drafter, prompt, max_new_tokens=24, num_draft_tokens=4, on_round=reporter)
    plain = target.generate(prompt, max_new_tokens=24, do_sample=False)
    assert out.sequences.tolist() == plain.tolist()  # lossless, with the hook
    assert [t for info in seen for t in info.tokens] == out.sequences[0, prompt.shape[1]:].tolist()
    assert_proposals_explain_rounds(seen)
    # A hook written for three arguments (tokens, drafted, accepted) still works, and sees the same rounds.
    old_style: list[tuple[list[int], int, int]] = []
    again = speculative_generate(target, drafter, prompt, max_new_tokens=24, num_draft_tokens=4,
                                 on_round=lambda tokens, drafted, accepted: old_style.append((tokens.tolist(), drafted, accepted)))
    assert again.sequences.tolist() == out.sequences.tolist()
    assert old_style == [(info.tokens, info.drafted, info.accepted) for info in seen]


# --- the caption pipeline ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def captioner(tiny_captioner_folder):
    text_config = AutoConfig.from_pretrained(tiny_captioner_folder).get_text_config()
    features = {kind: tiny_drafter(kind, text_config) for kind in ("msd", "flash")}
    return CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter",
                                           feature_drafters=features, num_draft_tokens=4)


@pytest.fixture(scope="module")
def saved_captioner(captioner, card_captioner, tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved-captioner")
    card_captioner.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def card_captioner(captioner):
    return CaptionPipeline(captioner.model, captioner.processor, drafter=captioner.drafter, card=CARD,
                           feature_drafters=captioner.feature_drafters, model_name="tiny-captioner")


def test_caption_components_and_registry(captioner):
    assert isinstance(captioner, (SpeculativePipeline, DiffusionPipeline))
    assert set(captioner.components) == {"model", "processor", "drafter"}
    assert captioner.drafter_model is captioner.drafter
    assert captioner.methods == ["ar", "text", "std", "msd", "flash"] == captioner.available_methods
    assert set(captioner.extra_modules()) == {"msd", "flash"}
    bare = CaptionPipeline(captioner.model, captioner.processor)
    assert bare.available_methods == ["ar", "std"] and bare.default_method == "std"
    with pytest.raises(MMSpecError, match="needs a trained MSD drafter"):
        bare.make_drafter("msd")
    with pytest.raises(MMSpecError, match="unknown method 'magic'; choose from ar, text, std, msd, flash"):
        bare.make_drafter("magic")


def test_caption_save_and_load_round_trip(card_captioner, saved_captioner, frames):
    names = {p.name for p in saved_captioner.iterdir()}
    assert {"model_index.json", "model", "processor", "drafter", "msd", "flash"} <= names
    loaded = CaptionPipeline.from_pretrained(saved_captioner)
    assert type(loaded.model) is type(card_captioner.model) and type(loaded.drafter) is type(card_captioner.drafter)
    assert set(loaded.feature_drafters) == {"msd", "flash"} and loaded.card == CARD
    assert loaded.draft_length("text") == 3 and loaded.model_name == str(saved_captioner)
    for method in ("ar", "text", "std", "msd", "flash"):
        want = card_captioner(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
        got = loaded(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
        assert got.sequences.tolist() == want.sequences.tolist() and got.text == want.text, method
        assert same_stats(got.stats, want.stats), method
    # The base class loads a saved folder as the class it was saved as; settings can be replaced.
    again = SpeculativePipeline.from_pretrained(saved_captioner, num_draft_tokens=2)
    assert type(again) is CaptionPipeline and again.draft_length("text") == 2
    with pytest.raises(MMSpecError, match="holds a saved CaptionPipeline, not a TranscriptionPipeline"):
        TranscriptionPipeline.from_pretrained(saved_captioner)


def test_caption_dtype_to_device(tiny_captioner_folder, saved_captioner, captioner):
    for loaded in (CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter",
                                                   torch_dtype=torch.float64),
                   CaptionPipeline.from_pretrained(saved_captioner, torch_dtype="float64"),
                   CaptionPipeline.from_pretrained(saved_captioner, dtype=torch.float64)):
        assert loaded.dtype == loaded.model.dtype == loaded.drafter.dtype == torch.float64
        assert loaded.device == torch.device("cpu")
    with pytest.raises(MMSpecError, match="disagree"):
        CaptionPipeline.from_pretrained(tiny_captioner_folder, dtype=torch.float32, torch_dtype=torch.float64)
    moved = CaptionPipeline(captioner.model, captioner.processor, drafter=captioner.drafter,
                            feature_drafters={k: v for k, v in captioner.feature_drafters.items()})
    try:
        assert moved.to(torch.float64) is moved
        assert moved.dtype == torch.float64 and moved.drafter.dtype == torch.float64
        assert all(net.dtype == torch.float64 for net in moved.feature_drafters.values())
    finally:
        moved.to(dtype=torch.float32)  # the module-scoped models are shared with the other tests
    assert captioner.dtype == torch.float32 and all(net.dtype == torch.float32 for net in captioner.feature_drafters.values())


def test_caption_output_is_a_base_output(captioner, frames):
    out = captioner(video=frames, max_new_tokens=MAX_NEW, method="std", progress_bar=False)
    assert isinstance(out, CaptionOutput) and isinstance(out, TextPipelineOutput)
    assert isinstance(out, SpeculativePipelineOutput) and isinstance(out, BaseOutput)
    assert out[0] == out["text"] == out.text and out["stats"] is out.stats and out["method"] == "std"
    assert list(out.keys()) == ["text", "method", "model", "stats", "sequences"]
    assert out.to_tuple()[0] == out.text


def test_generators_and_seeds(captioner, frames):
    def caption(**options):
        return captioner(video=frames, max_new_tokens=MAX_NEW, method="text", do_sample=True, progress_bar=False,
                         **options).sequences.tolist()

    by_generator = caption(generator=torch.Generator().manual_seed(3))
    assert caption(generator=[torch.Generator().manual_seed(3)]) == by_generator  # diffusers' list of one
    assert caption(seed=3) == by_generator  # a seed is a CPU generator
    torch.manual_seed(5)
    first = caption()
    torch.manual_seed(5)
    assert caption() == first  # no generator: torch's global seed still repeats a run
    with pytest.raises(MMSpecError, match="not both"):
        caption(generator=torch.Generator(), seed=1)
    with pytest.raises(MMSpecError, match="2 generators for a batch of 1"):
        caption(generator=[torch.Generator(), torch.Generator()])
    with pytest.raises(MMSpecError, match="torch.Generator"):
        caption(generator=3)
    assert captioner.generator_for(seed=[1, 2], batch_size=2)[1].initial_seed() == 2
    assert captioner.generator_for(needed=False) is None


def test_caption_callback_on_round(captioner, frames):
    rounds: list[tuple[int, RoundInfo]] = []
    out = captioner(video=frames, max_new_tokens=MAX_NEW, method="text", progress_bar=False,
                    callback_on_round=lambda index, info: rounds.append((index, info)))
    prompt = out.sequences.shape[1] - out.stats.new_tokens
    assert [index for index, _ in rounds] == list(range(len(rounds)))
    assert [t for _, info in rounds for t in info.tokens] == out.sequences[0, prompt:].tolist()
    assert sum(info.drafted for _, info in rounds) == out.stats.drafted
    assert sum(info.accepted for _, info in rounds) == out.stats.accepted
    assert rounds[-1][1].new_tokens == out.stats.new_tokens and rounds[0][1].chunk is None
    assert_proposals_explain_rounds([info for _, info in rounds], controls=False)  # random target: drafts rarely kept
    # The callback changes nothing: the same caption as without it, and as plain decoding.
    assert out.sequences.tolist() == captioner(video=frames, max_new_tokens=MAX_NEW, method="text",
                                               progress_bar=False).sequences.tolist()
    assert out.text == captioner(video=frames, max_new_tokens=MAX_NEW, method="ar", progress_bar=False).text
    with pytest.raises(MMSpecError, match="callback_on_round must be a function"):
        captioner(video=frames, max_new_tokens=2, callback_on_round="print", progress_bar=False)


def test_progress_bar(captioner, frames, capsys):
    captioner(video=frames, max_new_tokens=2, method="ar")
    assert "caption (ar)" in capsys.readouterr().err
    captioner(video=frames, max_new_tokens=2, method="ar", progress_bar=False)
    assert capsys.readouterr().err == ""
    captioner.set_progress_bar_config(disable=True)
    try:
        captioner(video=frames, max_new_tokens=2, method="ar")
        assert capsys.readouterr().err == ""
    finally:
        captioner.set_progress_bar_config()
    bar = captioner.progress_bar(total=3, desc="x", enabled=False)
    assert bar.disable and captioner.__dict__.get("_progress_bar_config") == {}


def test_video_and_image_forms(captioner, frames, tmp_path):
    want = captioner.prepare_inputs(video=frames)["pixel_values_videos"]
    forms = {
        "list of PIL": [Image.fromarray(f) for f in frames],
        "list of arrays": list(frames),
        "tensor THWC": torch.from_numpy(frames),
        "tensor TCHW": torch.from_numpy(frames).permute(0, 3, 1, 2),
        "list of tensors": [torch.from_numpy(f) for f in frames],
    }
    for name, video in forms.items():
        assert torch.equal(captioner.prepare_inputs(video=video)["pixel_values_videos"], want), name
    bad = {
        "empty list": ([], "empty"),
        "mixed sizes": ([frames[0], frames[1][:-2]], "one size"),
        "floats": (frames.astype(np.float32), "uint8"),
        "one frame": (frames[0], r"\[T, H, W, 3\]"),
        "not a frame": ([frames[0], "x.png"], "video frame 1"),
        "a number": (3, "a video must be"),
    }
    for name, (video, message) in bad.items():
        with pytest.raises(MMSpecError, match=message):
            captioner.prepare_inputs(video=video)
    from mmspec.vision import load_image

    frame = frames[0]
    path = tmp_path / "frame.png"
    Image.fromarray(frame).save(path)
    for image in (path, str(path), Image.fromarray(frame), frame, torch.from_numpy(frame),
                  torch.from_numpy(frame).permute(2, 0, 1)):
        assert np.array_equal(np.asarray(load_image(image)), frame)


# --- the transcription pipeline ------------------------------------------------------------------

@pytest.fixture(scope="module")
def transcriber(asr_folder):
    return TranscriptionPipeline.from_pretrained(asr_folder)


@pytest.fixture(scope="module")
def clip_samples():
    return speechy(1.6, seed=4)  # two chunks of the tiny model's 1 s window


@pytest.mark.parametrize("kind", ["ctc", "ar"])
def test_transcription_save_and_load_round_trip(kind, tmp_path, clip_samples):
    folder = make_asr_folder(tmp_path / "asr", ctc=kind == "ctc", ar=kind == "ar")
    pipe = TranscriptionPipeline.from_pretrained(folder, num_draft_tokens=6)
    assert pipe.fast_decoder_kind == kind and set(pipe.components) == {"model", "processor", "fast_decoder"}
    pipe.save_pretrained(tmp_path / "saved")
    loaded = TranscriptionPipeline.from_pretrained(tmp_path / "saved")
    assert loaded.fast_decoder_kind == kind and loaded.num_draft_tokens == 6
    for method, mode in (("hybrid", "strict"), ("hybrid", "relaxed"), ("ar", "strict")):
        want = pipe(clip_samples, sampling_rate=RATE, method=method, mode=mode, max_new_tokens=12, progress_bar=False)
        got = loaded(clip_samples, sampling_rate=RATE, method=method, mode=mode, max_new_tokens=12, progress_bar=False)
        assert got.text == want.text and [c.tokens for c in got.chunks] == [c.tokens for c in want.chunks]
        assert same_stats(got.stats, want.stats) and got.decoder_passes == want.decoder_passes
    assert type(SpeculativePipeline.from_pretrained(tmp_path / "saved")) is TranscriptionPipeline
    replaced = TranscriptionPipeline.from_pretrained(tmp_path / "saved", fast_decoder=folder / (
        "fast_decoder" if kind == "ctc" else AR_FAST_DECODER_FOLDER), torch_dtype=torch.float64)
    assert replaced.fast_decoder_kind == kind and replaced.fast_decoder.dtype == replaced.dtype == torch.float64
    with pytest.raises(MMSpecError, match="holds a saved TranscriptionPipeline, not a CaptionPipeline"):
        CaptionPipeline.from_pretrained(tmp_path / "saved")


def test_transcription_dtype_device_and_output(asr_folder, transcriber, clip_samples):
    pipe = TranscriptionPipeline.from_pretrained(asr_folder, torch_dtype=torch.float64)
    assert pipe.dtype == pipe.model.dtype == pipe.fast_decoder.dtype == torch.float64 and pipe.device.type == "cpu"
    assert pipe.to(torch.float32).fast_decoder.dtype == torch.float32
    out = transcriber(clip_samples, sampling_rate=RATE, max_new_tokens=8, progress_bar=False)
    assert isinstance(out, TranscriptionOutput) and isinstance(out, TextPipelineOutput) and isinstance(out, BaseOutput)
    assert out[0] == out["text"] == out.text and out["decoder_passes"] == out.decoder_passes
    assert "note" not in out and out.note is None  # None fields stay out of the mapping (diffusers' rule)
    assert list(out.keys())[:4] == ["text", "method", "model", "stats"]


def test_audio_forms(transcriber, clip_samples):
    def text(audio, **options):
        out = transcriber(audio, max_new_tokens=8, method="ar", progress_bar=False, **options)
        return [c.tokens for c in out.chunks]

    want = text(clip_samples, sampling_rate=RATE)
    assert text({"array": clip_samples, "sampling_rate": RATE}) == want  # datasets' Audio feature
    assert text({"raw": clip_samples, "sampling_rate": RATE}) == want  # transformers' ASR pipeline's
    assert text({"array": clip_samples, "sampling_rate": RATE}, sampling_rate=RATE) == want
    assert text(torch.from_numpy(clip_samples), sampling_rate=RATE) == want
    assert text({"array": clip_samples.tolist(), "sampling_rate": RATE}) == want
    for audio, options, message in [
        ({"array": clip_samples}, {}, '"sampling_rate"'),
        ({"sampling_rate": RATE}, {}, 'needs "array"'),
        ({"array": clip_samples, "sampling_rate": RATE}, {"sampling_rate": 8000}, "pass one"),
        (clip_samples, {}, "needs its rate"),
        (3.5, {}, "audio must be a file path"),
    ]:
        with pytest.raises(MMSpecError, match=message):
            transcriber(audio, progress_bar=False, **options)
    eight_k = load_audio({"array": clip_samples, "sampling_rate": RATE}, 8000)
    assert eight_k.shape[0] == pytest.approx(clip_samples.shape[0] / 2, abs=2)


def test_transcription_callback_on_round(transcriber, clip_samples):
    rounds: list[tuple[int, RoundInfo]] = []
    out = transcriber(clip_samples, sampling_rate=RATE, max_new_tokens=12, progress_bar=False,
                      callback_on_round=lambda index, info: rounds.append((index, info)))
    assert [index for index, _ in rounds] == list(range(len(rounds)))
    for number, chunk in enumerate(out.chunks):
        assert [t for _, info in rounds if info.chunk == number for t in info.tokens] == chunk.tokens
    assert sum(info.drafted for _, info in rounds) == out.stats.drafted
    assert rounds[-1][1].new_tokens == out.stats.new_tokens
    for _, info in rounds:  # the fast decoder's draft begins with what the big decoder kept of it
        assert len(info.proposed) == info.drafted and info.proposed[:info.accepted] == info.tokens[:info.accepted]


# --- the package ---------------------------------------------------------------------------------

def test_top_level_names_are_lazy():
    code = ("import sys, mmspec; heavy = [m for m in ('diffusers', 'torch', 'mmspec.pipelines') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
    import mmspec

    assert mmspec.CaptionPipeline is CaptionPipeline and mmspec.TranscriptionPipeline is TranscriptionPipeline
    assert mmspec.SpeculativePipeline is SpeculativePipeline and mmspec.TextPipelineOutput is TextPipelineOutput
    assert {"CaptionPipeline", "TranscriptionPipeline", "SpeculativePipeline"} <= set(mmspec.__all__)


def test_resolve_dtype_and_base_errors(tmp_path):
    assert resolve_dtype() == torch.float32 and resolve_dtype(torch_dtype="torch.bfloat16") == torch.bfloat16
    assert resolve_dtype(torch.float16, torch.float16) == torch.float16
    with pytest.raises(MMSpecError, match="torch.dtype"):
        resolve_dtype("fp17")
    for integer in ("int8", torch.int8, "torch.bool"):  # weights are floating point: .to(int8) fails deep inside
        with pytest.raises(MMSpecError, match="floating-point torch.dtype"):
            resolve_dtype(integer)
    with pytest.raises(MMSpecError, match="not a saved pipeline folder"):
        SpeculativePipeline.from_pretrained(tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_cuda_moves_every_drafter(asr_folder, clip_samples):
    """`.to("cuda")` moves the components and the drafters; the transcript is the CPU one."""
    cpu = TranscriptionPipeline.from_pretrained(asr_folder)
    want = cpu(clip_samples, sampling_rate=RATE, max_new_tokens=8, progress_bar=False)
    pipe = TranscriptionPipeline.from_pretrained(asr_folder).to("cuda")
    assert pipe.device.type == "cuda" and pipe.fast_decoder.device.type == "cuda"
    got = pipe(clip_samples, sampling_rate=RATE, max_new_tokens=8, progress_bar=False)
    assert [c.tokens for c in got.chunks] == [c.tokens for c in want.chunks]
    assert pipe.to("cpu").device.type == "cpu"
