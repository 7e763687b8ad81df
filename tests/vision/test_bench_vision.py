"""bench vision on tiny random LLaVA / LLaVA-NeXT-Video: every method identical to plain greedy, extras present."""

import pytest
import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaNextVideoConfig,
    LlavaNextVideoForConditionalGeneration,
)

from mmspec.errors import MMSpecError
from mmspec.testing import reload_from_disk, tiny_llama
from mmspec.vision.bench import CaptionInput, bench_vision
from mmspec.vision.flash import FlashDrafterModel
from mmspec.vision.hf_assisted import assistant_for
from mmspec.vision.msd import MSDDrafterModel

from .test_sparse_to_dense import llava_inputs, tiny_llava  # noqa: F401 (fixture)


def inputs():
    items = []
    for seed in range(2):
        input_ids, pixel_values = llava_inputs(seed)
        items.append(CaptionInput(input_ids=input_ids, model_inputs={"pixel_values": pixel_values}))
    return items


def test_bench_vision_runs_and_checks_identity(tiny_llava):
    drafter = tiny_llama(vocab_size=100, num_layers=1, hidden_size=32, seed=7)
    report, extras = bench_vision(tiny_llava, inputs(), drafter=drafter, max_new_tokens=8, repeats=1,
                                  std_settings=((4, 3),), progress=False)
    rows = {r.name: r for r in report.results}
    # Same vocabulary here (the <image> id 99 is inside the drafter's): the assistant only masks it.
    assert set(rows) == {"plain-greedy", "greedy-loop", "text-only k=5", "hf-assisted k=5", "std K=4 gamma=3"}
    assert all(r.identical for r in rows.values())
    assert extras["visual_tokens"] == 17
    assert 0.0 <= extras["visual_attention_share"] <= 1.0
    assert extras["modelled_memory_bound_speed_up"]["plain-greedy"] == 1.0
    # The decode-phase split covers mmspec's own loops only (HF generate reports no prefill time).
    phase = extras["decode_phase"]
    assert set(phase) == {"greedy-loop", "text-only k=5", "std K=4 gamma=3"} and phase["greedy-loop"]["decode_speed_up"] == 1.0
    assert all(row["prefill_s"] > 0 and row["decode_s"] > 0 for row in phase.values())


def test_bench_vision_feature_drafter_rows(tiny_llava):
    text = tiny_llava.config.get_text_config()
    torch.manual_seed(0)
    feature = {
        "msd": MSDDrafterModel.from_target_config(text).eval(),
        "flash": FlashDrafterModel.from_target_config(text, num_queries=4, semi_ar_tokens=2).eval(),
        "flash-ar1": FlashDrafterModel.from_target_config(text, num_queries=4, semi_ar_tokens=1).eval(),
    }
    report, extras = bench_vision(tiny_llava, inputs(), drafter=None, feature_drafters=feature, max_new_tokens=8,
                                  num_draft_tokens=4, repeats=1, std_settings=(), progress=False)
    rows = {r.name: r for r in report.results}
    assert set(rows) == {"plain-greedy", "greedy-loop", "msd k=4", "flash k=4", "flash-ar1 k=4"}
    assert all(r.identical for r in rows.values())
    # k = 4 drafts cost ceil(4 / n) FLASH forwards per round (+ the prefill forward).
    assert rows["flash k=4"].stats.drafter_forwards < rows["flash-ar1 k=4"].stats.drafter_forwards
    assert extras["feature_drafters"]["flash k=4"] == {"kind": "flash", "num_queries": 4, "semi_ar_tokens": 2,
                                                       "compress": True}
    assert all(v > 0 for v in extras["modelled_memory_bound_speed_up"].values())
    assert "flash k=4" in report.to_table()


