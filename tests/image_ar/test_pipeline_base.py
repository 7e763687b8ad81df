"""The image pipelines on mmspec's pipeline base (diffusers' DiffusionPipeline): save/load, dtypes, .to(), outputs."""

import json

import numpy as np
import pytest
import torch

from mmspec.drafters import Drafter, NoDrafter
from mmspec.errors import MMSpecError
from mmspec.image_ar import (
    GridJacobiDrafter,
    GuidedImageDrafter,
    ImageGenerationOutput,
    JanusImagePipeline,
    SpeculativeImagePipeline,
)
from mmspec.pipelines import ImagePipelineOutput, SpeculativePipeline

from .pipeline_checks import seeded
from .tiny_image_folder import CLASSES, build_tiny_folder
from .tiny_janus import build_janus_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_folder(tmp_path_factory.mktemp("tiny-image-ar"), card={"guidance_scale": 2.5})


def generate(pipe, method="sjd", **kwargs):
    return pipe(class_labels=[0, 2], method=method, generator=seeded(3), output_type="np", progress_bar=False, **kwargs)


def test_the_pipeline_is_a_diffusers_pipeline(pipe):
    from diffusers import DiffusionPipeline

    import mmspec

    assert isinstance(pipe, SpeculativePipeline) and isinstance(pipe, DiffusionPipeline)
    assert mmspec.ImagePipeline is SpeculativeImagePipeline
    assert set(pipe.components) == {"model", "vq", "drafter"}
    assert pipe.device == torch.device("cpu") and pipe.dtype == torch.float32
    assert pipe.methods == ["ar", "sd", "sjd", "gsd", "lantern"] and pipe.check_method(None) == "sjd"


@pytest.mark.slow
def test_save_and_load_round_trip_gives_identical_seeded_images(pipe, tmp_path):
    pipe.save_pretrained(tmp_path / "saved")
    index = json.loads((tmp_path / "saved" / "model_index.json").read_text())
    assert index["_class_name"] == "SpeculativeImagePipeline" and index["class_names"] == CLASSES
    for sub in ("model", "vq", "drafter"):
        assert (tmp_path / "saved" / sub / "config.json").is_file()
    loaded = SpeculativeImagePipeline.from_pretrained(tmp_path / "saved")
    assert type(loaded) is SpeculativeImagePipeline and loaded.folder == tmp_path / "saved"
    assert loaded.class_names == CLASSES and loaded.default_guidance_scale == 2.5 and loaded.drafter is not None
    for method in ("sjd", "sd"):
        before, after = generate(pipe, method), generate(loaded, method)
        assert torch.equal(before.tokens, after.tokens)
        np.testing.assert_array_equal(before.images, after.images)
    again = loaded(prompt="blue square", method="sjd", generator=seeded(1), progress_bar=False)
    assert again.class_labels == [1]
    without = SpeculativeImagePipeline.from_pretrained(tmp_path / "saved", drafter=False)
    assert without.drafter is None and "sd" not in without.available_methods


def test_a_saved_pipeline_without_a_drafter_loads_without_one(tmp_path):
    folder = build_tiny_folder(tmp_path / "m", drafter=False)
    SpeculativeImagePipeline.from_pretrained(folder).save_pretrained(tmp_path / "saved")
    loaded = SpeculativeImagePipeline.from_pretrained(tmp_path / "saved")
    assert loaded.drafter is None and "sd" not in loaded.available_methods
    with pytest.raises(MMSpecError, match="needs a drafter"):
        loaded(class_labels=0, method="sd", progress_bar=False)


