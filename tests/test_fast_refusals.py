"""Bad models, cards, folders, choices, rows and data are refused before torch is imported (a fraction of a second,
not the seconds torch and transformers take), in one line; and the CLI's copies of the pipelines' choice lists
equal the lists they copy."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmspec.cli import choices, input_probes
from mmspec.cli.checks import GPU_DRIVER_FILES
from mmspec.cli.tree_flag import DEFAULT_TREE

pytest.importorskip("av")

RUN = """
import sys
from mmspec.cli import main
code = main(sys.argv[1:])
heavy = [name for name in ("torch", "transformers", "diffusers", "gradio") if name in sys.modules]
print("imported:", ",".join(heavy) or "nothing heavy", code)
"""


def wav(path: Path, samples: np.ndarray, rate: int = 16000, fmt: int = 1) -> None:
    """A WAV file: 16-bit PCM (fmt 1) or 32-bit float (fmt 3)."""
    data = samples.astype("<i2" if fmt == 1 else "<f4").tobytes()
    width = 2 if fmt == 1 else 4
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, fmt, 1, rate, rate * width, width, 8 * width)
    path.write_bytes(header + b"data" + struct.pack("<I", len(data)) + data)


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fast-refusals")
    tone = (np.sin(np.arange(16000) / 5.0) * 8000).astype(np.int16)
    wav(root / "tone.wav", tone)
    wav(root / "short.wav", tone[:160])
    wav(root / "loud.wav", np.sin(np.arange(16000) / 10.0) * 1000.0, fmt=3)
    wav(root / "rate1.wav", np.zeros(20000), rate=1)
    models = {
        "m-random": {"config.json": os.urandom(256)},
        "m-list": {"config.json": "[1, 2]", "model.safetensors": b""},
        "m-empty": {"config.json": "{}", "model.safetensors": b""},
        "m-null-type": {"config.json": '{"model_type": null}'},
        "m-no-weights": {"config.json": '{"model_type": "llama"}'},
        "m-bad-weights": {"config.json": '{"model_type": "llama"}',
                          "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + os.urandom(64)},
        "m-pickle": {"config.json": '{"model_type": "llama"}', "pytorch_model.bin": b"\x80\x04crafted"},
        "m-card-bad": {"zoo_card.json": "{not json"},
        "m-card-up": {"zoo_card.json": json.dumps({"derived_from": {"model": "shapes-video-captioner",
                                                                    "overlay": "../../outside"}})},
        "m-card-orphan": {"zoo_card.json": json.dumps({"derived_from": {"model": "no-such-parent", "folder": "x"}})},
        "ct2-list": {"model.bin": os.urandom(256), "config.json": "[1]"},
        "ct2-version": {"model.bin": (7).to_bytes(4, "little") + os.urandom(64), "config.json": "{}"},
        "empty-dir": {},
        "data-bad": {"metadata.jsonl": "not json\n"},
        "data-no-text": {"metadata.jsonl": '{"file": "c.wav"}\n'},
        "noise-audio": {"x.wav": os.urandom(2048), "y.flac": b""},
        "noise-media": {"a.mp4": os.urandom(2048), "b.png": b""},
        "distill-bad": {"metadata.json": '{"shards": []}'},
        "map-list": {"map.json": "[1, 2]"},
        "whisper-en": {"config.json": '{"model_type": "whisper"}', "generation_config.json": '{"is_multilingual": false}',
                       "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "},
    }
    found = {name: str(root / name) for name in ("tone.wav", "short.wav", "loud.wav", "rate1.wav")}
    for name, files in models.items():
        folder = root / name
        folder.mkdir()
        for file, content in files.items():
            (folder / file).write_bytes(content if isinstance(content, bytes) else content.encode())
        found[name] = str(folder)
    found["missing"] = str(root / "no-such-folder")
    found["shapes.mp4"] = str(Path(__file__).parents[1] / "demos" / "assets" / "shapes.mp4")
    found["out"] = str(root)
    return found


CASES = [  # argv (with {fixture} names), what the one error line says
    (["transcribe", "{tone.wav}", "--method", "nope"], "invalid choice"),
    (["transcribe", "{tone.wav}", "--mode", "nope"], "invalid choice"),
    (["transcribe", "{tone.wav}", "--format", "nope"], "invalid choice"),
    (["transcribe", "{tone.wav}", "--compute-type", "int4"], "invalid choice"),
    (["transcribe", "{tone.wav}", "--feature-padding", "nope"], "invalid choice"),
    (["caption", "{tone.wav}", "--method", "nope"], "invalid choice"),
    (["generate-image", "red circle", "--method", "nope"], "invalid choice"),
    (["bench", "speech", "--compute-type", "int4"], "invalid choice"),
    (["transcribe", "{tone.wav}", "--model", "{m-random}"], "not valid JSON"),
    (["transcribe", "{tone.wav}", "--model", "{m-list}"], "must hold a JSON object"),
    (["transcribe", "{tone.wav}", "--model", "{m-empty}"], "names no model_type"),
    (["transcribe", "{tone.wav}", "--model", "{m-pickle}"], "only pickle checkpoints"),
    (["transcribe", "{tone.wav}", "--model", "{ct2-list}"], "must hold a JSON object"),
    (["transcribe", "{tone.wav}", "--model", "{ct2-version}"], "binary version 7 is not supported"),
    (["transcribe", "{tone.wav}", "--model", "{missing}"], "not a zoo model"),
    (["transcribe", "{tone.wav}", "--fast-decoder", "{empty-dir}"], "has no config.json"),
    (["transcribe", "{short.wav}"], "too short to hold speech"),
    (["transcribe", "{tone.wav}", "--language", "fr"], "this model is English-only: it cannot transcribe language 'fr'"),
    (["transcribe", "{tone.wav}", "--model", "whisper-tiny.en", "--language", "de"], "English-only"),
    (["transcribe", "{tone.wav}", "--model", "{whisper-en}", "--language", "german"], "English-only"),
    (["transcribe", "{loud.wav}"], "float audio samples must lie in [-1, 1]"),
    (["transcribe", "{rate1.wav}"], "sampled at 1 Hz"),
    (["caption", "{shapes.mp4}", "--model", "{m-card-bad}"], "not valid JSON"),
    (["caption", "{shapes.mp4}", "--method", "msd", "--drafter", "{empty-dir}"], "config.json not found"),
    (["generate", "hi", "--model", "{m-null-type}"], "model_type None"),
    (["generate", "hi", "--model", "{m-no-weights}"], "no .safetensors weights"),
    (["generate", "hi", "--model", "{m-bad-weights}"], "cannot be read"),
    (["generate", "hi", "--model", "{m-card-up}"], "lies outside"),
    (["generate", "hi", "--drafter", "{m-card-orphan}"], "not in the zoo"),
    (["generate", "hi", "--model", "nobody/nothing-here"], "not a zoo model"),
    (["generate", "  "], "the prompt is empty"),
    (["generate-image", "red circle", "--model", "{m-list}"], "must hold a JSON object"),
    (["bench", "speech", "--rows", "nope"], "no row 'nope'"),
    (["bench", "speech", "--data", "{data-bad}"], "is not valid JSON"),
    (["bench", "speech", "--data", "{data-no-text}"], 'needs string fields "file" and "text"'),
    (["bench", "text", "--model", "{m-random}"], "not valid JSON"),
    (["bench", "vision", "--extra-drafter", "junk"], "--extra-drafter takes"),
    (["bench", "image", "--lantern", "0.1"], "--lantern settings"),
    (["bench", "image", "--model", "shapes-var", "--batch-size", "10000000"], "each image takes about 26 MiB"),
    (["bench", "image", "--model", "shapes-mar", "--batch-size", "10000000"], "each image takes about 19 MiB"),
    (["train-fast-decoder", "--target", "whisper-tiny.en", "--data", "{data-bad}", "--out", "{out}/fd"], "not valid JSON"),
    (["train-drafter", "--target", "shapes-video-captioner", "--data", "{distill-bad}", "--out", "{out}/d"],
     "not mmspec distillation data"),
    (["caption", "{noise-media}", "--out", "{out}/c.jsonl", "--tree", "--batch-size", "2"], "--tree drafts one sequence"),
    (["demo", "--host", "not a host", "--port", "1"], "cannot serve on"),
    (["generate-image", "red circle", "--device", "cudaX"], "is not a device"),
    (["generate-image", "red circle", "--draft-scales", "3"], "applies to VAR models"),
    (["generate-image", "pink hexagon"], "unknown class 'pink hexagon'; known classes: 'red circle'"),
    (["generate-image", "red or blue circle", "--model", "shapes-var"], "names 2 classes"),
    (["generate-image", "a pink ball", "--model", "shapes-mar"], "unknown class 'a pink ball'"),
    (["generate-image", "red circle", "--model", "shapes-mar", "--num-iter", "32"],
     "num_iter must be an integer in 1..16 (the token count), got 32"),
    (["generate-image", "red circle", "--model", "shapes-var", "--num-iter", "4"], "options of MAR models"),
    (["generate-image", "red circle", "--model", "shapes-mar", "--lantern-k", "4"], "not options of MAR"),
    (["caption", "{shapes.mp4}", "--max-memory", "cpu=1e999GB"], "is not a size"),
    (["caption", "{shapes.mp4}", "--max-memory", "cpu=-1GB"], "is not a size"),
    (["caption", "{shapes.mp4}", "--device-map", "{map-list}/map.json"], "non-empty {module name: device} dict"),
    (["caption", "{shapes.mp4}", "--drafter-device", "cpu"], "--drafter-device places the drafter"),
    (["caption", "{shapes.mp4}", "--tree", "1,2"], "expected NODES,TOP_K,DEPTH"),
    (["caption", "{shapes.mp4}", "--frames", "512"], "512 frames cannot fit: shapes-video-captioner holds 512 positions"),
    (["caption", "{shapes.mp4}", "--model", "shapes-video-captioner-long", "--frames", "9999"], "9999 frames cannot fit"),
    *([(["generate-image", "red circle", "--device", "cuda"], "no CUDA GPU that torch can use")]
      if not any(map(os.path.exists, GPU_DRIVER_FILES)) else []),
]


def run(argv: list[str], fx: dict[str, str]) -> subprocess.CompletedProcess:
    for name, value in fx.items():
        argv = [part.replace("{" + name + "}", value) for part in argv]
    return subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=120,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": fx["out"]})


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(argv)[:60] for argv, _ in CASES])
def test_refused_before_torch_is_imported(argv, expected, fx):
    done = run(argv, fx)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("mmspec: error: ") and expected in errors[0], done.stderr
    assert done.stdout.split()[-4:] == ["imported:", "nothing", "heavy", "2"], (done.stdout, done.stderr)


@pytest.mark.parametrize("argv", [["transcribe", "{noise-audio}", "--out", "{out}/subs"],
                                  ["transcribe", "{noise-audio}", "--out", "{out}/t.jsonl"],
                                  ["caption", "{noise-media}", "--out", "{out}/c.jsonl"]])
def test_a_folder_of_unreadable_files_runs_without_a_model(argv, fx):
    """Each file's error is reported (and recorded) as a folder run does, and no model loads for none to read."""
    done = run(argv, fx)
    assert "Traceback" not in done.stderr, done.stderr
    assert "0 of 2 file(s)" in done.stderr, done.stderr
    assert done.stdout.split()[-4:] == ["imported:", "nothing", "heavy", "2"], (done.stdout, done.stderr)