def test_bench_vision_confidence_stop_rows(tiny_llava):
    text = tiny_llava.config.get_text_config()
    torch.manual_seed(0)
    feature = {"flash": FlashDrafterModel.from_target_config(text, num_queries=4, semi_ar_tokens=2).eval()}
    report, extras = bench_vision(tiny_llava, inputs(), drafter=None, feature_drafters=feature, max_new_tokens=8,
                                  num_draft_tokens=4, repeats=1, std_settings=(), progress=False,
                                  confidence_stop=(6, 1.0))
    rows = {r.name: r for r in report.results}
    assert set(rows) == {"plain-greedy", "greedy-loop", "flash k=4", "flash stop<1 k<=6"}
    assert all(r.identical for r in rows.values())
    # A threshold of 1 stops every round after its first draft; the fixed row drafts 4.
    assert rows["flash stop<1 k<=6"].stats.drafted <= rows["flash stop<1 k<=6"].stats.rounds
    assert rows["flash k=4"].stats.drafted > rows["flash k=4"].stats.rounds
    assert "flash stop<1 k<=6" in extras["modelled_memory_bound_speed_up"]


@pytest.mark.slow
def test_bench_vision_lean_ablation_twins_draft_the_same(tiny_llava):
    text = tiny_llava.config.get_text_config()
    torch.manual_seed(0)
    feature = {"msd": MSDDrafterModel.from_target_config(text).eval(),
               "flash": FlashDrafterModel.from_target_config(text, num_queries=4, semi_ar_tokens=2).eval()}
    drafter = tiny_llama(vocab_size=100, num_layers=1, hidden_size=32, seed=7)
    report, extras = bench_vision(tiny_llava, inputs(), drafter=drafter, feature_drafters=feature, max_new_tokens=8,
                                  num_draft_tokens=4, repeats=1, std_settings=(), progress=False,
                                  confidence_stop=(6, 0.5), lean_ablation=True)
    rows = {r.name: r for r in report.results}
    lean_rows = ["text-only k=4", "msd k=4", "flash k=4", "text-only stop<0.5 k<=6", "msd stop<0.5 k<=6",
                 "flash stop<0.5 k<=6"]
    assert set(rows) == {"plain-greedy", "greedy-loop", "hf-assisted k=4", *lean_rows, *(f"{n} hf-fwd" for n in lean_rows)}
    assert all(r.identical for r in rows.values())
    for name in lean_rows:  # the twin drafts through transformers' forward: same drafts, same counts
        ours, twin = rows[name].stats, rows[f"{name} hf-fwd"].stats
        assert (ours.drafted, ours.accepted, ours.drafter_forwards) == (twin.drafted, twin.accepted, twin.drafter_forwards)
        assert f"{name} hf-fwd" in extras["modelled_memory_bound_speed_up"]


# --- transformers' assisted generation with the text-only drafter, on LLaVA-NeXT-Video ------------------------------
# Like the toy captioner: the drafter's vocabulary is the target's minus the <video> / <image> ids appended after it.

TEXT_VOCAB = 100
VIDEO, IMAGE = TEXT_VOCAB, TEXT_VOCAB + 1
FRAMES = 4  # CLIP 56 px / patch 14 = 4x4 patches, pooled by 2: 4 tokens per frame


@pytest.fixture(scope="module")
def tiny_next_video():
    torch.manual_seed(0)
    text = LlamaConfig(vocab_size=TEXT_VOCAB + 2, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                       eos_token_id=2, pad_token_id=0)
    config = LlavaNextVideoConfig(
        vision_config=CLIPVisionConfig(image_size=56, projection_dim=32, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=2, patch_size=14),
        text_config=text, image_token_index=IMAGE, video_token_index=VIDEO, video_seq_length=FRAMES * 4,
        image_seq_length=16)
    return reload_from_disk(LlavaNextVideoForConditionalGeneration(config))


def text_part(model):
    """The target's own language model cut to the text vocabulary: a drafter that agrees now and then."""
    text = model.config.get_text_config()
    drafter = LlamaForCausalLM(LlamaConfig(**{**text.to_dict(), "vocab_size": TEXT_VOCAB})).eval()
    prefix = "model.language_model."
    state = {"model." + k[len(prefix):]: v for k, v in model.state_dict().items() if k.startswith(prefix)}
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:TEXT_VOCAB]
    state["lm_head.weight"] = model.lm_head.weight[:TEXT_VOCAB]
    drafter.load_state_dict(state)
    return drafter


def video_inputs():
    items = []
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.cat([torch.tensor([1, 31, 32]), torch.full((FRAMES * 4,), VIDEO), torch.randint(3, 90, (4,), generator=gen)])
        items.append(CaptionInput(ids[None], {"pixel_values_videos": torch.randn(1, FRAMES, 3, 56, 56, generator=gen)}))
    return items


