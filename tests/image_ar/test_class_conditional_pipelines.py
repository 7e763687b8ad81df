"""What the VAR and MAR pipelines (both `ClassConditionalMixin`) must do alike, tested once for each: a seed
is a CPU generator, the progress bar shows and hides, one clear error for each bad setting or condition,
a missing second model or a folder of another pipeline, and `.to()` moves every component."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import pytest
import torch

from mmspec.errors import MMSpecError

from .tiny_class_conditional import mar_pipeline, var_pipeline


@dataclass(frozen=True)
class Family:
    build: Callable[[], Any]
    method: str  # the speculative method
    second: str  # the optional second model it needs
    num_classes: int
    not_saved: str  # from_pretrained's error on a folder that holds no saved pipeline
    other_class: str  # a pipeline class whose saved folder this one refuses
    tokens: Callable[[Any], torch.Tensor]  # an output's tokens, as one tensor


FAMILIES = {
    "mar": Family(mar_pipeline, "cspd", "draft", 10, "is not a folder saved by MARPipeline", "VARPipeline",
                  lambda out: out.tokens),
    "var": Family(var_pipeline, "code", "refiner", 5, "is not a zoo VAR model", "SpeculativeImagePipeline",
                  lambda out: out.tokens),
}


@cache
def pipeline(family: str):
    """The family's tiny pipeline, built once for the tests that leave it as it was."""
    return FAMILIES[family].build()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_seed_is_a_cpu_generator_and_none_follows_torch_manual_seed(family):
    pipe, tokens, method = pipeline(family), FAMILIES[family].tokens, FAMILIES[family].method
    a = pipe(class_labels=3, method=method, seed=7, progress_bar=False)
    b = pipe(class_labels=3, method=method, generator=torch.Generator("cpu").manual_seed(7), progress_bar=False)
    assert torch.equal(tokens(a), tokens(b))
    assert not torch.equal(tokens(a), tokens(pipe(class_labels=3, method=method, seed=8, progress_bar=False)))
    for unseeded in ("ar", method):
        torch.manual_seed(1)
        c = pipe(class_labels=3, method=unseeded, progress_bar=False)
        torch.manual_seed(1)
        assert torch.equal(tokens(c), tokens(pipe(class_labels=3, method=unseeded, progress_bar=False)))


@pytest.mark.parametrize("family", FAMILIES)
def test_methods_run_by_the_pipeline_have_no_core_loop_drafter(family):
    """VAR's and MAR's methods run their models scale by scale or step by step: the registry says which can run,
    and asking for a drafter is refused in one line instead of handing out a model."""
    pipe, method = pipeline(family), FAMILIES[family].method
    assert pipe.available_methods == ["ar", method]
    for name in ("ar", method):
        with pytest.raises(MMSpecError, match=f"method '{name}' runs its models itself"):
            pipe.make_drafter(name)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_progress_bar_shows_and_can_be_hidden(family, capsys):
    pipe, method = pipeline(family), FAMILIES[family].method
    pipe(class_labels=0, method=method, seed=0)
    assert f"image ({method})" in capsys.readouterr().err
    pipe(class_labels=0, method=method, seed=0, progress_bar=False)
    assert f"image ({method})" not in capsys.readouterr().err
    pipe.set_progress_bar_config(disable=True)
    try:
        pipe(class_labels=0, method="ar", seed=0)
        assert "image (ar)" not in capsys.readouterr().err
    finally:
        pipe.set_progress_bar_config(disable=False)


