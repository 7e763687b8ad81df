"""`mmspec caption` samples as many frames as the captioner was trained on, unless told otherwise."""

from types import SimpleNamespace

import pytest

from mmspec.cli import caption as caption_cli
from mmspec.cli import input_probes, main
from mmspec.vision import pipeline as vision_pipeline


class FakePipe:
    available_methods = ["ar"]
    default_method = "ar"

    # the real rule (the card's frame count, else 8), read from the fake's card
    default_num_frames = property(vision_pipeline.CaptionPipeline.default_num_frames.fget)

    def __init__(self, card):
        self.card = card
        self.frames = []

    def __call__(self, **kwargs):
        self.frames.append(kwargs["num_frames"])
        return SimpleNamespace(text="a caption", notes=[], stats=SimpleNamespace(summary=lambda: "stats"))


@pytest.mark.parametrize("card, argv, want", [
    ({"frames": 64}, [], 64),
    ({"frames": 64}, ["--frames", "12"], 12),
    ({}, [], 8),
])
def test_caption_frames_default_from_the_card(card, argv, want, tmp_path, monkeypatch, capsys):
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"not read: the pipeline is a stand-in")
    pipe = FakePipe(card)
    monkeypatch.setattr(vision_pipeline.CaptionPipeline, "from_pretrained", classmethod(lambda cls, *a, **k: pipe))
    monkeypatch.setattr(input_probes, "probe_video", lambda path: None)  # the stand-in file is not a video
    monkeypatch.setattr(caption_cli, "check_model", lambda *args: None)  # nor is "any" a model
    assert main(["caption", str(video), "--model", "any", *argv]) == 0
    assert pipe.frames == [want]
    assert capsys.readouterr().out.strip() == "a caption"
