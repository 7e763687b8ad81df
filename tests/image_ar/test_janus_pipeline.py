"""Janus text-to-image through the user surfaces: the pipeline, `mmspec generate-image` and `mmspec bench image`."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.image_ar import JanusCFGTarget, JanusImagePipeline, SpeculativeImagePipeline, ar_generate
from mmspec.sampling import SamplingConfig

from .pipeline_checks import OPTIONS, generate_image_default_out, generate_image_fails, generate_image_json, seeded
from .tiny_image_folder import build_tiny_folder
from .tiny_janus import BOI, BOS, build_janus_folder, tiny_janus

METHODS = ["ar", "sjd", "gsd", "lantern"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_janus_folder(tmp_path_factory.mktemp("tiny-janus"))


def test_from_pretrained_recognises_janus(pipe, folder):
    assert isinstance(pipe, JanusImagePipeline) and pipe.folder == folder and pipe.model.dtype == torch.float32
    assert pipe.available_methods == METHODS and pipe.default_method == "sjd" and pipe.default_guidance_scale == 5.0
    assert isinstance(JanusImagePipeline.from_pretrained(folder), JanusImagePipeline)


def test_prompt_follows_the_janus_chat_template(pipe):
    """Chat template with the generation prompt, then the processor's image mode appends BOI."""
    ids = pipe.encode_prompt("a red circle")
    tokenizer = pipe.processor.tokenizer
    assert ids[0] == BOS and ids[-1] == BOI
    assert tokenizer.decode(ids[1:-1]) == "<|User|> : a red circle <|Assistant|> :"


def test_tokenizer_only_folder_appends_boi(tmp_path):
    pipe = SpeculativeImagePipeline.from_pretrained(build_janus_folder(tmp_path / "j", processor="tokenizer"))
    ids = pipe.encode_prompt("a blue square")
    assert ids.tolist() == [BOS, 9, 11, 14, BOI]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_makes_images_and_stats(pipe, method):
    out = pipe(["a red circle", "a blue square"], method=method, num_images=2, guidance_scale=2.0, generator=seeded(),
               progress_bar=False, **OPTIONS.get(method, {}))
    assert len(out.images) == 4 and all(isinstance(im, Image.Image) and im.size == (8, 8) for im in out.images)
    assert out.tokens.shape == (4, 4, 4) and out.method == method and out.stats.method == method
    assert out.prompts == ["a red circle", "a red circle", "a blue square", "a blue square"] and out.class_labels == []
    s = out.stats
    assert s.new_tokens == 64 and s.step_compression == pytest.approx(64 / s.target_forwards) and s.total_time > 0
    assert s.drafter_forwards == 0


def test_greedy_sjd_equals_ar_and_transformers(pipe):
    """temperature 0: SJD (and every method) gives AR's tokens, which are transformers' own greedy image generate."""
    tokens = {m: pipe("a green triangle", method=m, temperature=0, guidance_scale=2.0, progress_bar=False,
                      **OPTIONS.get(m, {})).tokens for m in METHODS}
    for method in METHODS[1:]:
        assert torch.equal(tokens[method], tokens["ar"]), method
    prompt = pipe.encode_prompt("a green triangle")[None]
    expected = pipe.model.generate(prompt, generation_mode="image", do_sample=False, guidance_scale=2.0,
                                   attention_mask=torch.ones_like(prompt))
    assert torch.equal(tokens["ar"].flatten(1), expected)


