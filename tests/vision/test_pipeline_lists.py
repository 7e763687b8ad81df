"""CaptionPipeline takes lists (videos, images, prompts) and decodes them `batch_size` at a time.

Each item's greedy caption (its full sequence) must equal the item captioned alone; prompts of
different lengths make the batches ragged (left padding). Tiny random LLaVA-NeXT-Video from
test_pipeline.py.
"""

import numpy as np
import pytest
import torch

from mmspec import MMSpecError
from mmspec.drafters import NoDrafter
from mmspec.vision.pipeline import CaptionPipeline
from mmspec.vision.recipes import captioner_data as cd

from .test_pipeline import pipe, tiny_captioner_folder  # noqa: F401 - fixtures

PROMPTS = ["describe the video .", "what moves ?", "describe the shapes that move across the video now .", "what ?",
           "tell me what happens ."]


@pytest.fixture(scope="module")
def videos():
    from mmspec.world import examples, render_video

    return [render_video(scene, num_frames=cd.FRAMES, size=cd.FRAME_SIZE)
            for scene, _ in examples(len(PROMPTS), seed=11, split="heldout")]


@pytest.fixture(scope="module")
def alone(pipe, videos):  # noqa: F811
    """Each item captioned on its own, per method: (sequence, text)."""
    found = {}
    for method in ("ar", "text"):
        outs = [pipe(video=v, prompt=p, method=method, max_new_tokens=12, progress_bar=False) for v, p in zip(videos, PROMPTS)]
        found[method] = [(o.sequences[0].tolist(), o.text, o.stats.new_tokens) for o in outs]
    return found


@pytest.mark.parametrize("method", ["ar", "text"])
@pytest.mark.parametrize("batch_size,count", [(2, 5), (3, 4), (3, 3)])
def test_each_items_greedy_caption_equals_the_item_alone(pipe, videos, alone, method, batch_size, count):  # noqa: F811
    outs = pipe(video=videos[:count], prompt=PROMPTS[:count], method=method, max_new_tokens=12, batch_size=batch_size,
                progress_bar=False)
    assert isinstance(outs, list) and len(outs) == count
    for out, (sequence, text, new_tokens) in zip(outs, alone[method][:count]):
        assert out.sequences[0].tolist() == sequence and out.text == text
        assert out.method == method and out.stats.new_tokens == new_tokens  # the row's own stats
        assert out.stats.target_forwards >= 1 and out.stats.rows is None
    # The control: the items caption differently, so a row mixed up with another would be caught.
    assert len({tuple(s) for s, _, _ in alone[method][:count]}) == count


def test_a_batch_really_pads_ragged_prompts(pipe, videos):  # noqa: F811
    tokenizer = pipe.processor.tokenizer
    saved, tokenizer.padding_side = tokenizer.padding_side, "right"  # a tokenizer that pads on the right
    try:
        inputs = pipe.prepare_batch_inputs("video", videos[:3], PROMPTS[:3])
        assert tokenizer.padding_side == "right"  # restored after the batch
    finally:
        tokenizer.padding_side = saved
    mask = inputs["attention_mask"]
    assert mask.shape[0] == 3 and not bool(mask.all()) and bool(mask[:, -1].all())  # padded on the left


def test_images_and_one_prompt_for_all(pipe, videos):  # noqa: F811
    images = [v[0] for v in videos[:3]]  # one frame each, HxWx3 uint8
    outs = pipe(image=images, prompt="what ?", method="text", max_new_tokens=8, batch_size=2, progress_bar=False)
    for image, out in zip(images, outs):
        lone = pipe(image=image, prompt="what ?", method="text", max_new_tokens=8, progress_bar=False)
        assert out.sequences.tolist() == lone.sequences.tolist()


def test_a_list_of_frames_is_one_video(pipe, videos):  # noqa: F811
    frames = list(videos[0])  # HxWx3 arrays: the frames of ONE video
    out = pipe(video=frames, prompt=PROMPTS[0], method="ar", max_new_tokens=6, progress_bar=False)
    assert not isinstance(out, list)
    listed = pipe(video=[frames], prompt=PROMPTS[0], method="ar", max_new_tokens=6, progress_bar=False)
    assert len(listed) == 1 and listed[0].sequences.tolist() == out.sequences.tolist()
    with pytest.raises(MMSpecError, match="mixes videos"):
        pipe(video=[videos[0], videos[0][0]], progress_bar=False)


