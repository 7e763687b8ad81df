"""The caption pipeline and `mmspec caption` on a tiny random LLaVA-NeXT-Video with a real processor.

The processor is the zoo captioner's (built offline from the zoo tokenizer); the model is random,
so only exactness and plumbing are tested here, not caption quality.
"""

import json

import numpy as np
import pytest
import torch
from transformers import (
    AutoTokenizer,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaNextVideoConfig,
    LlavaNextVideoForConditionalGeneration,
)

from mmspec.cli import main
from mmspec.vision import write_video
from mmspec.vision.pipeline import CaptionPipeline
from mmspec.vision.recipes import captioner_data as cd
from mmspec.zoo import load_causal_lm, resolve


@pytest.fixture(scope="module")
def tiny_captioner_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-captioner")
    tokenizer = cd.extend_tokenizer(AutoTokenizer.from_pretrained(resolve("shapes-caption-lm")))
    processor = cd.build_processor(tokenizer)
    torch.manual_seed(0)
    config = LlavaNextVideoConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       image_size=cd.FRAME_SIZE, patch_size=cd.PATCH_SIZE),
        text_config=LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id),
        video_token_id=tokenizer.convert_tokens_to_ids(cd.VIDEO_TOKEN),
        image_token_id=tokenizer.convert_tokens_to_ids(cd.IMAGE_TOKEN),
        vision_feature_select_strategy="default", vision_feature_layer=-1, spatial_pool_stride=cd.POOL_STRIDE,
        image_grid_pinpoints=[[cd.FRAME_SIZE, cd.FRAME_SIZE]],
    )
    model = LlavaNextVideoForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def frames():
    from mmspec.world import examples, render_video

    scene, _ = examples(1, seed=3, split="heldout")[0]
    return render_video(scene, num_frames=cd.FRAMES, size=cd.FRAME_SIZE)


@pytest.fixture(scope="module")
def pipe(tiny_captioner_folder):
    return CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter")


@pytest.mark.parametrize("method", ["ar", "text", "std"])
def test_every_method_gives_the_models_own_greedy_caption(pipe, frames, method):
    inputs = pipe.prepare_inputs(video=frames)
    assert int((inputs["input_ids"] == pipe.model.config.video_token_id).sum()) == cd.VISUAL_TOKENS
    expected = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=16)
    out = pipe(video=frames, max_new_tokens=16, method=method, progress_bar=False)
    assert out.sequences[0].tolist() == expected[0].tolist()
    assert out.method == method and out.stats.new_tokens == expected.shape[1] - inputs["input_ids"].shape[1]


def test_the_models_generation_config_sets_the_default_length(pipe, frames):
    """Without max_new_tokens a caption is as long as the model's own `generate` makes it (its generation
    config's max_new_tokens); 64 when the config sets none; an explicit value wins."""
    inputs = pipe.prepare_inputs(video=frames)
    config = pipe.model.generation_config
    saved = config.max_new_tokens
    try:
        config.max_new_tokens = 6
        expected = pipe.model.generate(**inputs, do_sample=False)  # generate reads its config
        out = pipe(video=frames, method="text", progress_bar=False)
        assert out.sequences[0].tolist() == expected[0].tolist()
        assert out.stats.new_tokens == expected.shape[1] - inputs["input_ids"].shape[1] == 6
        assert pipe(video=frames, method="ar", max_new_tokens=3, progress_bar=False).stats.new_tokens == 3
        config.max_new_tokens = None
        assert pipe.default_max_new_tokens == 64
    finally:
        config.max_new_tokens = saved


def test_default_method_and_text_drafter_vocab(pipe):
    assert pipe.default_method == "text"  # a drafter is loaded and no measurement says otherwise
    assert pipe.make_drafter("text").vocab_size == pipe.model.get_output_embeddings().weight.shape[0]


