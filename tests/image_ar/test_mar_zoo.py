"""The zoo's shapes-mar: it loads by name as a MARPipeline, ar and cspd make 64x64 images, the CLI writes one,
the card states what the judge measured, and CSpD on the trained pair samples what the target alone samples on
CSpD's schedule (a two-sample test, with a failing control). Skips when the zoo has no shapes-mar
(rebuild: the card's rebuild_command)."""

from __future__ import annotations

import json

import pytest
import torch

from mmspec.image_ar import cspd
from mmspec.image_ar.cspd import cspd_generate, cspd_schedule
from mmspec.image_ar.judge import load_judge
from mmspec.image_ar.mar_pipeline import MARPipeline
from mmspec.image_ar.masked_decode import target_generate
from mmspec.image_ar.recipes import train_toy_mar
from mmspec.sampling import seeded_generator

from .mixture_toy import energy_distance_test

pytestmark = [
    pytest.mark.skipif(not (train_toy_mar.ZOO_DIR / "model_index.json").is_file(), reason="no shapes-mar in the zoo"),
    pytest.mark.slow,  # samples the trained zoo pair thousands of times
]


@pytest.fixture(scope="module")
def pipe():
    return MARPipeline.from_pretrained("shapes-mar")


def test_it_loads_by_name_with_both_methods(pipe):
    assert pipe.available_methods == ["ar", "cspd"] and pipe.default_method == "cspd" and pipe.card["num_iter"] == 16
    assert pipe.model.seq_len == 16 and pipe.class_names[0] == "red circle" and pipe.draft is not None
    out = pipe(prompt="blue square", method="cspd", num_iter=8, num_draft=2, seed=0, progress_bar=False, num_images=2)
    assert [image.size for image in out.images] == [(64, 64)] * 2
    assert out.stats.drafter_forwards > 0 and out.stats.drafted > 0


def test_the_cli_writes_a_cspd_image(tmp_path, capsys):
    from mmspec.cli import main

    out = tmp_path / "red.png"
    assert main(["generate-image", "red circle", "--model", "shapes-mar", "--method", "cspd", "--num-iter", "8",
                 "--draft-steps", "2", "--out", str(out), "--json", "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["drafter_forwards"] > 0 and out.is_file()


def test_the_card_states_the_measured_judge_accuracy():
    card = json.loads((train_toy_mar.ZOO_DIR / "zoo_card.json").read_text())
    assert card["quality"]["vae_judge_accuracy_reconstructions"] > 0.5
    assert any(key.startswith("model_class_accuracy_cfg") for key in card["quality"])
    assert card["pipeline_defaults"]["judge"] == "shapes-image-ar"
    assert card["train_wall_time_s"] > 0 and card["rebuild_command"].startswith("python -m mmspec.image_ar.recipes.")


N = 400  # images per sample: the keep-every-draft control fails the test at this size
ALPHA = 0.01


@pytest.fixture(scope="module")
def pair(pipe):
    """CSpD's settings from the card, the judge's features of the target alone on CSpD's schedule (each verified
    window one step), and a function from tokens to judge features: raw tokens (1024 numbers, most of them
    background) leave a two-sample test without power, the judge's features of the decoded images do not."""
    judge = load_judge(pipe.card["judge"])
    model, draft = pipe.model.float(), pipe.draft.float()
    settings = {k: pipe.card[k] for k in ("num_iter", "num_draft", "prefill_ratio")}
    common = dict(cfg=pipe.card["cfg"], labels=torch.arange(N) % 24)

    @torch.no_grad()
    def features(tokens):
        latents = model.unpatchify(tokens) / pipe.vae.config.scaling_factor
        pixels = torch.cat([pipe.vae.float().decode(latents[i : i + 100]).sample for i in range(0, N, 100)])
        return torch.as_tensor(judge.features(pixels.clamp(-1, 1).add(1).div(2)))

    schedule = cspd_schedule(settings["num_iter"], model.seq_len, settings["num_draft"], settings["prefill_ratio"])
    reference, _ = target_generate(model, N, num_iter=settings["num_iter"], lefts=schedule,
                                   generator=seeded_generator("cpu", 100), **common)
    return draft, model, settings, common, features, features(reference)


def test_cspd_on_the_trained_pair_samples_the_targets_distribution(pair):
    """At the paper's ratio this pair keeps none of its drafts (the last-step Gaussians of two different heads
    barely overlap, BENCHMARKS.md): every window token is the target's own redraw, and the test passes."""
    draft, model, settings, common, features, reference = pair
    out = cspd_generate(draft, model, N, generator=seeded_generator("cpu", 0), **settings, **common)
    _, p_value = energy_distance_test(features(out.tokens), reference, permutations=400, seed=0)
    assert p_value > ALPHA and out.stats.drafted > 0 and out.stats.residual_fallbacks == 0


def test_control_keeping_every_draft_of_the_trained_pair_fails_the_same_test(pair, monkeypatch):
    draft, model, settings, common, features, reference = pair
    monkeypatch.setattr(cspd, "accept_drafts", lambda x, p, q, t, g: torch.ones(x.shape[0], dtype=torch.bool))
    out = cspd_generate(draft, model, N, generator=seeded_generator("cpu", 0), **settings, **common)
    _, p_value = energy_distance_test(features(out.tokens), reference, permutations=400, seed=0)
    assert out.stats.alpha == 1.0 and p_value < ALPHA
