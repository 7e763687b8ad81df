"""The static-shape compiled path over the vision adapter's target: the prefill sees the images or video, the
fixed-width steps after it are text, and greedy output is the model's own `generate`."""

import pytest
import torch

from mmspec import PromptLookupDrafter, speculative_generate
from mmspec.static_target import static_model_drafter, static_target_for
from mmspec.vision import TextOnlyDrafter, VisionTarget

from .tiny_vlms import BUILDERS

MAX_NEW = 16


@pytest.fixture(autouse=True, scope="module")
def forget_compiled_graphs():
    """Every transformers forward runs through one decorator, whose code dynamo caches graphs under: this module's
    many graphs would leave later tests' compiled calls (transformers' own static-cache generate) no room."""
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["text-only", "lookup"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_static_vlm_greedy_equals_generate(name, kind, vlm_cases, text_lm):
    case = vlm_cases[name]
    expected = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    target = static_target_for(case.model, widths=(4,), backend="eager")
    assert isinstance(target, VisionTarget)
    drafter = (static_model_drafter(TextOnlyDrafter(text_lm, case.model), backend="eager") if kind == "text-only"
               else PromptLookupDrafter())
    out = speculative_generate(target, drafter, case.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=3,
                               do_sample=False, **case.inputs)
    assert out.sequences[0].tolist() == expected[0].tolist(), f"{name}: compiled output differs from generate"
    assert torch.equal(out.sequences[:, : case.input_ids.shape[1]], case.input_ids)
