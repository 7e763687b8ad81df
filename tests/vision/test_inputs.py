"""Images and videos load into arrays; every bad file is one MMSpecError."""

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec import MMSpecError
from mmspec.vision import load_image, load_video, write_test_video, write_video
from mmspec.vision.media_writer import available_video_codec


def grey_level(frames: np.ndarray) -> list[int]:
    return frames.reshape(len(frames), -1).mean(axis=1).round().astype(int).tolist()


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    """16 frames at 8 fps; frame i is flat grey 8 + 15 * i."""
    return write_test_video(tmp_path_factory.mktemp("video") / "clip.mp4", num_frames=16, height=48, width=64)


def close(levels, indices, tol=4):
    return all(abs(level - (8 + 15 * i)) <= tol for level, i in zip(levels, indices))


def test_codec_is_available():
    assert available_video_codec() in ("mpeg4", "libx264", "libopenh264")


def test_uniform_frames(video):
    frames = load_video(video, num_frames=4)
    assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
    assert close(grey_level(frames), [0, 5, 10, 15])


def test_all_frames_and_repeats(video):
    assert close(grey_level(load_video(video, num_frames=None)), range(16))
    longer = load_video(video, num_frames=20)
    assert longer.shape[0] == 20 and close(grey_level(longer)[:1] + grey_level(longer)[-1:], [0, 15])


def test_fps_sampling(video):
    frames = load_video(video, num_frames=None, fps=2)  # 8 fps video: every 4th frame
    assert close(grey_level(frames), [0, 4, 8, 12]) and len(frames) == 4
    capped = load_video(video, num_frames=2, fps=4)
    assert len(capped) == 2 and close(grey_level(capped), [0, 14])


@pytest.mark.parametrize("num_frames, fps", [(0, None), (4, 0.0), (4, -1.0)])
def test_bad_sampling_arguments(video, num_frames, fps):
    with pytest.raises(MMSpecError):
        load_video(video, num_frames=num_frames, fps=fps)


def bad_files(tmp_path, good_video):
    """name -> path of a file no decoder should accept."""
    data = good_video.read_bytes()
    files = {
        "empty": b"",
        "text": b"this is not a video, just a line of text\n" * 20,
        "random": np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        # The mp4 header survives but every byte after it is noise.
        "corrupt": data[:32] + np.random.default_rng(1).integers(0, 256, len(data), dtype=np.uint8).tobytes(),
    }
    paths = {}
    for name, content in files.items():
        paths[name] = tmp_path / f"{name}.mp4"
        paths[name].write_bytes(content)
    paths["missing"] = tmp_path / "missing.mp4"
    paths["directory"] = tmp_path
    return paths


@pytest.mark.parametrize("kind", ["empty", "text", "random", "corrupt", "missing", "directory"])
@pytest.mark.parametrize("fps", [None, 2.0])
def test_unreadable_video_is_one_clear_error(kind, fps, tmp_path, video):
    path = bad_files(tmp_path, video)[kind]
    with pytest.raises(MMSpecError) as info:
        load_video(path, fps=fps)
    assert str(path) in str(info.value)


def test_file_without_video_stream(tmp_path):
    # A PNG opens as a one-frame "video" in FFmpeg, so use an audio-only WAV.
    import av

    path = tmp_path / "tone.wav"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
    with pytest.raises(MMSpecError, match="no video stream"):
        load_video(path)


def test_write_video_validates_frames(tmp_path):
    # Odd sides are padded to even (yuv420p), not refused.
    assert load_video(write_video(tmp_path / "odd.mp4", np.zeros((2, 5, 7, 3), dtype=np.uint8)), num_frames=2).shape == (2, 6, 8, 3)
    with pytest.raises(MMSpecError, match="uint8"):
        write_video(tmp_path / "float.mp4", np.zeros((2, 4, 4, 3)))


def test_load_image_sources(tmp_path):
    array = np.random.default_rng(0).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    Image.fromarray(array).save(tmp_path / "a.png")
    for source in (tmp_path / "a.png", str(tmp_path / "a.png"), Image.fromarray(array), array, torch.from_numpy(array)):
        image = load_image(source)
        assert image.mode == "RGB" and np.array_equal(np.asarray(image), array)
    assert load_image(Image.fromarray(array[..., 0])).mode == "RGB"  # greyscale PIL is converted


