"""A single empty or corrupt input is refused before torch is imported and any model loads (`mmspec.cli.input_probes`),
and the probes let every readable input through."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmspec.cli import input_probes
from mmspec.errors import MMSpecError

pytest.importorskip("av")

SHAPES = Path(__file__).parents[1] / "demos" / "assets" / "shapes.mp4"


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    from mmspec.media import write_audio

    files = {"missing.wav": None, "empty.mp4": b"", "empty.png": b"", "empty.wav": b"", "empty.gif": b""}
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    files.update({"noise.mp4": noise, "noise.png": noise, "noise.wav": noise, "noise.jpg": noise})
    for name, content in files.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    (tmp_path / "silent-video.mp4").write_bytes(SHAPES.read_bytes())  # frames, no audio track
    write_audio(tmp_path / "tone.wav", np.sin(np.arange(8000) / 5.0).astype(np.float32) * 0.3)
    return {name: str(tmp_path / name) for name in [*files, "silent-video.mp4", "tone.wav"]}


REFUSED = [
    (["caption", "empty.mp4"], "video file is empty"),
    (["caption", "noise.mp4"], "cannot read video"),
    (["caption", "empty.png"], "image file is empty"),
    (["caption", "noise.png"], "cannot read image"),
    (["caption", "noise.jpg"], "cannot read image"),
    (["caption", "empty.gif"], "image file is empty"),
    (["caption", "tone.wav"], "has no video stream"),
    (["transcribe", "missing.wav"], "does not exist"),
    (["transcribe", "empty.wav"], "is empty (0 bytes)"),
    (["transcribe", "noise.wav"], "cannot read audio"),
    (["transcribe", "silent-video.mp4"], "has no audio track"),
]

RUN = """
import sys
from mmspec.cli import main
code = main(sys.argv[1:])
print("torch imported" if "torch" in sys.modules else "torch not imported", code)
"""


@pytest.mark.parametrize("argv, expected", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_a_bad_single_input_is_refused_before_torch_is_imported(argv, expected, inputs):
    verb, name = argv
    done = subprocess.run([sys.executable, "-c", RUN, verb, inputs[name]], capture_output=True, text=True, timeout=120,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mmspec: error: ") and expected in lines[0], done.stderr
    assert done.stdout.split() == ["torch", "not", "imported", "2"], (done.stdout, done.stderr)


def test_the_probes_let_readable_inputs_through(tmp_path, inputs):
    still = tmp_path / "still.png"
    Image.new("RGB", (8, 6), (200, 10, 10)).save(still)
    animated = tmp_path / "moving.gif"
    frames = [Image.new("RGB", (8, 8), (i * 60, 0, 0)) for i in range(3)]
    frames[0].save(animated, save_all=True, append_images=frames[1:], duration=100)
    input_probes.probe_image(still)
    assert input_probes.is_animated_image(animated) and not input_probes.is_animated_image(still)
    input_probes.probe_animated_image(animated)
    input_probes.probe_video(SHAPES)
    input_probes.probe_audio(inputs["tone.wav"])


def test_the_probes_agree_with_the_full_readers(inputs):
    """The same file, the same message: the probe's refusal reads as the reader's."""
    from mmspec.speech.audio import load_audio
    from mmspec.vision.inputs import load_image, load_video

    pairs = [(input_probes.probe_video, load_video, "empty.mp4"), (input_probes.probe_video, load_video, "tone.wav"),
             (input_probes.probe_image, load_image, "empty.png"), (input_probes.probe_image, load_image, "noise.png"),
             (input_probes.probe_audio, load_audio, "empty.wav"), (input_probes.probe_audio, load_audio, "noise.wav"),
             (input_probes.probe_audio, load_audio, "silent-video.mp4")]
    for probe, reader, name in pairs:
        with pytest.raises(MMSpecError) as probed:
            probe(inputs[name])
        with pytest.raises(MMSpecError) as read:
            reader(inputs[name])
        assert str(probed.value) == str(read.value), name


def test_caption_still_reads_what_the_probe_passes(tmp_path, capsys):
    """A readable video gets past the probe to the captioner (here: its JSON output)."""
    from mmspec.cli import main
    from mmspec.zoo import entries

    if not entries():
        pytest.skip("needs the zoo")
    code = main(["caption", str(SHAPES), "--json", "--max-new-tokens", "4"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["text"]


@pytest.mark.parametrize("out", ["{tmp}", "{tmp}/no/such/x.png", "{tmp}/x.txt", "/proc/x.png"])
def test_generate_image_refuses_an_output_before_torch_is_imported(tmp_path, out):
    done = subprocess.run([sys.executable, "-c", RUN, "generate-image", "red circle", "--out", out.format(tmp=tmp_path)],
                          capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert "Traceback" not in done.stderr and done.stderr.startswith("mmspec: error: --out"), done.stderr
    assert done.stdout.split() == ["torch", "not", "imported", "2"], (done.stdout, done.stderr)