@pytest.mark.slow
def test_torch_dtype_and_to(folder):
    half = SpeculativeImagePipeline.from_pretrained(folder, torch_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.vq.dtype == torch.bfloat16 and half.drafter.dtype == torch.bfloat16
    assert SpeculativeImagePipeline.from_pretrained(folder, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(MMSpecError, match="disagree"):
        SpeculativeImagePipeline.from_pretrained(folder, dtype=torch.float32, torch_dtype=torch.bfloat16)
    pipe = SpeculativeImagePipeline.from_pretrained(folder)
    assert pipe.to(torch.bfloat16) is pipe and pipe.dtype == torch.bfloat16 and pipe.drafter.dtype == torch.bfloat16
    pipe.to("cpu", torch.float32)
    assert pipe.device == torch.device("cpu") and pipe.dtype == torch.float32
    fresh, reference = SpeculativeImagePipeline.from_pretrained(folder), SpeculativeImagePipeline.from_pretrained(folder)
    assert fresh.to("cpu") is fresh and torch.equal(generate(fresh).tokens, generate(reference).tokens)


def test_output_is_a_base_output(pipe):
    out = generate(pipe, "gsd")
    assert isinstance(out, ImageGenerationOutput) and isinstance(out, ImagePipelineOutput)
    assert out[0] is out.images and out["images"] is out.images and out["stats"] is out.stats
    assert out.images.shape[0] == 2 and out.class_labels == [0, 2] and out.method == "gsd"
    assert out.prompts is None and "prompts" not in out.keys() and out.settings is not None


def test_drafter_factories_give_core_loop_drafters(pipe):
    """The methods registry gives each method's drafter (mmspec.drafters contract), fresh per call, not a model or
    the pipeline's runner."""
    kinds = {"ar": NoDrafter, "sd": GuidedImageDrafter, "sjd": GridJacobiDrafter, "gsd": GridJacobiDrafter,
             "lantern": GuidedImageDrafter}  # LANTERN drafts with the drafter model when one is loaded
    assert list(pipe.drafter_factories()) == list(kinds)
    for method, kind in kinds.items():
        drafter = pipe.make_drafter(method)
        assert isinstance(drafter, Drafter) and type(drafter) is kind, method
    assert pipe.make_drafter("sd") is not pipe.make_drafter("sd")


def test_seed_is_a_cpu_generator(pipe):
    by_seed = pipe(class_labels=1, method="sjd", seed=7, output_type="np", progress_bar=False)
    by_generator = pipe(class_labels=1, method="sjd", generator=seeded(7), output_type="np", progress_bar=False)
    assert torch.equal(by_seed.tokens, by_generator.tokens)
    with pytest.raises(MMSpecError, match="not both"):
        pipe(class_labels=1, seed=7, generator=seeded(7), progress_bar=False)


def test_janus_on_the_base(tmp_path):
    folder = build_janus_folder(tmp_path / "janus")
    pipe = SpeculativeImagePipeline.from_pretrained(folder, torch_dtype=torch.bfloat16)
    assert isinstance(pipe, JanusImagePipeline) and isinstance(pipe, SpeculativePipeline)
    assert pipe.dtype == torch.bfloat16 and pipe.device == torch.device("cpu")
    assert pipe.to(torch.float32) is pipe and pipe.model.dtype == torch.float32
    assert pipe.available_methods == ["ar", "sjd", "gsd", "lantern"] and pipe.check_method(None) == "sjd"
    out = pipe(prompt="a red circle", method="sjd", generator=seeded(0), output_type="np", progress_bar=False)
    assert out[0] is out.images and out.prompts == ["a red circle"] and out.class_labels == []
    with pytest.raises(MMSpecError, match="needs a drafter"):
        pipe(prompt="a red circle", method="sd", progress_bar=False)
    assert [type(pipe.make_drafter(m)) for m in pipe.available_methods] == [NoDrafter] + [GridJacobiDrafter] * 3


@pytest.mark.slow
def test_the_generic_loader_finds_the_saved_class(pipe, tmp_path):
    """diffusers' own loader (SpeculativePipeline.from_pretrained) looks the saved class up on `mmspec`."""
    pipe.save_pretrained(tmp_path / "saved")
    again = SpeculativePipeline.from_pretrained(str(tmp_path / "saved"))
    assert type(again) is SpeculativeImagePipeline
    a = pipe(class_labels=0, method="sjd", generator=torch.Generator().manual_seed(0), progress_bar=False)
    b = again(class_labels=0, method="sjd", generator=torch.Generator().manual_seed(0), progress_bar=False)
    assert torch.equal(a.tokens, b.tokens)
