"""Device and dtype discipline of the vision decoding paths, checked on a CPU-only machine.

A tensor made without a device lands on the CPU, so on a CPU-only machine it always meets a CPU
model and the bug hides; on a GPU it surfaces as "Expected all tensors to be on the same
device" (Sparse-to-Dense on LLaVA-style models: "mat2 is on cpu", from position ids made on
the CPU). Three checks catch such bugs here:

- a source scan: every torch factory call in `vision/` passes `device=` (reviewed exceptions
  listed with their reason), with the shared scanner (tests/device_checks.py);
- a run with the default device moved elsewhere: while mmspec's code runs, a tensor made
  without a device lands on "meta" and fails as soon as it meets the model's CPU tensors (or is
  copied to them); the models' own forwards run with their own device as the default, so only
  mmspec's code is checked. Every VLM class, every method, greedy and sampled;
- other dtypes: the tiny VLMs in float64 (greedy output still equal to `generate`, feature
  drafters in float64 and in float32) and bfloat16 (runs; CPU bfloat16 need not match
  `generate` token for token), the caption pipeline in float64.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mmspec import speculative_generate
from mmspec.vision.feature_drafter import eagle_loss
from mmspec.vision.models import inputs_on_model
from mmspec.vision.pipeline import CaptionPipeline
from mmspec.vision.sparse_to_dense import SparseToDenseDrafter

from ..device_checks import decoding_modules, default_device_elsewhere, stale_exceptions, unreviewed
from .methods import METHODS, method_drafter
from .test_feature_methods import drafters  # noqa: F401 (fixture)
from .test_pipeline import frames, tiny_captioner_folder  # noqa: F401 (fixtures)
from .tiny_vlms import BUILDERS, Case

CASES = sorted(BUILDERS)
# The per-method grids run two model classes in the fast tier (LLaVA, Qwen2-VL video) and all of them in the slow tier.
GRID_CASES = [n if n in ("llava-image", "qwen2vl-video") else pytest.param(n, marks=pytest.mark.slow) for n in CASES]
MAX_NEW = 10

# ---- source scan -----------------------------------------------------------------------------

# (module, function) -> why a device-less torch factory is right there.
REVIEWED = {
    ("vision/flash_model.py", "__init__"): "an nn.Parameter, initialised by _init_weights and moved with the module",
    ("vision/distill_data.py", "collate"): "training batches are padded on the CPU from CPU shards, then each field is moved once",
    ("vision/distill_data.py", "trace_loss_mask"): "part of a training batch padded on the CPU (see collate)",
    ("vision/drafter_training.py", "sample"): "picks trace indices (Python ints) with a CPU generator: same batches on any device",
    ("vision/drafter_training.py", "train_drafter"): "the batch sampler's CPU generator (see sample)",
}


@pytest.mark.parametrize("module", decoding_modules("vision"))
def test_vision_code_creates_tensors_on_a_device(module):
    assert unreviewed(module, REVIEWED) == []


def test_reviewed_exceptions_are_still_needed():
    """An exception whose function no longer makes a device-less tensor is stale: remove it."""
    assert stale_exceptions(REVIEWED) == []


def test_the_scan_covers_the_decoding_modules():
    wanted = {"sparse_to_dense", "attention_scoring", "models", "target", "msd", "flash", "flash_model",
              "feature_drafter", "feature_methods", "inputs", "pipeline", "text_drafter", "bench", "hf_assisted"}
    assert {f"vision/{name}.py" for name in wanted} <= set(decoding_modules("vision"))


# ---- default device elsewhere ----------------------------------------------------------------




_expected: dict[str, torch.Tensor] = {}


def expected(case: Case) -> torch.Tensor:
    if case.name not in _expected:
        _expected[case.name] = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    return _expected[case.name]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", GRID_CASES)
def test_no_tensor_is_made_on_the_default_device(name, method, vlm_cases, text_lm):
    """Greedy (equal to `generate`) and sampled with a CPU generator, drafter and target built inside."""
    case = vlm_cases[name]
    want = expected(case)
    with default_device_elsewhere(case.model, text_lm):
        greedy = speculative_generate(case.model, method_drafter(method, case.model, text_lm), case.input_ids,
                                      max_new_tokens=MAX_NEW, num_draft_tokens=3, **case.inputs)
        sampled = speculative_generate(case.model, method_drafter(method, case.model, text_lm), case.input_ids,
                                       max_new_tokens=MAX_NEW, num_draft_tokens=3, do_sample=True,
                                       generator=torch.Generator().manual_seed(0), **case.inputs)
    assert greedy.sequences.tolist() == want.tolist()
    assert sampled.sequences.shape[1] > case.input_ids.shape[1] and sampled.sequences.device.type == "cpu"
    if method != "ar":
        assert greedy.stats.drafter_forwards > 0


def test_the_check_catches_the_sparse_to_dense_gpu_bug(vlm_cases, monkeypatch):
    """Control: StD's position ids made on the default device (the bug that failed on CUDA) fail here."""

    def cpu_position_ids(self, position, token):
        return torch.full((token.shape[0], 1), position, dtype=torch.long)

    monkeypatch.setattr(SparseToDenseDrafter, "_position_ids", cpu_position_ids)
    case = vlm_cases["llava-image"]
    with pytest.raises((RuntimeError, NotImplementedError)):
        with default_device_elsewhere(case.model):
            speculative_generate(case.model, method_drafter("std", case.model), case.input_ids, max_new_tokens=4,
                                 num_draft_tokens=3, **case.inputs)
    assert "forward" not in vars(case.model)  # the model got its own forward back


