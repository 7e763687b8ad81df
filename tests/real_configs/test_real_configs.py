"""Greedy mmspec output equals the target's own `generate` for models built from the real configs of
published checkpoints (shrunk widths and depths only), with the shipped generation config in force.

The only settings passed on either side are `do_sample=False` and `max_new_tokens`: everything else
(repetition penalty, sampling defaults, end tokens, Whisper's forced and suppressed tokens, ...) comes
from the shipped `generation_config.json`, as it does for a user who loads the checkpoint.
"""

from __future__ import annotations

import json
from functools import lru_cache

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as lp

from mmspec import PromptLookupDrafter, SamplingConfig, speculative_generate
from mmspec.generation import resolve_generation
from mmspec.image_ar import (
    GuidedImageDrafter,
    JanusCFGTarget,
    LlamaGenConfig,
    LlamaGenForClassConditional,
    ar_generate,
    draft_generate,
    jacobi_generate,
)
from mmspec.speech.target import WhisperTarget
from mmspec.testing import NeverAgreeDrafter, first_difference

from ..vision.drafters import MultimodalNeverAgreeDrafter, MultimodalSelfDrafter
from ..vision.tiny_vlms import Case, text_ids
from .real_models import build, fixture, shipped_generation_config, shipped_json

pytestmark = pytest.mark.slow  # every real architecture's config, model by model

MAX_NEW = 16
GREEDY = SamplingConfig(do_sample=False)


def pixels(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------- VLM prompts
# Token ids are the checkpoints' own: image / video placeholders, BOS and chat-template tokens from the
# shipped config and tokenizer conventions; the text ids repeat an n-gram so prompt lookup finds drafts.

def llava_case(model) -> Case:
    image = model.config.image_token_index  # 32000
    ids = text_ids([1, 3148, 1001, 29901, 29871], [image] * 4, [29871, 13, 5618, 338, 3148, 1001, 29901, 319])
    return Case("llava-1.5", model, ids, {"pixel_values": pixels(1, 3, 28, 28)})


def next_video_case(model, frames: int = 4) -> Case:
    video = model.config.video_token_index  # 32000 (images use 32001)
    ids = text_ids([1, 3148, 1001, 29901], [video] * (frames * 4), [13, 5618, 338, 3148, 1001, 29901, 319])
    return Case("llava-next-video", model, ids, {"pixel_values_videos": pixels(1, frames, 3, 56, 56, seed=1)})


def onevision_case(model, frames: int = 4) -> Case:
    video = model.config.video_token_index  # 151647
    im_start, im_end, user, nl = 151644, 151645, 872, 198
    ids = text_ids([im_start, user, nl], [video] * (frames * 4 + 1), [nl, 3838, 374, 419, 30, im_end, nl, im_start, 77091, nl])
    return Case("llava-onevision", model, ids, {"pixel_values_videos": pixels(1, frames, 3, 56, 56, seed=2)})


def qwen2_vl_case(model, video: bool) -> Case:
    """One image (4 merged patches) or one two-frame video (8) between Qwen2-VL's vision start / end tokens."""
    config = model.config
    kind, frames = ("video", 2) if video else ("image", 1)
    token = config.video_token_id if video else config.image_token_id
    im_start, im_end, user, nl = 151644, 151645, 872, 198
    ids = text_ids([im_start, user, nl, config.vision_start_token_id], [token] * (4 * frames),
                   [config.vision_end_token_id, 3838, 374, 419, 30, im_end, nl, im_start, 77091, nl])
    inputs = {"pixel_values_videos" if video else "pixel_values": pixels(16 * frames, 3 * 2 * 14 * 14, seed=3 + video),
              f"{kind}_grid_thw": torch.tensor([[frames, 4, 4]]), "mm_token_type_ids": (1 + video) * (ids == token).int()}
    return Case(f"qwen2-vl-{kind}", model, ids, inputs)


VLM_CASES = {
    "llava-1.5": ("llava-1.5-7b-hf", llava_case),
    "llava-next-video": ("LLaVA-NeXT-Video-7B-hf", next_video_case),
    "llava-onevision": ("llava-onevision-qwen2-0.5b-ov-hf", onevision_case),
    "qwen2-vl-image": ("Qwen2-VL-2B-Instruct", lambda model: qwen2_vl_case(model, video=False)),
    "qwen2-vl-video": ("Qwen2-VL-2B-Instruct", lambda model: qwen2_vl_case(model, video=True)),
}


@lru_cache(maxsize=None)
def model(name: str):
    return build(name)


@lru_cache(maxsize=None)
def case(key: str) -> Case:
    name, make = VLM_CASES[key]
    return make(model(name))


@lru_cache(maxsize=None)
def reference(key: str) -> torch.Tensor:
    c = case(key)
    return c.model.generate(c.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **c.inputs)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got, want):
        at = first_difference(got, want)
        raise AssertionError(f"{what}: differs from generate at position {at}\n  generate {want[0].tolist()}\n"
                             f"  mmspec   {got[0].tolist()}")


