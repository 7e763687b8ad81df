"""The zoo video captioner (shapes-video-captioner, detailed shapes-world captions) loads offline and
captions a video.

Skips cleanly when the zoo folder has no weights (its card's ``rebuild_steps`` rebuild it).
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from mmspec.vision.recipes import captioner_data as cd

FOLDER = Path(os.environ.get("MMSPEC_CAPTIONER_DIR", cd.zoo_folder()))

pytestmark = [
    pytest.mark.skipif(not (FOLDER / "model.safetensors").is_file(), reason=f"no captioner weights in {FOLDER}"),
    pytest.mark.slow,  # runs the shipped zoo captioner
]


@pytest.fixture(scope="module")
def captioner():
    from transformers import AutoProcessor, LlavaNextVideoForConditionalGeneration

    model = LlavaNextVideoForConditionalGeneration.from_pretrained(FOLDER, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(FOLDER)
    return model, processor


@pytest.fixture(scope="module")
def frames():
    from mmspec.world import example_seed, render_video, sample_example

    scene, _ = sample_example(example_seed("heldout", 0, 0))
    return render_video(scene, cd.FRAMES, cd.FRAME_SIZE)


def test_config_and_card(captioner):
    model, processor = captioner
    card = json.loads((FOLDER / "zoo_card.json").read_text())
    cfg = model.config
    assert card["task"] == "video-captioning" and card["role"] == "target"
    assert card["visual_tokens_per_video"] == cd.VISUAL_TOKENS
    assert cfg.video_token_id == processor.tokenizer.convert_tokens_to_ids(cd.VIDEO_TOKEN)
    assert cfg.image_token_id == processor.tokenizer.convert_tokens_to_ids(cd.IMAGE_TOKEN)
    assert cfg.text_config.vocab_size == len(processor.tokenizer) == card["vocab_size"]
    # The new tokens come after the caption LM's vocabulary; old ids are unchanged.
    assert cfg.video_token_id == card["base_vocab_size"] and cfg.image_token_id == card["base_vocab_size"] + 1
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert model.generation_config.eos_token_id == processor.tokenizer.eos_token_id


def test_processor_matches_manual_inputs(captioner, frames):
    _, processor = captioner
    inputs = processor(text=cd.VIDEO_TOKEN + cd.PROMPT, videos=frames, return_tensors="pt")
    manual = cd.build_captioner_inputs(frames, cd.PROMPT, FOLDER)
    prompt_len = len(processor.tokenizer(cd.PROMPT, add_special_tokens=False)["input_ids"])
    assert inputs["input_ids"].shape == (1, 1 + cd.VISUAL_TOKENS + prompt_len)
    assert torch.equal(inputs["input_ids"], manual["input_ids"])
    assert (inputs["input_ids"] == processor.video_token_id).sum() == cd.VISUAL_TOKENS
    assert inputs["pixel_values_videos"].shape == (1, cd.FRAMES, 3, cd.FRAME_SIZE, cd.FRAME_SIZE)
    assert torch.allclose(inputs["pixel_values_videos"], manual["pixel_values_videos"], atol=1e-5)


def test_greedy_generate_makes_tokens(captioner, frames):
    model, processor = captioner
    inputs = processor(text=cd.VIDEO_TOKEN + cd.PROMPT, videos=frames, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1]:]
    assert 1 <= len(new) <= 8
    assert not torch.isin(new, torch.tensor([model.config.video_token_id, model.config.image_token_id])).any()
    assert processor.tokenizer.decode(new, skip_special_tokens=True).strip()


def test_other_frame_sizes_are_resized(captioner):
    model, processor = captioner
    frames = np.zeros((cd.FRAMES, 64, 80, 3), np.uint8)
    inputs = processor(text=cd.VIDEO_TOKEN + cd.PROMPT, videos=frames, return_tensors="pt")
    assert inputs["pixel_values_videos"].shape[-2:] == (cd.FRAME_SIZE, cd.FRAME_SIZE)
    manual = cd.build_captioner_inputs(frames, cd.PROMPT, FOLDER)
    assert torch.equal(inputs["input_ids"], manual["input_ids"])


def test_reads_the_video_on_held_out_videos(captioner):
    """Quality, not plumbing: on held-out detailed videos like its training videos, greedy captions name
    the scene's shapes (colour and kind) far more often than the same captions do for another video
    (the wrong-video control; the card has the full 100-video numbers for every attribute)."""
    from mmspec.world import check_caption, detailed_examples, render_video

    model, processor = captioner
    rows = detailed_examples(8, seed=0, split="heldout")
    captions = []
    for scene, _ in rows:
        inputs = processor(text=cd.VIDEO_TOKEN + cd.PROMPT, videos=render_video(scene, cd.FRAMES, cd.FRAME_SIZE),
                           return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=160, do_sample=False)
        captions.append(processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))

    def shapes_score(pairs):
        right = [check_caption(text, scene)["shapes"] for text, (scene, _) in pairs]
        return sum(c for c, _ in right) / sum(t for _, t in right)

    own, control = shapes_score(zip(captions, rows)), shapes_score(zip(captions[1:] + captions[:1], rows))
    assert own >= 0.6 and own >= control + 0.4, (own, control, captions)


def test_cli_caption_default_model_on_a_shapes_video_and_a_foreign_one(tmp_path, capsys):
    """`mmspec caption PATH --json` with no --model: the zoo captioner, its fastest lossless method,
    on a shapes-world video (written to mp4) and on a video the shapes world did not make."""
    from mmspec.cli import main
    from mmspec.vision import write_video
    from mmspec.world import examples, render_video

    if FOLDER != cd.zoo_folder():
        pytest.skip("MMSPEC_CAPTIONER_DIR points elsewhere: the CLI default is the zoo folder")
    scene, _ = examples(1, seed=5, split="heldout", max_shapes=1)[0]
    shapes = write_video(tmp_path / "shapes.mp4", render_video(scene, 16, 96))
    rng = np.random.default_rng(0)
    foreign = write_video(tmp_path / "foreign.mp4", rng.integers(0, 256, (12, 60, 80, 3), dtype=np.uint8))
    for path in (shapes, foreign):
        code = main(["caption", str(path), "--json", "--max-new-tokens", "24"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert "shapes-video-captioner" in captured.err  # says it used the embedded toy model
        result = json.loads(captured.out)
        assert result["text"] and result["model"] == "shapes-video-captioner"
        assert result["stats"]["new_tokens"] >= 1 and result["stats"]["target_forwards"] >= 1