# ---- other dtypes ----------------------------------------------------------------------------


def in_dtype(case: Case, dtype: torch.dtype) -> Case:
    """A copy of the case's model in `dtype`, with its inputs as a processor's output would be moved."""
    model = copy.deepcopy(case.model).to(dtype)
    return Case(case.name, model, case.input_ids, inputs_on_model(model, case.inputs))


@pytest.fixture(scope="module")
def float64_cases(vlm_cases) -> dict[str, Case]:
    return {name: in_dtype(case, torch.float64) for name, case in vlm_cases.items()}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", GRID_CASES)
def test_float64_greedy_equals_generate(name, method, float64_cases, text_lm):
    case = float64_cases[name]
    want = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    # Feature drafters in the target's dtype and in float32 (the casts between the two).
    for drafter_dtype in ((torch.float64, torch.float32) if method in ("msd", "flash") else (None,)):
        drafter = method_drafter(method, case.model, text_lm, drafter_dtype=drafter_dtype)
        out = speculative_generate(case.model, drafter, case.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=3,
                                   **case.inputs)
        assert out.sequences.tolist() == want.tolist(), f"{method} with a {drafter_dtype} drafter"


@pytest.mark.parametrize("name", ["llava-image", "qwen2vl-video"])
def test_bfloat16_runs_every_method(name, vlm_cases, text_lm):
    """No dtype mismatch in bfloat16 (on the CPU its rounding may change a greedy token, so only runs are checked)."""
    case = in_dtype(vlm_cases[name], torch.bfloat16)
    for method in METHODS:
        for sample in (False, True):
            out = speculative_generate(case.model, method_drafter(method, case.model, text_lm), case.input_ids,
                                       max_new_tokens=6, num_draft_tokens=3, do_sample=sample,
                                       generator=torch.Generator().manual_seed(1), **case.inputs)
            assert out.sequences.shape[1] > case.input_ids.shape[1], method


def test_training_loss_with_a_head_in_another_dtype():
    """A drafter training in float32 against a target's bfloat16 / float64 LM head (borrowed, frozen)."""
    torch.manual_seed(0)
    predicted = torch.randn(2, 5, 8, requires_grad=True)
    features = torch.randn(2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.bool)
    for dtype in (torch.float64, torch.bfloat16):
        head = nn.Linear(8, 11, bias=False).to(dtype).requires_grad_(False)
        terms = eagle_loss(predicted, features, head, mask)
        terms["loss"].backward()
        assert torch.isfinite(terms["loss"]) and predicted.grad is not None