DRAFTERS = {
    "self": lambda m: m,
    "never": NeverAgreeDrafter,
    "lookup": lambda m: PromptLookupDrafter(),
    "self-with-images": MultimodalSelfDrafter,
    "never-with-images": MultimodalNeverAgreeDrafter,
}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("key", list(VLM_CASES))
def test_vlm_greedy_equals_generate(key, drafter):
    c = case(key)
    out = speculative_generate(c.model, DRAFTERS[drafter](c.model), c.input_ids, do_sample=False, max_new_tokens=MAX_NEW,
                               num_draft_tokens=4, **c.inputs)
    assert_same(out.sequences, reference(key), f"{key} / {drafter}")
    assert out.sequences.shape[1] > c.input_ids.shape[1]
    if drafter == "self-with-images":
        assert out.stats.accepted == out.stats.drafted > 0
    if drafter == "never-with-images":
        assert out.stats.accepted == 0


def test_vlm_outputs_are_not_degenerate():
    """A random model that repeats one token would make the equality above weak."""
    for key in VLM_CASES:
        new = reference(key)[0, case(key).input_ids.shape[1]:].tolist()
        assert len(set(new)) >= 4, f"{key}: {new}"


# --------------------------------------------------------------------- shipped settings are in force

def test_qwen2_vl_shipped_settings_resolve_as_generate_does():
    qwen = model("Qwen2-VL-2B-Instruct")
    shipped = shipped_json("Qwen2-VL-2B-Instruct", "generation_config.json")
    settings, _ = resolve_generation(qwen, {})
    config = settings.config
    assert config.repetition_penalty == shipped["repetition_penalty"] == 1.05
    assert config.do_sample is True and config.top_k == shipped["top_k"] and config.top_p == shipped["top_p"]
    assert config.temperature == shipped["temperature"]
    assert settings.sampling.do_sample and settings.sampling.top_k == shipped["top_k"]
    assert settings.stop_ids == set(shipped["eos_token_id"])
    greedy, _ = resolve_generation(qwen, {"do_sample": False})
    assert greedy.config.repetition_penalty == 1.05 and not greedy.sampling.do_sample
    # The sliding-window and M-RoPE settings survived the shrinking (transformers drops the window size
    # itself when use_sliding_window is false, as the checkpoint ships).
    text = qwen.config.text_config
    assert text.use_sliding_window is False and text.sliding_window in (None, 32768)
    assert list(text.rope_parameters["mrope_section"]) == [16, 24, 24] and text.rope_parameters["rope_theta"] == 1e6


def test_qwen2_vl_repetition_penalty_changes_the_output_and_mmspec_follows():
    """Control: on this image (found by trying pixel seeds) the shipped 1.05 repetition penalty changes
    generate's greedy answer, and mmspec follows generate both with the shipped penalty and without it."""
    c = case("qwen2-vl-image")
    inputs = dict(c.inputs, pixel_values=pixels(16, 3 * 2 * 14 * 14, seed=108))
    shipped = c.model.generate(c.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **inputs)
    plain = c.model.generate(c.input_ids, do_sample=False, max_new_tokens=MAX_NEW, repetition_penalty=1.0, **inputs)
    assert not torch.equal(plain, shipped)
    for drafter in (MultimodalSelfDrafter(c.model), PromptLookupDrafter()):
        out = speculative_generate(c.model, drafter, c.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **inputs)
        assert_same(out.sequences, shipped, "qwen2-vl with the shipped penalty")
    out = speculative_generate(c.model, MultimodalSelfDrafter(c.model), c.input_ids, do_sample=False,
                               max_new_tokens=MAX_NEW, repetition_penalty=1.0, **inputs)
    assert_same(out.sequences, plain, "qwen2-vl without the penalty")


