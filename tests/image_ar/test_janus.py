"""Janus (transformers' JanusForConditionalGeneration) as a guided image target, on a tiny random config."""

import pytest
import torch

from mmspec import SamplingConfig
from mmspec.errors import MMSpecError
from mmspec.image_ar import (
    GuidedImageDrafter,
    JanusCFGTarget,
    ar_generate,
    draft_generate,
    jacobi_generate,
    janus_generate,
    sjd_accept,
)
from mmspec.testing import reload_from_disk

from .tiny_janus import BOI, BOS, PAD, tiny_janus

GREEDY = SamplingConfig(do_sample=False)
SAMPLE = SamplingConfig(do_sample=True)
PROMPTS = [torch.tensor([BOS, 10, 11, 12, BOI]), torch.tensor([BOS, 20, BOI])]


@pytest.fixture(scope="module")
def janus():
    """4 x 4 image tokens over a 12-code VQ; saved and reloaded through from_pretrained."""
    return reload_from_disk(tiny_janus())


def test_incremental_logits_match_one_full_forward(janus):
    """Prefill + drafts, a rolled-back step, and further steps give the logits of one full forward."""
    target = JanusCFGTarget(janus, PROMPTS, guidance_scale=2.0)
    tokens = torch.randint(0, 12, (1, 9), generator=torch.Generator().manual_seed(0))
    full = target.full_logits([0], tokens)
    first = target.start([0], tokens[:, :3])
    rejected = target.extend(tokens[:, 3:4])
    target.truncate(3)
    assert target.length == 3
    rest = target.extend(tokens[:, 3:7])
    last = target.extend(tokens[:, 7:])
    torch.testing.assert_close(torch.cat([first, rest, last], dim=1), full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rejected, rest[:, :1], rtol=1e-4, atol=1e-4)
    assert full.shape == (1, 10, 12) and target.forwards == 4