class Float64Module(torch.nn.Module):
    """What inputs_on_model reads: parameters (their device) and a dtype."""

    dtype = torch.float64

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))


def test_inputs_follow_the_model():
    model = Float64Module()
    moved = inputs_on_model(model, {"input_ids": torch.tensor([[1, 2]]), "pixel_values": torch.ones(1, 3),
                                    "image_sizes": [[4, 4]]})
    assert moved["input_ids"].dtype == torch.long and moved["pixel_values"].dtype == torch.float64
    assert moved["image_sizes"] == [[4, 4]]


@pytest.fixture(scope="module")
def float64_pipe(tiny_captioner_folder, drafters):
    return CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter", dtype=torch.float64,
                                           feature_drafters={"msd": drafters["msd"], "flash": drafters["flash"]})


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_pipeline_in_float64(method, float64_pipe, frames):
    """The pipeline hands the model its pixels in the model's dtype; every method still gives `generate`'s caption."""
    inputs = float64_pipe.prepare_inputs(video=frames)
    assert inputs["pixel_values_videos"].dtype == torch.float64
    assert float64_pipe.make_drafter("msd").model.dtype == torch.float64
    want = float64_pipe.model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
    out = float64_pipe(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
    assert out.sequences.tolist() == want.tolist()


@pytest.fixture(scope="module")
def bfloat16_drafters_pipe(tiny_captioner_folder, drafters):
    own = {kind: copy.deepcopy(drafters[kind]) for kind in ("msd", "flash")}  # the fixture's drafters stay float32
    return CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter", drafter_dtype="bfloat16",
                                           feature_drafters=own)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["text", "msd", "flash"])
def test_drafters_in_bfloat16_keep_a_float32_targets_output(method, bfloat16_drafters_pipe, frames):
    """`drafter_dtype` changes what the drafters compute in, never the caption: greedy still equals `generate`."""
    pipe = bfloat16_drafters_pipe
    assert pipe.model.dtype == torch.float32
    drafter_net = pipe.drafter if method == "text" else pipe.feature_drafters[method]
    assert next(drafter_net.parameters()).dtype == torch.bfloat16
    inputs = pipe.prepare_inputs(video=frames)
    want = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
    out = pipe(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
    assert out.sequences.tolist() == want.tolist()
    sampled = pipe(video=frames, max_new_tokens=MAX_NEW, method=method, do_sample=True, progress_bar=False,
                   generator=torch.Generator().manual_seed(0))
    assert sampled.sequences.shape[1] > inputs["input_ids"].shape[1]


@pytest.mark.parametrize("kind", ["msd", "flash"])
def test_distillation_and_training_for_a_bfloat16_target(kind, vlm_cases, tmp_path):
    """Traces of a bfloat16 target from CPU float32 examples; a float32 drafter trains against its bfloat16 head."""
    from mmspec.vision.distill_data import generate_distill_data
    from mmspec.vision.drafter_training import train_drafter

    from .test_distill_training import llava_example

    model = in_dtype(vlm_cases["llava-image"], torch.bfloat16).model
    generate_distill_data(model, [llava_example(0), llava_example(1)], tmp_path / "data", max_new_tokens=6, progress=False)
    net = train_drafter(model, kind, tmp_path / "data", tmp_path / "out", steps=3, batch_size=2, checkpoint_every=0,
                        progress=False)
    assert net.dtype == torch.float32


def test_drafter_dtype_of_a_saved_pipeline(bfloat16_drafters_pipe, tmp_path):
    """A saved pipeline loads with its drafters in the dtype asked for, the model in its own."""
    bfloat16_drafters_pipe.save_pretrained(tmp_path / "saved")
    for asked, want in ((None, torch.float32), ("bfloat16", torch.bfloat16)):
        pipe = CaptionPipeline.from_pretrained(tmp_path / "saved", drafter_dtype=asked)
        assert pipe.model.dtype == torch.float32
        assert {next(net.parameters()).dtype for net in (pipe.drafter, *pipe.feature_drafters.values())} == {want}