@pytest.mark.parametrize("drafter", ["self", "lookup", "self-with-images", "never-with-images"])
@pytest.mark.parametrize("key", ["qwen2-vl-image", "qwen2-vl-video"])
def test_qwen2_vl_call_without_any_setting_equals_generate(key, drafter):
    """The plain user call: no do_sample either side, so the shipped sampling defaults are in force too.
    Qwen2-VL ships do_sample with top_k 1, which makes sampling deterministic: both sides must still agree
    (and agree with the greedy answer), whatever the random draws."""
    c = case(key)
    expected = c.model.generate(c.input_ids, max_new_tokens=MAX_NEW, **c.inputs)
    assert torch.equal(expected, reference(key))
    out = speculative_generate(c.model, DRAFTERS[drafter](c.model), c.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=4,
                               generator=torch.Generator().manual_seed(1), **c.inputs)
    assert_same(out.sequences, expected, f"{key} / {drafter} with the shipped sampling settings")


@pytest.mark.parametrize("name", ["llava-1.5-7b-hf", "LLaVA-NeXT-Video-7B-hf", "llava-onevision-qwen2-0.5b-ov-hf"])
def test_llava_family_shipped_settings(name):
    """These ship `_from_model_config` generation configs: only token ids, which must be the shipped ones."""
    vlm = model(name)
    shipped = shipped_json(name, "generation_config.json")
    settings, _ = resolve_generation(vlm, {})
    assert settings.stop_ids == {shipped["eos_token_id"]}
    assert settings.config.bos_token_id == shipped["bos_token_id"]
    assert settings.config.pad_token_id == shipped.get("pad_token_id")
    assert not settings.sampling.do_sample and settings.config.repetition_penalty in (None, 1.0)


def test_processors_generate_builds_are_the_ones_mmspec_applies():
    qwen = model("Qwen2-VL-2B-Instruct")
    settings, _ = resolve_generation(qwen, {"do_sample": False, "max_new_tokens": MAX_NEW})
    from mmspec.generation import build_logits_processors

    settings.fix_lengths(10, MAX_NEW)
    processors = build_logits_processors(qwen, settings.config, 10)
    assert any(isinstance(p, lp.RepetitionPenaltyLogitsProcessor) and p.penalty == 1.05 for p in processors)


# ----------------------------------------------------------------------------------------- Whisper

WHISPERS = ["whisper-tiny", "whisper-large-v3"]


@lru_cache(maxsize=None)
def whisper_inputs(name: str, seed: int) -> torch.Tensor:
    config = model(name).config
    return pixels(1, config.num_mel_bins, 2 * config.max_source_positions, seed=seed)


@lru_cache(maxsize=None)
def whisper_reference(name: str, seed: int) -> torch.Tensor:
    whisper = model(name)
    return whisper.generate(whisper_inputs(name, seed), do_sample=False, max_new_tokens=24,
                            return_dict_in_generate=True).sequences


@pytest.mark.parametrize("drafter", ["self", "never", "lookup"])
@pytest.mark.parametrize("name", WHISPERS)
def test_whisper_greedy_equals_generate(name, drafter):
    whisper = model(name)
    for seed in range(3):
        draft = {"self": whisper, "never": NeverAgreeDrafter(whisper), "lookup": PromptLookupDrafter()}[drafter]
        out = speculative_generate(WhisperTarget(whisper), draft, None, do_sample=False, max_new_tokens=24,
                                   num_draft_tokens=4, input_features=whisper_inputs(name, seed))
        assert_same(out.sequences, whisper_reference(name, seed), f"{name} / {drafter} / seed {seed}")


@pytest.mark.parametrize("name", WHISPERS)
def test_whisper_shipped_prompt_and_suppression_in_force(name):
    """The shipped forced ids (detected language, transcribe, no timestamps) start every transcript, and
    no shipped suppressed token is ever chosen: the generation config is the one in force."""
    shipped = shipped_json(name, "generation_config.json")
    languages = set(shipped["lang_to_id"].values())
    suppressed = set(shipped["suppress_tokens"])
    transcripts = []
    for seed in range(3):
        sequence = whisper_reference(name, seed)[0].tolist()
        assert sequence[0] == shipped["decoder_start_token_id"]
        assert sequence[1] in languages
        assert sequence[2:4] == [shipped["task_to_id"]["transcribe"], shipped["no_timestamps_token_id"]]
        assert not suppressed & set(sequence[4:])
        assert sequence[4] not in shipped["begin_suppress_tokens"]
        transcripts.append(sequence[4:])
    assert any(len(set(t)) >= 4 for t in transcripts)
    processors = WhisperTarget(model(name)).build_logits_processors(model(name).generation_config, 4, [])
    kinds = {type(p) for p in processors}
    assert {lp.SuppressTokensLogitsProcessor, lp.SuppressTokensAtBeginLogitsProcessor} <= kinds