def test_logits_are_the_generation_head_with_guidance(janus):
    """Against the model's own pieces: text embeddings, generation embeddings, language model, generation head, CFG."""
    tokens = torch.tensor([[4, 7]])
    prompt = PROMPTS[0][None]
    rows = torch.cat([prompt, torch.tensor([[BOS, PAD, PAD, PAD, BOI]])])
    embeds = torch.cat([janus.get_input_embeddings()(rows), janus.prepare_embeddings_for_image_generation(tokens.repeat(2, 1))], 1)
    with torch.no_grad():
        scores = janus.model.generation_head(janus.model.language_model(inputs_embeds=embeds).last_hidden_state[:, 4:])
    cond, uncond = scores.chunk(2)
    expected = uncond + 3.0 * (cond - uncond)
    torch.testing.assert_close(JanusCFGTarget(janus, PROMPTS, 3.0).full_logits([0], tokens), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("index", [0, 1])
def test_greedy_matches_transformers_image_generate(janus, index):
    """Our AR and SJD greedy decoding reproduce `generate(generation_mode="image")` token for token."""
    prompt = PROMPTS[index]
    expected = janus.generate(prompt[None], generation_mode="image", do_sample=False, guidance_scale=2.0,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    ar = ar_generate(JanusCFGTarget(janus, PROMPTS, 2.0), [index], GREEDY)
    assert torch.equal(ar.tokens.flatten(1), expected)
    for window in (1, 4, 16):
        sjd = jacobi_generate(JanusCFGTarget(janus, PROMPTS, 2.0), [index], window=window, sampling=GREEDY,
                              generator=torch.Generator().manual_seed(0))
        assert torch.equal(sjd.tokens.flatten(1), expected)
        assert sjd.stats.target_forwards <= 16


def test_seeded_sampling_repeats_and_methods_run(janus):
    runs = [janus_generate(janus, PROMPTS, method="sjd", guidance_scale=2.0, generator=torch.Generator().manual_seed(5))
            for _ in range(2)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert runs[0].tokens.shape == (2, 4, 4) and runs[0].stats.new_tokens == 32
    gsd = janus_generate(janus, PROMPTS, method="gsd", gsd_window=0, guidance_scale=2.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(gsd.tokens, runs[0].tokens)  # G = {x}: GSD is SJD
    lantern = janus_generate(janus, PROMPTS, method="lantern", lantern_delta=0.0, lantern_k=4, guidance_scale=2.0,
                             generator=torch.Generator().manual_seed(5))
    assert torch.equal(lantern.tokens, runs[0].tokens)  # delta = 0: LANTERN is SJD's exact acceptance
    relaxed = janus_generate(janus, PROMPTS * 3, method="lantern", lantern_delta=0.5, lantern_k=6, guidance_scale=2.0,
                             generator=torch.Generator().manual_seed(5))
    plain = jacobi_generate(JanusCFGTarget(janus, PROMPTS * 3, 2.0), list(range(6)), rule=sjd_accept,
                            generator=torch.Generator().manual_seed(5))
    assert relaxed.stats.target_forwards < plain.stats.target_forwards


def test_decode_to_pixels_and_codebook(janus):
    target = JanusCFGTarget(janus, PROMPTS, 2.0)
    tokens = ar_generate(target, [1], GREEDY).tokens
    pixels = target.decode(tokens)
    assert pixels.shape == (1, 3, 8, 8) and torch.isfinite(pixels).all()
    book = target.codebook_embeddings()
    assert book.shape == (12, 4) and torch.allclose(book.norm(dim=-1), torch.ones(12))
    with pytest.raises(MMSpecError, match="token grids"):
        target.decode(tokens.flatten(1))


def test_bad_inputs(janus):
    with pytest.raises(MMSpecError, match="out of range"):
        JanusCFGTarget(janus, PROMPTS).start([2])
    with pytest.raises(MMSpecError, match="one prompt at a time"):
        JanusCFGTarget(janus, PROMPTS).start([0, 1])
    with pytest.raises(MMSpecError, match="not a Janus"):
        JanusCFGTarget(torch.nn.Linear(2, 2), PROMPTS)
    with pytest.raises(MMSpecError, match="drafter"):
        janus_generate(janus, PROMPTS, method="sd")
    with pytest.raises(MMSpecError, match="non-empty prompt"):
        janus_generate(janus, [])
    target = JanusCFGTarget(janus)  # prompts may come later
    target.set_prompts(PROMPTS[1:])
    assert target.start([0]).shape == (1, 1, 12)


def test_gsd_latents_are_what_the_language_model_reads_for_each_code(janus):
    """Janus' input embedding of image code c is generation_aligner(generation_embeddings(c)): GSD's latent space."""
    from functools import partial

    from mmspec.image_ar import gsd_accept

    target = JanusCFGTarget(janus, PROMPTS, 2.0)
    table = target.token_embeddings()
    hidden = janus.config.get_text_config().hidden_size
    assert table.shape == (12, hidden)
    for code in (0, 7, 11):
        row = janus.prepare_embeddings_for_image_generation(torch.tensor([[code]]))[0, 0]
        torch.testing.assert_close(table[code], row.float())
    # janus_generate's GSD measures that table by default; the codebook on request
    options = dict(gsd_window=4, gsd_prob_threshold=None, gsd_distance_threshold=1.0)
    runs = {latents: janus_generate(janus, PROMPTS * 2, method="gsd", guidance_scale=2.0, gsd_latents=latents,
                                    generator=torch.Generator().manual_seed(5), **options).tokens
            for latents in ("embeddings", "codebook")}
    for latents, vectors in (("embeddings", table), ("codebook", target.codebook_embeddings())):
        rule = partial(gsd_accept, window=4, prob_threshold=None, embeddings=vectors, distance_threshold=1.0)
        direct = jacobi_generate(JanusCFGTarget(janus, PROMPTS * 2, 2.0), [0, 1, 2, 3], rule=rule, init="left",
                                 generator=torch.Generator().manual_seed(5))
        assert torch.equal(runs[latents], direct.tokens), latents
    assert not torch.equal(runs["embeddings"], runs["codebook"])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "sjd", "sd"])
def test_shipped_text_generation_settings_do_not_reach_the_image_methods(method):
    """A checkpoint's generation config (guidance_scale, text sampling settings, penalties) is Janus' text side:
    the image methods take the scale and sampling from the call, so the same seed gives the same image."""
    plain, shipped = tiny_janus(), tiny_janus()
    config = shipped.generation_config
    config.guidance_scale, config.do_sample, config.temperature, config.repetition_penalty = 2.0, True, 0.5, 1.5
    runs = []
    for model in (plain, shipped):
        target = JanusCFGTarget(model, PROMPTS, 2.0)
        if method == "sd":
            drafter = JanusCFGTarget(tiny_janus(seed=1), PROMPTS, 2.0)
            runs.append(draft_generate(target, GuidedImageDrafter(drafter), [0, 1], num_draft_tokens=3, sampling=SAMPLE,
                                       generator=torch.Generator().manual_seed(4)).tokens)
        else:
            runs.append(janus_generate(model, PROMPTS, method=method, guidance_scale=2.0, sampling=SAMPLE,
                                       generator=torch.Generator().manual_seed(4)).tokens)
    assert torch.equal(runs[0], runs[1])