def test_the_choice_lists_equal_the_registries():
    from mmspec.image_ar.pipeline import IMAGE_METHODS
    from mmspec.speech.features import FEATURE_PADDINGS
    from mmspec.speech.hybrid import MODES
    from mmspec.speech.pipeline import METHODS, MIN_AUDIO_S
    from mmspec.speech.precision import COMPUTE_TYPES
    from mmspec.speech.subtitles import FORMATS
    from mmspec.trees import TreeConfig
    from mmspec.vision.distill_data import DISTILL_FORMAT
    from mmspec.vision.pipeline import METHODS as CAPTION_METHODS

    assert choices.TRANSCRIBE_METHODS == METHODS
    assert choices.HYBRID_MODES == MODES
    assert choices.COMPUTE_TYPES == COMPUTE_TYPES
    assert choices.FEATURE_PADDINGS == FEATURE_PADDINGS
    assert choices.TRANSCRIPT_FORMATS == FORMATS
    assert choices.CAPTION_METHODS == CAPTION_METHODS
    assert choices.IMAGE_METHODS == IMAGE_METHODS
    assert choices.DISTILL_FORMAT == DISTILL_FORMAT
    assert input_probes.MIN_AUDIO_S == MIN_AUDIO_S
    default = TreeConfig()
    assert DEFAULT_TREE == (default.num_nodes, default.top_k, default.depth)