def test_zoo_card_training_prompt_is_used(pipe):
    # The zoo captioner's card states its training prompt verbatim; the pipeline must feed exactly that.
    card_pipe = CaptionPipeline(pipe.model, pipe.processor, card={"prompt": "<video>describe the video."})
    assert card_pipe._prompt_text("video", None) == "<video>describe the video."
    assert card_pipe._prompt_text("video", "what moves?") == "<video>what moves?"
    assert pipe._prompt_text("video", "hi") == "<video>\nhi"  # no card: the processor's placeholder + newline


def test_draft_length_per_method(pipe):
    from mmspec import MMSpecError

    assert pipe.draft_length("std") == 9 and pipe.draft_length("text") == 5  # StD's paper gamma; the generic default
    carded = CaptionPipeline(pipe.model, pipe.processor, card={"draft_tokens": {"flash": 9, "text": 6}})
    assert carded.draft_length("flash") == 9 and carded.draft_length("text") == 6 and carded.draft_length("msd") == 5
    forced = CaptionPipeline(pipe.model, pipe.processor, card={"draft_tokens": {"text": 6}}, num_draft_tokens=3)
    assert forced.draft_length("text") == 3 and forced.draft_length("std") == 3  # the caller's value wins
    with pytest.raises(MMSpecError, match="num_draft_tokens"):
        CaptionPipeline(pipe.model, pipe.processor, num_draft_tokens=0)


def test_draft_policy_from_the_card(pipe, frames):
    from mmspec import MMSpecError
    from mmspec.policies import ConfidenceStopDraftLength, FixedDraftLength

    card = {"draft_tokens": {"text": 6}, "draft_policy": {"flash": {"policy": "adaptive", "num_tokens": 12, "threshold": 0.5}}}
    carded = CaptionPipeline(pipe.model, pipe.processor, card=card)
    policy = carded.draft_policy("flash")
    assert isinstance(policy, ConfidenceStopDraftLength) and (policy.num_tokens, policy.threshold) == (12, 0.5)
    text = carded.draft_policy("text")  # no policy carded for it: fixed at its carded length
    assert type(text) is FixedDraftLength and text.num_tokens == 6
    forced = CaptionPipeline(pipe.model, pipe.processor, card=card, num_draft_tokens=3).draft_policy("flash")
    assert type(forced) is FixedDraftLength and forced.num_tokens == 3  # the caller's k wins over the card
    bad = CaptionPipeline(pipe.model, pipe.processor, card={"draft_policy": {"text": {"policy": "adaptive", "num_tokens": 4,
                                                                                        "threshold": 2.0}}})
    with pytest.raises(MMSpecError, match="bad draft_policy for text"):
        bad.draft_policy("text")
    # The default call drafts by the carded policy: a threshold above 1 would stop every round at one draft.
    stopped = CaptionPipeline(pipe.model, pipe.processor, drafter=pipe.drafter_model,
                              card={"draft_policy": {"text": {"policy": "adaptive", "num_tokens": 8, "threshold": 1.0}}})
    out = stopped(video=frames, method="text", max_new_tokens=12, progress_bar=False)
    assert out.stats.drafted <= out.stats.rounds  # at most one draft a round (the drafter is never certain)
    assert out.text == pipe(video=frames, method="ar", max_new_tokens=12, progress_bar=False).text


def test_a_local_folders_card_is_read(tiny_captioner_folder, tmp_path):
    import json
    import shutil

    folder = tmp_path / "rebuilt-captioner"
    shutil.copytree(tiny_captioner_folder, folder)
    (folder / "zoo_card.json").write_text(json.dumps({"pairs_with": "shapes-caption-drafter",
                                                      "prompt": "<video>describe the video."}))
    local = CaptionPipeline.from_pretrained(folder)  # no drafter given: the card's pair is loaded
    assert local.drafter_model is not None and "text" in local.available_methods
    assert local._prompt_text("video", None) == "<video>describe the video."


