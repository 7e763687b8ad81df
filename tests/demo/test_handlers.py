"""The tabs' handlers on bad uploads: one clear message each (shown in the page as a gr.Error)."""

from __future__ import annotations

from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")

ASSETS = Path(__file__).resolve().parents[2] / "demos" / "assets"


def run(handler, *args):
    return list(handler(*args, progress=gr.Progress()))


def test_wrong_kind_and_empty_uploads_are_named_clearly(tmp_path):
    from mmspec.demo.caption_tab import caption
    from mmspec.demo.transcribe_tab import transcribe

    with pytest.raises(gr.Error, match=r"'speech-shapes.flac' has no video stream \(is it an audio or image file\?\)"):
        run(caption, str(ASSETS / "speech-shapes.flac"), "shapes-video-captioner", "ar", 4, 0, 0, False)
    with pytest.raises(gr.Error, match="'shapes.mp4' has no audio track"):
        run(transcribe, str(ASSETS / "shapes.mp4"), "whisper-tiny.en", "hybrid", False)
    empty = tmp_path / "empty.flac"
    empty.touch()
    with pytest.raises(gr.Error, match=r"the uploaded audio 'empty.flac' is empty \(0 bytes\)"):
        run(transcribe, str(empty), "whisper-tiny.en", "hybrid", False)
    with pytest.raises(gr.Error, match="no video given"):
        run(caption, None, "shapes-video-captioner", "ar", 4, 0, 0, False)
    # Control: the right kind of file goes through, and its last update carries the caption.
    last = run(caption, str(ASSETS / "shapes.mp4"), "shapes-video-captioner", "ar", 4, 0, 0, False)[-1]
    assert last[1]