@pytest.mark.parametrize("kind", ["empty", "text", "random", "corrupt", "missing", "directory"])
def test_unreadable_image_is_one_clear_error(kind, tmp_path, video):
    path = bad_files(tmp_path, video)[kind]
    with pytest.raises(MMSpecError) as info:
        load_image(path)
    assert str(path) in str(info.value)


def test_truncated_png(tmp_path):
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8) + 100).save(tmp_path / "a.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "a.png").read_bytes()[:60])
    with pytest.raises(MMSpecError, match="cut.png"):
        load_image(tmp_path / "cut.png")


@pytest.mark.parametrize("array", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3)), np.zeros((3, 4, 4), np.uint8),
                                   np.zeros((0, 4, 3), np.uint8)])
def test_bad_image_arrays(array):
    with pytest.raises(MMSpecError):
        load_image(array)


@pytest.mark.parametrize("fps", [None, 2.0])
def test_video_with_zero_frames(tmp_path, fps):
    from fractions import Fraction

    import av

    path = tmp_path / "zero.avi"  # AVI keeps a video stream with no packets in it
    with av.open(str(path), "w") as container:
        stream = container.add_stream(available_video_codec(), rate=Fraction(8))
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        container.start_encoding()
    with pytest.raises(MMSpecError, match="no frames"):
        load_video(path, fps=fps)


def animated(path, colours, duration_ms=100):
    frames = [Image.new("RGB", (32, 24), colour) for colour in colours]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=duration_ms, loop=0)
    return path


COLOURS = [(250, 0, 0), (0, 250, 0), (0, 0, 250), (250, 250, 0), (0, 250, 250), (250, 0, 250)]


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
def test_animated_image_is_a_video(tmp_path, suffix):
    from mmspec.cli.caption import media_kind
    from mmspec.vision.inputs import is_animated_image

    path = animated(tmp_path / f"anim{suffix}", COLOURS)
    still = tmp_path / f"still{suffix}"
    Image.new("RGB", (32, 24), (9, 9, 9)).save(still)
    assert is_animated_image(path) and not is_animated_image(still)
    assert (media_kind(str(path)), media_kind(str(still))) == ("video", "image")

    def dominant(frames):
        return [int(np.argmax(frame.reshape(-1, 3).mean(axis=0))) for frame in frames]

    every = load_video(path, num_frames=None)
    assert every.shape == (6, 24, 32, 3)
    assert [tuple(int(v > 128) for v in frame[0, 0]) for frame in every] == [tuple(int(v > 128) for v in c) for c in COLOURS]
    picked = load_video(path, num_frames=3)  # --frames applies: first, middle, last
    assert len(picked) == 3 and dominant(picked)[0] == 0 and (picked[-1] == every[-1]).all()
    at_rate = load_video(path, num_frames=None, fps=5)  # 10 frames a second: every other frame
    assert len(at_rate) == 3 and all((a == b).all() for a, b in zip(at_rate, every[::2]))


def test_seeking_decodes_the_same_frames_as_one_pass(tmp_path):
    from mmspec.vision.inputs import (
        _decode_by_seeking,
        _decode_in_one_pass,
        _frame_times,
    )

    frames = np.stack([np.full((48, 64, 3), 8 + 8 * i, dtype=np.uint8) for i in range(30)])
    path = write_video(tmp_path / "long.mp4", frames, fps=10)
    times = _frame_times(path)
    wanted = [0, 7, 13, 21, 29]
    by_seeking = _decode_by_seeking(path, wanted, times)
    assert all((by_seeking[i] == frame).all() for i, frame in zip(wanted, _decode_in_one_pass(path, wanted)))
    assert all(abs(int(by_seeking[i].mean()) - (8 + 8 * i)) <= 4 for i in wanted)


def test_fps_must_be_finite(video):
    with pytest.raises(MMSpecError, match="finite"):
        load_video(video, fps=float("inf"))
