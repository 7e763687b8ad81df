"""Greedy speculative decoding of the four VLM classes equals their own `generate`, token for token."""

import pytest
import torch

from mmspec import PromptLookupDrafter, Target, speculative_generate
from mmspec.vision import TextOnlyDrafter, VisionTarget

from .drafters import MultimodalFlakyDrafter, MultimodalNeverAgreeDrafter, MultimodalSelfDrafter
from .tiny_vlms import BUILDERS

MAX_NEW = 16
CASES = sorted(BUILDERS)
_expected: dict[str, torch.Tensor] = {}


def expected(case) -> torch.Tensor:
    """The target's own greedy output, computed once per case."""
    if case.name not in _expected:
        _expected[case.name] = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    return _expected[case.name]


def make_drafter(kind, case, text_lm):
    if kind == "text-only":
        return TextOnlyDrafter(text_lm, case.model)
    if kind == "never":
        return MultimodalNeverAgreeDrafter(case.model)
    if kind == "lookup":
        return PromptLookupDrafter()
    if kind == "self":
        return MultimodalSelfDrafter(case.model)
    return MultimodalFlakyDrafter(case.model)


def run(case, drafter, k, wrap="vision-target", **overrides):
    inputs = dict(case.inputs, **overrides)
    # A raw model gets VisionTarget from the registry; the plain core Target takes the safe path
    # (prompt prefilled alone, drafts scored after); VisionTarget lets drafts join the prefill.
    target = {"vision-target": VisionTarget, "raw-model": lambda m: m, "core-target": Target}[wrap](case.model)
    out = speculative_generate(target, drafter, case.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=k, **inputs)
    want = expected(case)
    assert out.sequences[0].tolist() == want[0].tolist(), f"{case.name}: speculative output differs from generate"
    return out


@pytest.mark.parametrize("wrap", ["vision-target", "raw-model", "core-target"])
@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(5, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["text-only", "never", "lookup"])
@pytest.mark.parametrize("name", CASES)
def test_greedy_identical(name, kind, k, wrap, vlm_cases, text_lm):
    case = vlm_cases[name]
    out = run(case, make_drafter(kind, case, text_lm), k, wrap=wrap)
    if kind == "never":
        assert out.stats.accepted == 0
        assert out.stats.target_forwards == out.stats.new_tokens + (1 if wrap == "core-target" else 0)


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(5, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["self", "flaky"])
@pytest.mark.parametrize("name", CASES)
def test_greedy_identical_with_agreeing_drafters(name, kind, k, vlm_cases, text_lm):
    """Accepting drafts exercises rollback at every depth (and Qwen2-VL's M-RoPE positions after it)."""
    case = vlm_cases[name]
    out = run(case, make_drafter(kind, case, text_lm), k)
    assert out.stats.accepted > 0
    if kind == "self":
        assert out.stats.accepted == out.stats.drafted
    elif k > 1:
        assert 0 < out.stats.accepted < out.stats.drafted


def test_qwen2_vl_positions_really_are_3d(vlm_cases):
    """The test prompt gives Qwen2-VL a non-zero rope delta, so M-RoPE is exercised, not bypassed."""
    case = vlm_cases["qwen2vl-image"]
    run(case, MultimodalFlakyDrafter(case.model), 3)
    assert int(case.model.model.rope_deltas.flatten()[0]) != 0


@pytest.mark.parametrize("name", ["qwen2vl-image", "qwen2vl-video"])
def test_qwen2_vl_token_types_are_built_when_missing(name, vlm_cases, text_lm):
    case = vlm_cases[name]
    inputs = {k: v for k, v in case.inputs.items() if k != "mm_token_type_ids"}
    out = speculative_generate(VisionTarget(case.model), TextOnlyDrafter(text_lm, case.model), case.input_ids,
                               max_new_tokens=MAX_NEW, num_draft_tokens=3, **inputs)
    assert torch.equal(out.sequences, expected(case))


def test_attention_mask_of_ones_is_accepted(vlm_cases, text_lm):
    case = vlm_cases["qwen2vl-video"]
    run(case, TextOnlyDrafter(text_lm, case.model), 3, attention_mask=torch.ones_like(case.input_ids))


@pytest.mark.parametrize("name", CASES)
def test_sampling_runs_and_repeats_with_a_seed(name, vlm_cases, text_lm):
    """Sampling goes through the same prefill/rollback path; a seeded run repeats exactly."""
    case = vlm_cases[name]

    def sample(seed):
        generator = torch.Generator().manual_seed(seed)
        drafter = TextOnlyDrafter(text_lm, case.model)
        return speculative_generate(VisionTarget(case.model), drafter, case.input_ids, max_new_tokens=10, do_sample=True,
                                    generator=generator, num_draft_tokens=3, **case.inputs).sequences

    first = sample(0)
    assert first.shape[1] > case.input_ids.shape[1]
    assert torch.equal(first, sample(0))