def test_the_speech_bench_row_names_cover_the_bench():
    from mmspec.speech.bench import REFERENCE
    from mmspec.speech.peers import PEER_COMPUTE_TYPES, PEER_PREFIX

    assert choices.speech_bench_row(REFERENCE)
    assert all(choices.speech_bench_row(PEER_PREFIX + compute_type) for compute_type in PEER_COMPUTE_TYPES)
    assert choices.speech_bench_row("hybrid-strict-ar-chain4") and choices.speech_bench_row("feature-chain12")
    assert not choices.speech_bench_row("feature-chain0") and not choices.speech_bench_row("nope")
    from mmspec.speech.bench_compiled import SUFFIX, TWINNED_ROWS

    assert (choices.SPEECH_BENCH_COMPILED_ROWS, choices.SPEECH_BENCH_COMPILED_SUFFIX) == (TWINNED_ROWS, SUFFIX)
    assert choices.speech_bench_row("greedy-loop compiled") and not choices.speech_bench_row("plain-greedy compiled")
    source = (Path(__file__).parents[1] / "speech" / "bench.py").read_text()
    for name in choices.SPEECH_BENCH_ROWS:  # every listed row is one the bench names
        assert name == REFERENCE or name.startswith(PEER_PREFIX) or f'"{name}"' in source, name