def test_seeded_sampling_repeats_and_np_output(pipe):
    a = pipe("a red circle", method="sjd", generator=seeded(3), progress_bar=False)
    b = pipe("a red circle", method="sjd", generator=seeded(3), progress_bar=False, output_type="np")
    assert torch.equal(a.tokens, b.tokens)
    assert isinstance(b.images, np.ndarray) and b.images.shape == (1, 8, 8, 3) and 0 <= b.images.min() <= b.images.max() <= 1
    # The images are Janus' VQ decoder output for those tokens.
    target = JanusCFGTarget(pipe.model)
    np.testing.assert_allclose(b.images[0], ((target.decode(a.tokens)[0].clamp(-1, 1) + 1) / 2).permute(1, 2, 0).numpy(),
                               atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": "  "}, "prompt is empty"),
        ({"prompt": None}, "no prompt"),
        ({"prompt": ["a", 3]}, "prompts are text"),
        ({"prompt": "a", "method": "sd"}, "needs a drafter: a smaller Janus"),
        ({"prompt": "a", "method": "beam"}, "unknown method 'beam' for Janus"),
        ({"prompt": "a", "guidance_scale": 0.5}, "guidance_scale must be"),
        ({"prompt": "a", "guidance_scale": float("nan")}, "guidance_scale must be"),
        ({"prompt": "a", "class_labels": 1}, "text-conditional"),
        ({"prompt": "a", "num_images": 0}, "num_images"),
        ({"prompt": "a", "lantern_size": 3}, "unknown method option"),
        ({"prompt": "a", "method": "lantern", "drafts": "drafter"}, "no Janus drafter is loaded"),
    ],
)
def test_bad_inputs(pipe, kwargs, message):
    with pytest.raises(MMSpecError, match=message):
        pipe(**kwargs, progress_bar=False)


def test_folder_errors(tmp_path, folder):
    with pytest.raises(MMSpecError, match="no processor or tokenizer"):
        SpeculativeImagePipeline.from_pretrained(build_janus_folder(tmp_path / "bare", processor="none"))
    with pytest.raises(MMSpecError, match="drafter .* is not a Janus checkpoint"):
        SpeculativeImagePipeline.from_pretrained(folder, drafter=str(build_tiny_folder(tmp_path / "llamagen")))


# --- a smaller Janus as drafter: `sd` and LANTERN on drafter drafts ----------------------------------------------


def with_janus_drafter(folder, tmp_path_factory, seed):
    """The tiny Janus with a tiny Janus drafter (same codebook and tokenizer; seed 0 = its own weights)."""
    drafter_folder = tmp_path_factory.mktemp(f"tiny-janus-drafter-{seed}")
    tiny_janus(seed=seed).save_pretrained(drafter_folder)
    return SpeculativeImagePipeline.from_pretrained(folder, drafter=str(drafter_folder))


@pytest.fixture(scope="module")
def drafted(folder, tmp_path_factory):
    return with_janus_drafter(folder, tmp_path_factory, seed=1)  # other weights: drafts get rejected


@pytest.mark.parametrize("seed", [0, 1])
def test_a_janus_drafter_enables_sd(folder, tmp_path_factory, seed):
    pipe = with_janus_drafter(folder, tmp_path_factory, seed)
    assert pipe.available_methods == METHODS + ["sd"] and pipe.drafter is not None
    greedy = {m: pipe("a green triangle", method=m, temperature=0, guidance_scale=2.0, progress_bar=False,
                      **OPTIONS.get(m, {})) for m in ("ar", "sd", "lantern")}
    for method in ("sd", "lantern"):  # greedy: every method is AR exactly
        assert torch.equal(greedy[method].tokens, greedy["ar"].tokens), method
        stats = greedy[method].stats
        assert stats.drafter_forwards > 0
        if seed == 0:  # the target's own weights draft: every draft is accepted
            assert stats.accepted == stats.drafted and stats.target_forwards < 16


@pytest.mark.slow
def test_janus_sd_sampling_is_seeded(drafted):
    a = drafted(["a red circle", "a blue square"], method="sd", generator=seeded(5), progress_bar=False)
    b = drafted(["a red circle", "a blue square"], method="sd", generator=seeded(5), progress_bar=False)
    assert torch.equal(a.tokens, b.tokens) and a.stats.new_tokens == 32 and a.stats.drafter_forwards > 0


def test_a_mismatched_janus_drafter_is_refused(folder, tmp_path):
    from transformers import JanusForConditionalGeneration

    config = tiny_janus().config
    config.vq_config.num_embeddings = 10  # another codebook
    other = tmp_path / "other-codebook"
    JanusForConditionalGeneration(config).save_pretrained(other)
    with pytest.raises(MMSpecError, match="must match"):
        SpeculativeImagePipeline.from_pretrained(folder, drafter=str(other))


def test_cli_generate_image_json(folder, tmp_path, capsys):
    data = generate_image_json(folder, "a red circle", "sjd", 1, tmp_path / "x.png", capsys, size=(8, 8))
    assert data["prompt"] == "a red circle"