def test_batch_size_one_runs_every_method(pipe, videos):  # noqa: F811
    outs = pipe(video=videos[:2], prompt=PROMPTS[:2], method="std", max_new_tokens=6, progress_bar=False)
    for video, prompt, out in zip(videos, PROMPTS, outs):
        lone = pipe(video=video, prompt=prompt, method="std", max_new_tokens=6, progress_bar=False)
        assert out.sequences.tolist() == lone.sequences.tolist()


def test_callback_on_round_names_the_item(pipe, videos):  # noqa: F811
    seen = set()
    pipe(video=videos[:2], method="ar", max_new_tokens=3, progress_bar=False,
         callback_on_round=lambda index, info: seen.add(info.chunk))
    assert seen == {0, 1}


class LoneDrafter(NoDrafter):
    drafts_batches = False


class WithALoneMethod(CaptionPipeline):
    def drafter_factories(self):
        return {**super().drafter_factories(), "lone": LoneDrafter}


def test_a_method_that_cannot_batch_is_refused_in_one_line(pipe, videos):  # noqa: F811
    lone = WithALoneMethod(pipe.model, pipe.processor, drafter=pipe.drafter)
    with pytest.raises(MMSpecError, match=r"batch_size=2: method 'lone' drafts one sequence at a time \(LoneDrafter\); "
                                          r"use batch_size=1 or a method that batches \(ar, text"):
        lone(video=videos[:2], method="lone", batch_size=2, progress_bar=False)
    assert "lone" not in lone.batching_methods() and {"ar", "text"} <= set(lone.batching_methods())
    outs = lone(video=videos[:2], method="lone", max_new_tokens=4, progress_bar=False)  # batch_size=1 still works
    assert len(outs) == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "2"])
def test_bad_batch_sizes(pipe, videos, bad):  # noqa: F811
    with pytest.raises(MMSpecError, match="batch_size must be an integer >= 1"):
        pipe(video=videos[:2], batch_size=bad, progress_bar=False)


def test_bad_list_calls(pipe, videos):  # noqa: F811
    with pytest.raises(MMSpecError, match="got 3 prompts for 2 inputs"):
        pipe(video=videos[:2], prompt=PROMPTS[:3], progress_bar=False)
    with pytest.raises(MMSpecError, match="prompt is a list"):
        pipe(video=videos[0], prompt=PROMPTS[:2], progress_bar=False)
    with pytest.raises(MMSpecError, match="draft trees"):
        from mmspec.trees import TreeConfig

        pipe(video=videos[:2], method="text", batch_size=2, tree=TreeConfig(), progress_bar=False)


def test_sampled_list_repeats_with_one_seed(pipe, videos):  # noqa: F811
    run = lambda: [o.sequences.tolist() for o in pipe(video=videos[:3], prompt=PROMPTS[:3], method="text", do_sample=True,  # noqa: E731
                                                     seed=4, max_new_tokens=8, batch_size=2, progress_bar=False)]
    assert run() == run()
    assert np.all([len(s[0]) > 0 for s in run()])
    torch.manual_seed(0)


def test_items_are_decoded_batch_size_rows_at_a_time(pipe, videos, monkeypatch):  # noqa: F811
    from mmspec.decoding import SpeculativeDecoder

    rows, generate = [], SpeculativeDecoder.generate

    def spy(self, input_ids, **kwargs):
        rows.append(input_ids.shape[0])
        return generate(self, input_ids, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    pipe(video=videos[:5], prompt=PROMPTS, method="ar", max_new_tokens=3, batch_size=2, progress_bar=False)
    assert rows == [2, 2, 1]
    rows.clear()
    pipe(video=videos[:3], method="ar", max_new_tokens=3, progress_bar=False)
    assert rows == [1, 1, 1]