def test_a_folders_own_text_drafter_comes_before_the_cards_pair(tiny_captioner_folder, tmp_path):
    import shutil

    folder = tmp_path / "captioner-with-text-drafter"
    shutil.copytree(tiny_captioner_folder, folder)
    (folder / "zoo_card.json").write_text(json.dumps({"pairs_with": "shapes-caption-drafter"}))
    own = load_causal_lm(resolve("shapes-caption-drafter"), "drafter")[0]
    with torch.no_grad():
        own.model.embed_tokens.weight.mul_(-1.0)  # a drafter the pair is not
    own.save_pretrained(folder / "text")
    pipe = CaptionPipeline.from_pretrained(folder)
    assert torch.equal(pipe.drafter_model.model.embed_tokens.weight, own.model.embed_tokens.weight)
    shutil.rmtree(folder / "text")  # control: without it, the card's pair
    paired = CaptionPipeline.from_pretrained(folder).drafter_model
    assert torch.equal(paired.model.embed_tokens.weight, -own.model.embed_tokens.weight)


def test_bad_calls(pipe, frames, tmp_path):
    from mmspec import MMSpecError

    with pytest.raises(MMSpecError, match="exactly one"):
        pipe(video=frames, image=frames[0])
    with pytest.raises(MMSpecError, match="unknown method"):
        pipe(video=frames, method="magic")
    with pytest.raises(MMSpecError, match="prompt must be a string"):
        pipe(video=frames, prompt=5)
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00\x01not a video" * 100)
    with pytest.raises(MMSpecError):
        pipe(video=broken)


def test_cli_caption_json_on_a_foreign_video(tiny_captioner_folder, tmp_path, capsys):
    # A video the shapes world did not make: moving gradient noise, odd size, 15 frames.
    rng = np.random.default_rng(0)
    clip = (np.linspace(0, 255, 15 * 50 * 70 * 3).reshape(15, 50, 70, 3) + rng.integers(0, 40, (15, 50, 70, 3))) % 256
    path = write_video(tmp_path / "foreign.mp4", clip.astype(np.uint8))
    code = main(["caption", str(path), "--model", str(tiny_captioner_folder), "--drafter", "shapes-caption-drafter",
                 "--max-new-tokens", "8", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["method"] == "text" and "method 'text'" in captured.err
    stats = {"new_tokens", "target_forwards", "mean_accepted_length", "acceptance_rate", "wall_time_s", "tokens_per_s"}
    assert stats <= set(result["stats"])


def test_cli_caption_corrupt_file(tiny_captioner_folder, tmp_path, capsys):
    bad = tmp_path / "corrupt.mp4"
    bad.write_bytes(b"garbage" * 1000)
    code = main(["caption", str(bad), "--model", str(tiny_captioner_folder), "--drafter", "shapes-caption-drafter"])
    err = capsys.readouterr().err
    assert code == 2 and "mmspec: error:" in err and "Traceback" not in err


@pytest.mark.parametrize("method", ["text", "std"])
def test_two_threads_through_one_pipeline_match_sequential_calls(pipe, frames, method):
    """One pipeline serves two threads at once: each caption (greedy and seeded sampling) is what the same
    call gives alone."""
    import threading

    calls = [dict(video=frames, max_new_tokens=12), dict(image=frames[-1], max_new_tokens=12, do_sample=True, seed=5)]

    def caption(call):
        # The pause after each round hands the interpreter to the other thread mid-call.
        return pipe(**call, method=method, progress_bar=False,
                    callback_on_round=lambda *_: threading.Event().wait(0.001)).sequences[0].tolist()

    expected = [caption(call) for call in calls]
    for _ in range(2):
        results, start = [None, None], threading.Barrier(2)

        def run(i, results=results, start=start):
            start.wait()
            try:
                results[i] = caption(calls[i])
            except Exception as error:  # noqa: BLE001 - reported below as a mismatch
                results[i] = error

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == expected
