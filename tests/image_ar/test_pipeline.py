"""SpeculativeImagePipeline on a tiny random model folder (target + vq/ + drafter/ + classes.json)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmspec.errors import MMSpecError
from mmspec.image_ar import METHODS, MethodConfig, SpeculativeImagePipeline
from mmspec.sampling import SamplingConfig

from .pipeline_checks import OPTIONS, seeded
from .tiny_image_folder import CLASSES, build_tiny_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_folder(tmp_path_factory.mktemp("tiny-image-ar"))


def test_from_pretrained_reads_the_folder(pipe, folder):
    assert pipe.drafter is not None and pipe.class_names == CLASSES
    assert pipe.available_methods == list(METHODS) and pipe.default_method == "sjd"
    assert pipe.default_guidance_scale == 4.0  # LlamaGen's default for a model with a null class
    assert pipe.model.dtype == torch.float32 and pipe.folder == folder
    no_drafter = SpeculativeImagePipeline.from_pretrained(folder, drafter=False)
    assert no_drafter.drafter is None and "sd" not in no_drafter.available_methods


def test_zoo_card_defaults(tmp_path):
    folder = build_tiny_folder(tmp_path / "m", drafter=False, card={"default_method": "gsd", "guidance_scale": 2.5})
    pipe = SpeculativeImagePipeline.from_pretrained(folder)
    assert pipe.default_method == "gsd" and pipe.default_guidance_scale == 2.5
    out = pipe(class_labels=0, generator=seeded(), progress_bar=False)
    assert out.method == "gsd" and out.stats.method == "gsd"


@pytest.mark.parametrize("method", METHODS)
def test_every_method_makes_images_and_stats(pipe, method):
    out = pipe(class_labels=[0, 2], method=method, generator=seeded(), progress_bar=False, **OPTIONS.get(method, {}))
    assert len(out.images) == 2 and all(isinstance(im, Image.Image) and im.size == (16, 16) for im in out.images)
    assert out.tokens.shape == (2, 4, 4) and out.class_labels == [0, 2] and out.method == method
    s = out.stats
    assert s.new_tokens == 32 and s.step_compression == pytest.approx(32 / s.target_forwards)
    assert (s.drafter_forwards > 0) == (method in ("sd", "lantern"))  # lantern uses the drafter when there is one


def test_greedy_is_the_same_image_for_every_method(pipe):
    """temperature 0: lossless methods equal greedy AR, and so do the relaxed ones (a one-hot target)."""
    tokens = {m: pipe(class_labels=[0, 1, 2], method=m, temperature=0, progress_bar=False, **OPTIONS.get(m, {})).tokens
              for m in METHODS}
    for method in METHODS:
        assert torch.equal(tokens[method], tokens["ar"]), method
    jacobi_lantern = pipe(class_labels=[0, 1, 2], method="lantern", drafts="jacobi", temperature=0, progress_bar=False,
                          lantern_k=4)
    assert torch.equal(jacobi_lantern.tokens, tokens["ar"]) and jacobi_lantern.stats.drafter_forwards == 0


def test_prompts_num_images_and_seeds(pipe):
    out = pipe(prompt=["Blue  Square", "red circle"], num_images=2, method="sjd", generator=seeded(3), progress_bar=False)
    assert out.class_labels == [1, 1, 0, 0] and out.tokens.shape == (4, 4, 4)
    again = pipe(prompt=["blue square", "red circle"], num_images=2, method="sjd", generator=seeded(3), progress_bar=False)
    assert torch.equal(out.tokens, again.tokens)
    torch.manual_seed(7)
    a = pipe(class_labels=1, method="sd", progress_bar=False).tokens
    torch.manual_seed(7)
    assert torch.equal(a, pipe(class_labels=1, method="sd", progress_bar=False).tokens)


def test_numpy_output(pipe):
    out = pipe(class_labels=2, output_type="np", generator=seeded(), progress_bar=False, top_k=4, top_p=0.9, guidance_scale=1.0)
    assert isinstance(out.images, np.ndarray) and out.images.shape == (1, 16, 16, 3) and out.images.dtype == np.float32
    assert 0.0 <= out.images.min() and out.images.max() <= 1.0


@pytest.mark.parametrize("method", METHODS)
def test_progress_advances_by_committed_tokens(pipe, method):
    counts = []
    pipe.runner.run(MethodConfig(method=method, lantern_k=4), [0, 1], sampling=SamplingConfig(do_sample=True), generator=seeded(),
                    on_tokens=counts.append)
    assert sum(counts) == 32 and all(c >= 1 for c in counts)
    if method != "ar":
        assert max(counts) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_callback_on_round_sees_every_committed_token_where_it_goes(pipe, method):
    """Rebuilding the grids from the rounds' (chunk, position, tokens) gives the output exactly."""
    rounds = []
    out = pipe(class_labels=[0, 1], method=method, lantern_k=4, num_images=2, generator=seeded(3), output_type="np",
               progress_bar=False, callback_on_round=lambda index, info: rounds.append((index, info)))
    assert [index for index, _ in rounds] == list(range(len(rounds))) == list(range(out.stats.target_forwards))
    rebuilt = torch.full_like(out.tokens.flatten(1), -1)
    for _, info in rounds:
        assert 0 <= info.accepted <= info.drafted and len(info.tokens) == info.accepted + 1
        rebuilt[info.chunk, info.position : info.position + len(info.tokens)] = torch.tensor(info.tokens)
    assert torch.equal(rebuilt, out.tokens.flatten(1))
    assert sum(info.accepted for _, info in rounds) == out.stats.accepted
    assert rounds[-1][1].new_tokens == out.tokens.numel() == 4 * 16
    # Control: the last round's tokens placed one position off do not rebuild the grid.
    last = rounds[-1][1]
    rebuilt[last.chunk, last.position - 1 : last.position - 1 + len(last.tokens)] = torch.tensor(last.tokens[::-1]) + 1
    assert not torch.equal(rebuilt, out.tokens.flatten(1))