def test_assistant_for_widens_and_masks_visual_ids(tiny_next_video):
    drafter = tiny_llama(vocab_size=TEXT_VOCAB, num_layers=1, hidden_size=32, seed=7)
    assistant = assistant_for(drafter, tiny_next_video)
    assert assistant.config.vocab_size == TEXT_VOCAB + 2 and drafter.config.vocab_size == TEXT_VOCAB  # a copy
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        mine, theirs = assistant(ids).logits, drafter(ids).logits
    assert torch.equal(mine[..., :TEXT_VOCAB], theirs)
    assert torch.isinf(mine[..., TEXT_VOCAB:]).all() and (mine[..., TEXT_VOCAB:] < 0).all()
    with torch.no_grad():  # it reads placeholders as tokens (embedded as the mean of the text embeddings)
        assert torch.isfinite(assistant(torch.tensor([[1, VIDEO, VIDEO, 5]])).logits[..., :TEXT_VOCAB]).all()
    with pytest.raises(MMSpecError, match="not visual tokens"):  # lacks text id 99: no shared vocabulary
        assistant_for(tiny_llama(vocab_size=TEXT_VOCAB - 1, num_layers=1, hidden_size=32), tiny_next_video)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["random", "text-part"])
def test_bench_vision_hf_assisted_row(tiny_next_video, which):
    if which == "random":
        drafter = tiny_llama(vocab_size=TEXT_VOCAB, num_layers=1, hidden_size=32, seed=7)
    else:
        drafter = text_part(tiny_next_video)
    max_new = 16
    report, extras = bench_vision(tiny_next_video, video_inputs(), drafter=drafter, max_new_tokens=max_new, repeats=1,
                                  std_settings=(), progress=False)
    rows = {r.name: r for r in report.results}
    assert set(rows) == {"plain-greedy", "greedy-loop", "text-only k=5", "hf-assisted k=5"}
    assert all(r.identical and r.mismatches == 0 for r in rows.values())  # per video, against plain greedy
    hf, plain = rows["hf-assisted k=5"].stats, rows["plain-greedy"].stats
    assert hf.new_tokens == plain.new_tokens == 2 * max_new
    assert plain.target_forwards == plain.new_tokens  # prefill + one forward per further token
    assert hf.tau == hf.new_tokens / hf.target_forwards
    assert hf.drafted == hf.drafter_forwards > 0
    if which == "random":
        # Nothing accepted: one round per token, each drafting min(k, tokens left - 1) (transformers' cap).
        assert hf.accepted == 0 and hf.target_forwards == plain.target_forwards
        assert hf.drafted == 2 * sum(min(5, max_new - 1 - r) for r in range(max_new))
    else:
        assert hf.accepted > 0 and hf.target_forwards < plain.target_forwards and 0 < hf.alpha < 1
    assert any(note.startswith("hf-assisted k=5:") and "placeholder" in note for note in extras["notes"])
    assert extras["modelled_memory_bound_speed_up"]["hf-assisted k=5"] > 0
    assert "hf-assisted k=5" in report.to_table()


def test_bench_vision_hf_assisted_refused_is_a_note(tiny_next_video, monkeypatch):
    # When transformers refuses assisted generation for the model, the bench says why instead of adding a row.
    generate = tiny_next_video.generate

    def refusing(*args, **kwargs):
        if kwargs.get("assistant_model") is not None:
            raise ValueError("assisted generation is not supported here\nsecond line")
        return generate(*args, **kwargs)

    monkeypatch.setattr(tiny_next_video, "generate", refusing)
    drafter = tiny_llama(vocab_size=TEXT_VOCAB, num_layers=1, hidden_size=32, seed=7)
    report, extras = bench_vision(tiny_next_video, video_inputs()[:1], drafter=drafter, max_new_tokens=4, repeats=1,
                                  std_settings=(), progress=False)
    assert {r.name for r in report.results} == {"plain-greedy", "greedy-loop", "text-only k=5"}
    assert extras["notes"] == ["hf-assisted k=5 not run: transformers' assisted generation failed for "
                               "LlavaNextVideoForConditionalGeneration: ValueError: assisted generation is not supported here"]