# ------------------------------------------------------------------------------------------- Janus

JANUS = "Janus-Pro-1B"


@lru_cache(maxsize=None)
def janus_prompts() -> list[torch.Tensor]:
    config = shipped_json(JANUS)
    boi = shipped_json(JANUS, "generation_config.json")["generation_kwargs"]["boi_token_id"]
    bos = config["text_config"]["bos_token_id"]
    return [torch.tensor([bos, 5661, 3535, 1245, 285, 9851, boi]), torch.tensor([bos, 4312, 4109, boi])]


def janus_generate_reference(janus, prompt: torch.Tensor) -> torch.Tensor:
    return janus.generate(prompt[None], generation_mode="image", do_sample=False,
                          attention_mask=torch.ones(1, len(prompt), dtype=torch.long))


def test_janus_converted_layout_loads_and_keeps_shipped_ids():
    janus = model(JANUS)
    shipped = shipped_json(JANUS)
    assert janus.config.image_token_id == shipped["image_token_id"]
    assert janus.config.text_config.vocab_size == shipped["text_config"]["vocab_size"] == 102400
    assert janus.config.vq_config.num_embeddings == shipped["vq_config"]["num_embeddings"] == 16384
    assert janus.model.generation_head.vision_head.weight.shape[0] == 16384
    assert janus.generation_config.generation_kwargs["boi_token_id"] == 100016
    target = JanusCFGTarget(janus, janus_prompts())
    assert target.boi == 100016 and target.bos == 100000 and target.pad == shipped["text_config"]["pad_token_id"]