@pytest.mark.parametrize("kind", ["lm", "vlm", "speech", "image"])
def test_a_saved_pipeline_folder_passes_the_checks(tmp_path, kind):
    """`save_pretrained` of a pipeline writes model_index.json and one sub-folder per component, no config.json."""
    from mmspec.cli.model_checks import check_model
    from mmspec.errors import MMSpecError

    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "TranscriptionPipeline"}))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "whisper"}')
    check_model(str(tmp_path), "model", kind)
    (tmp_path / "model_index.json").write_text("[]")
    with pytest.raises(MMSpecError, match="must hold a JSON object"):
        check_model(str(tmp_path), "model", kind)


def test_the_image_families_read_without_torch_equal_the_loaders():
    from mmspec.cli import image_families
    from mmspec.image_ar import pipeline as image_pipeline
    from mmspec.image_ar.mar_pipeline import MAR_METHODS
    from mmspec.image_ar.var_pipeline import VAR_METHODS
    from mmspec.zoo import entries

    assert image_families.DEFAULT_IMAGE_MODEL == image_pipeline.DEFAULT_IMAGE_MODEL
    assert (image_families.VAR_METHODS, image_families.MAR_METHODS) == (VAR_METHODS, MAR_METHODS)
    names = [entry.name for entry in entries()] + ["nobody/nothing-here"]
    assert {image_families.image_family(name) for name in names} >= {"llamagen", "var", "mar"}
    for name in names:
        assert image_families.image_family(name) == image_pipeline.image_family(name), name


def test_only_english_only_models_refuse_a_language_before_loading(tmp_path):
    from mmspec.cli.speech_languages import check_language
    from mmspec.errors import MMSpecError

    for language in (None, "en", "English", "<|en|>"):
        check_language(None, language)
    (tmp_path / "generation_config.json").write_text('{"is_multilingual": true, "lang_to_id": {"<|fr|>": 50265}}')
    check_language(str(tmp_path), "fr")  # multilingual: the loaded model checks the language
    check_language("nobody/nothing-here", "fr")  # a Hub id: only loading can tell
    (tmp_path / "generation_config.json").write_text('{"is_multilingual": false}')
    with pytest.raises(MMSpecError, match="English-only: it cannot transcribe language 'fr'"):
        check_language(str(tmp_path), "fr")


def test_the_position_budgets_read_without_torch_equal_the_loaded_configs():
    from transformers import AutoConfig

    from mmspec.cli import caption_frames
    from mmspec.vision.models import VIDEO_TOKEN_ATTRIBUTES, video_token_ids
    from mmspec.vision.pipeline import DEFAULT_CAPTIONER
    from mmspec.zoo import entries

    assert (caption_frames.DEFAULT_CAPTIONER, caption_frames.VIDEO_TOKEN_ATTRIBUTES) == (DEFAULT_CAPTIONER,
                                                                                        VIDEO_TOKEN_ATTRIBUTES)
    read = 0
    for entry in entries():
        budget = caption_frames.position_budget(entry.name)
        if budget is None:
            continue
        config = AutoConfig.from_pretrained(entry.path)
        assert video_token_ids(config) and budget == config.text_config.max_position_embeddings, entry.name
        read += 1
    assert read >= 2  # the zoo's two video captioners


def test_the_mar_token_counts_read_without_torch_equal_the_models():
    from mmspec.cli.mar_steps import mar_token_count
    from mmspec.image_ar.mar import MAR
    from mmspec.zoo import entries

    read = 0
    for entry in entries():
        count = mar_token_count(entry.name)
        if count is not None:
            assert count == MAR.from_pretrained(entry.path / "model").seq_len, entry.name
            read += 1
    assert read >= 1  # the zoo's shapes-mar


def test_the_image_batch_settings_read_without_torch_give_the_loaded_pipelines_estimate():
    from mmspec.cli import image_families
    from mmspec.cli.image_batches import bytes_per_image, settings_from_files
    from mmspec.image_ar.pipeline import SpeculativeImagePipeline

    for name in ("shapes-var", "shapes-mar"):
        settings = settings_from_files(name, image_families.image_family(name))
        assert settings is not None, name
        assert bytes_per_image(settings) == bytes_per_image(SpeculativeImagePipeline.from_pretrained(name)), name