def test_cli_default_out_and_text_output(folder, tmp_path, capsys, monkeypatch):
    generate_image_default_out(folder, "a red circle!", "a_red_circle.png", tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["", "--method", "ar"], "prompt is empty"),
        (["a red circle", "--method", "sd"], "needs a drafter"),
        (["a red circle", "--guidance-scale", "-1"], "guidance_scale must be"),
    ],
)
def test_cli_errors(folder, capsys, argv, message):
    generate_image_fails(folder, capsys, argv, message)


@pytest.mark.slow
def test_cli_bench_image_on_janus(folder, capsys):
    code = main(["bench", "image", "--model", str(folder), "--prompts", "a red circle", "a blue square", "--n", "2",
                 "--lantern", "0.1,4", "--guidance-scale", "2", "--threads", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = {r["method"]: r for r in json.loads(captured.out)["methods"]}
    assert list(rows) == ["ar", "sjd W=16", "gsd W=16", "lantern d=0.1 k=4 jacobi"]
    for row in rows.values():
        assert row["new_tokens"] == 32 and row["target_forwards"] <= 32 and row["wall_time_median_s"] > 0
    assert rows["ar"]["step_compression"] == 1.0 and rows["sjd W=16"]["step_compression"] >= 1.0
    assert main(["bench", "image", "--model", str(folder), "--n", "1"]) == 2
    assert "--prompts" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.slow
def test_cli_with_a_janus_drafter(folder, tmp_path, capsys):
    drafter_folder = tmp_path / "drafter"
    tiny_janus(seed=1).save_pretrained(drafter_folder)
    code = main(["bench", "image", "--model", str(folder), "--drafter", str(drafter_folder), "--prompts", "a red circle",
                 "--n", "2", "--lantern", "0.1,4", "--threads", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = {r["method"]: r for r in json.loads(captured.out)["methods"]}
    assert "sd k=4" in rows and rows["sd k=4"]["drafter_forwards"] > 0 and "lantern d=0.1 k=4 drafter" in rows
    out = tmp_path / "x.png"
    assert main(["generate-image", "a red circle", "--model", str(folder), "--drafter", str(drafter_folder),
                 "--method", "sd", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "sd" and out.is_file()


@pytest.mark.parametrize("method", ["ar", "sjd"])
def test_callback_on_round_places_each_round_in_its_image(pipe, method):
    rounds = []
    out = pipe(["a red circle", "a blue square"], method=method, generator=seeded(2), progress_bar=False, output_type="np",
               callback_on_round=lambda index, info: rounds.append(info))
    rebuilt = torch.full_like(out.tokens.flatten(1), -1)
    for info in rounds:
        rebuilt[info.chunk, info.position : info.position + len(info.tokens)] = torch.tensor(info.tokens)
    assert torch.equal(rebuilt, out.tokens.flatten(1)) and len(rounds) == out.stats.target_forwards


def test_ar_generate_with_the_pipeline_target_matches_pipe(pipe):
    """The pipeline's target is a plain JanusCFGTarget: the lower-level API gives the same tokens."""
    out = pipe("a red circle", method="ar", temperature=0, guidance_scale=2.0, progress_bar=False)
    target = JanusCFGTarget(pipe.model, [pipe.encode_prompt("a red circle")], 2.0)
    assert torch.equal(ar_generate(target, [0], SamplingConfig(do_sample=False)).tokens, out.tokens)


def test_shared_surface_on_the_class_conditional_pipeline(tmp_path):
    """The same guidance check and bench conditions (class-name prompts) on the LlamaGen pipeline."""
    pipe = SpeculativeImagePipeline.from_pretrained(build_tiny_folder(tmp_path / "llamagen", drafter=False))
    assert pipe.conditioning == "class" and pipe.bench_conditions(4) == [0, 1, 2, 0]
    assert pipe.bench_conditions(3, ["green triangle", "Red Circle"]) == [2, 0, 2]
    with pytest.raises(MMSpecError, match="guidance_scale must be"):
        pipe(class_labels=0, guidance_scale=-2.0, progress_bar=False)