@pytest.mark.parametrize("index", [0, 1])
def test_janus_greedy_image_tokens_equal_generate(index):
    janus = model(JANUS)
    guidance = janus.generation_config.guidance_scale  # the shipped value, which generate uses
    expected = janus_generate_reference(janus, janus_prompts()[index])
    assert len(set(expected[0].tolist())) >= 4
    ar = ar_generate(JanusCFGTarget(janus, janus_prompts(), guidance), [index], GREEDY)
    assert torch.equal(ar.tokens.flatten(1), expected)
    sjd = jacobi_generate(JanusCFGTarget(janus, janus_prompts(), guidance), [index], window=4, sampling=GREEDY,
                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(sjd.tokens.flatten(1), expected)


def test_janus_target_uses_the_shipped_guidance_scale(tmp_path):
    shipped = shipped_json(JANUS, "generation_config.json")
    (tmp_path / "generation_config.json").write_text(json.dumps(dict(shipped, guidance_scale=2.0)))
    janus = build(JANUS, generation_config=tmp_path)
    expected = janus_generate_reference(janus, janus_prompts()[0])
    ar = ar_generate(JanusCFGTarget(janus, janus_prompts()), [0], GREEDY)
    assert torch.equal(ar.tokens.flatten(1), expected)


# ---------------------------------------------------------------------------------------- LlamaGen

LLAMAGEN = "llamagen-gpt-b-c2i-256"
LLAMAGEN_FIELDS = ("vocab_size", "dim", "n_layer", "n_head", "n_kv_head", "multiple_of", "ffn_dim_multiplier", "rope_base",
                   "norm_eps", "initializer_range", "num_classes", "class_dropout_prob", "cls_token_num", "block_size")


def llamagen_config(**shrink) -> LlamaGenConfig:
    """The official GPT-B c2i arguments; only depth, width and the token grid shrunk (head_dim 64 kept)."""
    args = {k: v for k, v in shipped_json(LLAMAGEN).items() if k in LLAMAGEN_FIELDS}
    args.update(shrink)
    return LlamaGenConfig(**args)


SHRUNK_LLAMAGEN = dict(dim=128, n_layer=2, n_head=2, block_size=16, initializer_range=0.3)


def official_llamagen_shapes(args: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of LlamaGen's c2i `Transformer` (autoregressive/models/gpt.py) for `args`."""
    dim, heads = args["dim"], args["n_head"]
    kv_heads = args["n_kv_head"] or heads
    head_dim = dim // heads
    hidden = int(2 * 4 * dim / 3)
    if args["ffn_dim_multiplier"] is not None:
        hidden = int(args["ffn_dim_multiplier"] * hidden)
    hidden = hidden if hidden % args["multiple_of"] == 0 else hidden + args["multiple_of"] - hidden % args["multiple_of"]
    shapes = {
        "tok_embeddings.weight": (args["vocab_size"], dim),
        "cls_embedding.embedding_table.weight": (args["num_classes"] + int(args["class_dropout_prob"] > 0), dim),
        "norm.weight": (dim,),
        "output.weight": (args["vocab_size"], dim),
    }
    for i in range(args["n_layer"]):
        shapes.update({
            f"layers.{i}.attention.wqkv.weight": ((heads + 2 * kv_heads) * head_dim, dim),
            f"layers.{i}.attention.wo.weight": (dim, dim),
            f"layers.{i}.feed_forward.w1.weight": (hidden, dim),
            f"layers.{i}.feed_forward.w3.weight": (hidden, dim),
            f"layers.{i}.feed_forward.w2.weight": (dim, hidden),
            f"layers.{i}.attention_norm.weight": (dim,),
            f"layers.{i}.ffn_norm.weight": (dim,),
        })
    return shapes


def test_llamagen_gpt_b_official_layout_matches_and_loads(tmp_path):
    # Full size: mmspec's GPT-B has exactly the official parameter names and shapes (no weights allocated twice).
    full = {k: v for k, v in shipped_json(LLAMAGEN).items() if k in LLAMAGEN_FIELDS}
    with torch.device("meta"):
        gpt_b = LlamaGenForClassConditional(llamagen_config())
    assert {k: tuple(v.shape) for k, v in gpt_b.state_dict().items()} == official_llamagen_shapes(full)
    # Shrunk: an official-format checkpoint file ({"model": state_dict}, plus the freqs_cis buffer) loads.
    shrunk = dict(full, **SHRUNK_LLAMAGEN)
    generator = torch.Generator().manual_seed(0)
    state = {k: torch.randn(*shape, generator=generator) for k, shape in official_llamagen_shapes(shrunk).items()}
    state["freqs_cis"] = torch.zeros(17, 32, 2)
    torch.save({"model": state}, tmp_path / "c2i_B_256.pt")
    loaded = LlamaGenForClassConditional.from_llamagen_checkpoint(str(tmp_path / "c2i_B_256.pt"), llamagen_config(**SHRUNK_LLAMAGEN))
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key


@lru_cache(maxsize=None)
def llamagen_models():
    torch.manual_seed(0)
    target = LlamaGenForClassConditional(llamagen_config(**SHRUNK_LLAMAGEN)).eval()
    torch.manual_seed(1)
    small = LlamaGenForClassConditional(llamagen_config(**dict(SHRUNK_LLAMAGEN, n_layer=1))).eval()
    return target, small


@pytest.mark.parametrize("drafter", ["self", "small", "never"])
def test_llamagen_greedy_image_tokens_equal_plain_ar(drafter):
    """Greedy speculative decoding with the shipped guidance (cfg 4.0) equals plain AR decoding, classes 0 and 999."""
    target, small = llamagen_models()
    cfg = json.loads((fixture(LLAMAGEN) / "generation_config.json").read_text())["cfg_scale"]
    for label in (0, 999):
        expected = ar_generate(target, [label], GREEDY, guidance_scale=cfg).tokens
        assert len(set(expected.flatten().tolist())) >= 4
        if drafter == "never":
            d = _NeverAgreeImageDrafter(target, cfg)
        else:
            d = GuidedImageDrafter({"self": target, "small": small}[drafter], cfg)
        out = draft_generate(target, d, [label], num_draft_tokens=3, sampling=GREEDY, guidance_scale=cfg)
        assert torch.equal(out.tokens, expected)
        if drafter == "self":
            assert out.stats.accepted == out.stats.drafted > 0
        if drafter == "never":
            assert out.stats.accepted == 0


class _NeverAgreeImageDrafter(GuidedImageDrafter):
    def propose(self, view):
        proposal, sequence = super().propose(view), view.sequence
        logits = self.cfg.full_logits(sequence[:, 0], torch.cat([sequence[:, 1:], proposal.tokens], dim=1))
        start = sequence.shape[1] - 1
        proposal.tokens = logits[:, start : start + proposal.length].topk(2, dim=-1).indices[..., 1]
        return proposal


def test_generation_configs_load_with_transformers():
    """Every shipped generation_config.json (all but LlamaGen's, which has none) reads as a GenerationConfig."""
    for name in ["llava-1.5-7b-hf", "llava-onevision-qwen2-0.5b-ov-hf", "LLaVA-NeXT-Video-7B-hf", "Qwen2-VL-2B-Instruct",
                 *WHISPERS, JANUS]:
        assert isinstance(shipped_generation_config(name), GenerationConfig)