def test_callback_on_round_must_be_callable(pipe):
    with pytest.raises(MMSpecError, match="callback_on_round must be a function"):
        pipe(class_labels=0, method="ar", progress_bar=False, callback_on_round="print")


def test_bad_inputs_are_clear_errors(pipe, folder, tmp_path):
    cases = [
        (dict(prompt="purple hexagon"), "unknown class 'purple hexagon'"),
        (dict(), "exactly one of"),
        (dict(class_labels=0, prompt="red circle"), "exactly one of"),
        (dict(class_labels=3), r"in \[0, 3\)"),
        (dict(class_labels=0, output_type="latent"), "output_type"),
        (dict(class_labels=0, method="beam"), "unknown method"),
        (dict(class_labels=0, temperature=-1.0), "temperature"),
        (dict(class_labels=0, num_images=0), "num_images"),
        (dict(class_labels=0, init="diagonal"), "init"),
    ]
    for kwargs, message in cases:
        with pytest.raises(MMSpecError, match=message):
            pipe(progress_bar=False, **kwargs)
    no_drafter = SpeculativeImagePipeline.from_pretrained(folder, drafter=False)
    with pytest.raises(MMSpecError, match="needs a drafter"):
        no_drafter(class_labels=0, method="sd", progress_bar=False)
    with pytest.raises(MMSpecError, match="needs a drafter"):
        no_drafter(class_labels=0, method="lantern", drafts="drafter", progress_bar=False)


def test_bad_folders_are_clear_errors(tmp_path):
    with pytest.raises(MMSpecError, match="not a zoo model"):
        SpeculativeImagePipeline.from_pretrained(tmp_path / "nothing")
    no_vq = build_tiny_folder(tmp_path / "no-vq", drafter=False)
    for f in (no_vq / "vq").iterdir():
        f.unlink()
    (no_vq / "vq").rmdir()
    with pytest.raises(MMSpecError, match="no vq/ folder"):
        SpeculativeImagePipeline.from_pretrained(no_vq)
    wrong = build_tiny_folder(tmp_path / "wrong-classes", drafter=False)
    (wrong / "classes.json").write_text(json.dumps(["only one"]))
    with pytest.raises(MMSpecError, match="classes.json lists 1 names"):
        SpeculativeImagePipeline.from_pretrained(wrong)
    no_classes = SpeculativeImagePipeline.from_pretrained(build_tiny_folder(tmp_path / "no-classes", classes=False))
    with pytest.raises(MMSpecError, match="no classes.json"):
        no_classes(prompt="red circle", progress_bar=False)


def test_gsd_group_options_come_from_the_card_unless_given(folder):
    from mmspec.image_ar.rules import GSD_DISTANCE_THRESHOLD, GSD_PROB_THRESHOLD, GSD_WINDOW

    pipe = SpeculativeImagePipeline.from_pretrained(folder)
    paper = {"gsd_window": GSD_WINDOW, "gsd_prob_threshold": GSD_PROB_THRESHOLD,
             "gsd_distance_threshold": GSD_DISTANCE_THRESHOLD, "gsd_latents": "embeddings"}
    assert pipe.gsd_settings() == paper  # no card values: the authors' defaults
    pipe.card = {"gsd_defaults": {"gsd_window": 5, "gsd_prob_threshold": None, "gsd_distance_threshold": 1.5}}
    assert pipe.gsd_settings() == {"gsd_window": 5, "gsd_prob_threshold": None, "gsd_distance_threshold": 1.5,
                                   "gsd_latents": "embeddings"}
    assert pipe.gsd_settings(gsd_window=3, gsd_prob_threshold=0.2)["gsd_window"] == 3
    assert pipe.gsd_settings(gsd_prob_threshold=None)["gsd_prob_threshold"] is None  # None = filter off, not "default"
    by_card = pipe(class_labels=1, method="gsd", generator=seeded(3), output_type="np", progress_bar=False)
    explicit = pipe(class_labels=1, method="gsd", generator=seeded(3), output_type="np", progress_bar=False,
                    gsd_window=5, gsd_prob_threshold=None, gsd_distance_threshold=1.5)
    assert torch.equal(by_card.tokens, explicit.tokens)