@pytest.mark.parametrize("family, kwargs, message", [
    ("mar", {"method": "sjd"}, "unknown method 'sjd'; choose from ar, cspd"),
    ("mar", {"method": "code"}, "unknown method 'code'; choose from ar, cspd"),
    ("mar", {"method": "ar", "num_draft": 2}, "num_draft: settings of method 'cspd', not 'ar'"),
    ("mar", {"method": "cspd", "num_draft": 0}, "num_draft must be an integer >= 1"),
    ("mar", {"method": "cspd", "prefill_ratio": 1.0}, "prefill_ratio must be in [0, 1)"),
    ("mar", {"method": "ar", "num_iter": 17}, "num_iter must be an integer in 1..16"),
    ("mar", {"method": "ar", "guidance_scale": 0.5}, "guidance_scale must be a finite number >= 1"),
    ("mar", {"method": "ar", "temperature": 0}, "temperature must be a finite number > 0"),
    ("mar", {"method": "cspd", "temperature": float("nan")}, "temperature must be a finite number > 0"),
    ("mar", {"method": "ar", "top_k": 5}, "top_k does not apply to MAR"),
    ("mar", {"method": "ar", "output_type": "pt"}, "output_type must be one of pil, np"),
    ("var", {"method": "code", "draft_scales": 0}, "draft_scales must be an integer in 1..3"),
    ("var", {"method": "code", "draft_scales": 4}, "draft_scales must be an integer in 1..3"),
    ("var", {"method": "code", "draft_scales": True}, "draft_scales must be an integer in 1..3"),
    ("var", {"method": "code", "draft_scales": "2"}, "draft_scales must be an integer in 1..3"),
    ("var", {"method": "ar", "draft_scales": 2}, "draft_scales applies to method 'code' only"),
    ("var", {"method": "sjd"}, "unknown method 'sjd'; choose from ar, code"),
    ("var", {"method": "code", "guidance_scale": -1.0}, "guidance_scale must be a finite number >= 0"),
    ("var", {"method": "code", "temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ("var", {"method": "code", "temperature": [1.0, 0.0, 1.0, 1.0]}, "per-scale temperatures must be finite numbers > 0"),
    ("var", {"method": "ar", "temperature": []}, "per-scale temperatures must be finite numbers > 0"),
    ("var", {"method": "code", "temperature": [1.1, 1.0]}, "2 temperatures for 4 scales"),
    ("var", {"method": "code", "top_k": -1}, "top_k must be an integer >= 0"),
    ("var", {"method": "code", "top_p": 0}, "top_p must be in (0, 1]"),
    ("var", {"method": "ar", "top_p": 1.5}, "top_p must be in (0, 1]"),
    ("var", {"method": "ar", "output_type": "pt"}, "output_type must be one of pil, np"),
])
def test_bad_settings_are_one_clear_error(family, kwargs, message):
    with pytest.raises(MMSpecError) as error:
        pipeline(family)(class_labels=0, seed=0, progress_bar=False, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_conditions_and_a_missing_second_model_are_refused(family):
    pipe, spec = pipeline(family), FAMILIES[family]
    with pytest.raises(MMSpecError, match="unknown class 'pink circle'"):
        pipe(prompt="pink circle", progress_bar=False)
    with pytest.raises(MMSpecError, match=rf"class labels must be integers in \[0, {spec.num_classes}\)"):
        pipe(class_labels=[spec.num_classes], progress_bar=False)
    alone = type(pipe)(**{name: part for name, part in pipe.components.items() if name != spec.second})
    with pytest.raises(MMSpecError, match=f"needs a {spec.second}"):
        alone(class_labels=0, method=spec.method, progress_bar=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_that_is_no_saved_pipeline_of_the_class_is_one_error(family, tmp_path):
    cls, spec = type(pipeline(family)), FAMILIES[family]
    with pytest.raises(MMSpecError, match=spec.not_saved):
        cls.from_pretrained(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": spec.other_class}))
    with pytest.raises(MMSpecError, match=f"not a {cls.__name__}"):
        cls.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_to_moves_every_component_and_it_still_generates(family):
    pipe = FAMILIES[family].build()
    names = tuple(pipe.components)
    pipe.to(torch.bfloat16)
    assert pipe.dtype == torch.bfloat16 and {getattr(pipe, name).dtype for name in names} == {torch.bfloat16}
    assert len(pipe(class_labels=1, method=FAMILIES[family].method, seed=0, progress_bar=False).images) == 1
    pipe.to("cpu", torch.float32)
    assert pipe.device == torch.device("cpu") and {getattr(pipe, name).dtype for name in names} == {torch.float32}


def test_a_prompt_in_free_text_finds_its_one_class():
    """A prompt is a class name, or text holding one class name's words (after the card's class_synonyms)."""
    pipe = var_pipeline()  # its own copy: the card is edited below
    assert pipe.class_names[pipe.class_id("  A big RED circle, please ")] == "red circle"
    with pytest.raises(MMSpecError, match="unknown class 'a red ball'"):
        pipe.class_id("a red ball")  # no synonyms on this card: "ball" means nothing
    pipe.card["class_synonyms"] = {"ball": "circle", "boxes": "square"}
    assert pipe.class_names[pipe.class_id("a red ball")] == "red circle"
    assert pipe.class_names[pipe.class_id("two blue boxes")] == "blue square"
    with pytest.raises(MMSpecError, match=r"'red ball and blue box' names 2 classes .*: name one"):
        pipe.class_id("red ball and blue box")  # "box" unmapped here: red circle, blue circle
    with pytest.raises(MMSpecError, match="unknown class 'pink circle'"):
        pipe.class_id("pink circle")
