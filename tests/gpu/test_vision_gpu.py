"""The vision methods on CUDA: every tiny VLM class with ar / text / std / msd / flash gives the
model's own greedy `generate` output (text, msd and flash with draft trees too), seeded sampled runs repeat, a CPU generator drives a CUDA
model (and draws what it draws on the CPU), bfloat16 runs, and the caption pipeline, the
distillation traces and drafter training take CPU inputs to a CUDA model."""

import copy

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from mmspec import speculative_generate  # noqa: E402
from mmspec.trees import TreeConfig  # noqa: E402
from mmspec.vision.distill_data import generate_distill_data  # noqa: E402
from mmspec.vision.drafter_training import train_drafter  # noqa: E402
from mmspec.vision.feature_methods import runtime_drafter  # noqa: E402
from mmspec.vision.models import inputs_on_model  # noqa: E402
from mmspec.vision.pipeline import CaptionPipeline  # noqa: E402

from ..vision.methods import METHODS, method_drafter  # noqa: E402
from ..vision.test_distill_training import llava_example  # noqa: E402
from ..vision.test_feature_methods import drafters  # noqa: E402,F401 (fixture)
from ..vision.test_pipeline import frames, tiny_captioner_folder  # noqa: E402,F401 (fixtures)
from ..vision.tiny_vlms import BUILDERS, Case, all_cases, text_drafter_lm  # noqa: E402

CUDA = torch.device("cuda")
CASES = sorted(BUILDERS)  # LLaVA image, LLaVA-OneVision video, LLaVA-NeXT-Video, Qwen2-VL image and video
MAX_NEW = 12


def on_cuda(case: Case, dtype: torch.dtype = torch.float32) -> Case:
    """A CUDA copy of the case: model moved, inputs on its device (pixels in its dtype); prompt ids stay as given."""
    model = copy.deepcopy(case.model).to(device=CUDA, dtype=dtype)
    return Case(case.name, model, case.input_ids.to(CUDA), inputs_on_model(model, case.inputs))


@pytest.fixture(scope="module")
def cuda_cases() -> dict[str, Case]:
    return {name: on_cuda(case) for name, case in all_cases().items()}


@pytest.fixture(scope="module")
def cpu_cases() -> dict[str, Case]:
    """The same models, left on the CPU (a seed must mean the same thing on both)."""
    return all_cases()


@pytest.fixture(scope="module")
def cuda_text_lm():
    return text_drafter_lm().to(CUDA)


def generate(case: Case, drafter, **options):
    return speculative_generate(case.model, drafter, case.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=3,
                                **options, **case.inputs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", CASES)
def test_greedy_equals_generate_on_cuda(name, method, cuda_cases, cuda_text_lm):
    case = cuda_cases[name]
    want = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    out = generate(case, method_drafter(method, case.model, cuda_text_lm))
    assert out.sequences.device.type == "cuda"
    assert out.sequences.tolist() == want.tolist()
    if method != "ar":
        assert out.stats.drafter_forwards > 0


@pytest.mark.parametrize("method", ["text", "msd", "flash"])
@pytest.mark.parametrize("name", CASES)
def test_greedy_trees_equal_generate_on_cuda(name, method, cuda_cases, cuda_text_lm):
    case = cuda_cases[name]
    want = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    out = speculative_generate(case.model, method_drafter(method, case.model, cuda_text_lm), case.input_ids,
                               max_new_tokens=MAX_NEW, tree=TreeConfig(num_nodes=8, top_k=2, depth=3), **case.inputs)
    assert out.sequences.device.type == "cuda"
    assert out.sequences.tolist() == want.tolist()
    assert out.stats.drafter_forwards > 0


@pytest.mark.parametrize("method", ["msd", "flash"])
@pytest.mark.parametrize("name", ["llava-image", "qwen2vl-video"])
def test_float32_feature_drafter_with_a_bfloat16_target(name, method, cuda_cases):
    """Feature drafters kept in float32 next to a bfloat16 target (the casts between the two).

    Token-for-token equality with `generate` is not asserted in bfloat16: a verification forward over
    k + 1 positions may round differently from generate's one-position forwards. The first new token
    comes from the prompt's own forward (these drafters never ride along with it), so it must agree.
    """
    case = on_cuda(cuda_cases[name], torch.bfloat16)
    want = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    out = generate(case, method_drafter(method, case.model, drafter_dtype=torch.float32))
    prompt = case.input_ids.shape[1]
    assert out.sequences[0, prompt] == want[0, prompt] and out.stats.drafter_forwards > 0


@pytest.mark.parametrize("name", CASES)
def test_bfloat16_runs_every_method(name, cuda_cases, cuda_text_lm):
    case = on_cuda(cuda_cases[name], torch.bfloat16)
    for method in METHODS:
        for sample in (False, True):
            out = generate(case, method_drafter(method, case.model, cuda_text_lm), do_sample=sample,
                           generator=torch.Generator(device=CUDA).manual_seed(0))
            assert out.sequences.shape[1] > case.input_ids.shape[1], method


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", CASES)
def test_seeded_sampling_repeats(name, method, generator_device, cuda_cases, cuda_text_lm):
    case = cuda_cases[name]
    runs = [
        generate(case, method_drafter(method, case.model, cuda_text_lm), do_sample=True,
                 generator=torch.Generator(device=generator_device).manual_seed(7)).sequences
        for _ in range(2)
    ]
    assert runs[0].device.type == "cuda" and torch.equal(runs[0], runs[1])
    assert runs[0].shape[1] > case.input_ids.shape[1]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", CASES)
def test_cpu_generator_draws_what_it_draws_on_the_cpu(name, method, cuda_cases, cpu_cases, monkeypatch):
    """A seed means the same thing on every device (up to float differences in the probabilities, kept
    small: no TF32 in the vision towers' convolutions)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    gpu_case, cpu_case = cuda_cases[name], cpu_cases[name]
    lm = text_drafter_lm()
    on_gpu = speculative_generate(gpu_case.model, method_drafter(method, gpu_case.model, lm.to(CUDA)),
                                  gpu_case.input_ids, max_new_tokens=8, num_draft_tokens=3, do_sample=True,
                                  generator=torch.Generator().manual_seed(3), **gpu_case.inputs).sequences.cpu()
    on_cpu = speculative_generate(cpu_case.model, method_drafter(method, cpu_case.model, lm.cpu()),
                                  cpu_case.input_ids, max_new_tokens=8, num_draft_tokens=3, do_sample=True,
                                  generator=torch.Generator().manual_seed(3), **cpu_case.inputs).sequences
    assert torch.equal(on_gpu, on_cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pipeline_on_cuda(dtype, tiny_captioner_folder, drafters, frames):
    """Processor outputs (CPU tensors) reach the CUDA model; every method gives the model's own greedy caption."""
    pipe = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter", dtype=dtype,
                                           device="cuda", feature_drafters={"msd": drafters["msd"],
                                                                            "flash": drafters["flash"]})
    inputs = pipe.prepare_inputs(video=frames)
    assert all(v.device.type == "cuda" for v in inputs.values() if isinstance(v, torch.Tensor))
    assert inputs["pixel_values_videos"].dtype == dtype
    want = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
    for method in METHODS:
        out = pipe(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
        if dtype == torch.float32:
            assert out.sequences.tolist() == want.tolist(), method
        sampled = [pipe(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False, do_sample=True,
                        generator=torch.Generator().manual_seed(5)).sequences for _ in range(2)]
        assert torch.equal(sampled[0], sampled[1]), method


def test_pipeline_moved_with_to(tiny_captioner_folder, drafters, frames):
    """A pipeline built (and run) on the CPU, then moved: model, text drafter and feature drafters follow."""
    pipe = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter",
                                           feature_drafters={"msd": drafters["msd"], "flash": drafters["flash"]})
    pipe(video=frames, max_new_tokens=4, method="std", progress_bar=False)
    pipe.to("cuda")
    assert pipe.model.device.type == "cuda" and pipe.drafter_model.device.type == "cuda"
    assert all(net.device.type == "cuda" for net in pipe.feature_drafters.values())
    want = pipe.model.generate(**pipe.prepare_inputs(video=frames), do_sample=False, max_new_tokens=MAX_NEW)
    for method in METHODS:
        out = pipe(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
        assert out.sequences.device.type == "cuda"
        assert out.sequences.tolist() == want.tolist(), method


@pytest.mark.parametrize("kind", ["msd", "flash"])
def test_distillation_and_training_on_cuda(kind, cuda_cases, tmp_path):
    """CPU examples traced by a CUDA target (bfloat16), then a drafter trained on the GPU against its head."""
    model = on_cuda(cuda_cases["llava-image"], torch.bfloat16).model
    examples = [llava_example(0), llava_example(1)]  # CPU tensors, as a processor returns them
    generate_distill_data(model, examples, tmp_path / "data", max_new_tokens=6, progress=False)
    net = train_drafter(model, kind, tmp_path / "data", tmp_path / "out", steps=3, batch_size=2, checkpoint_every=0,
                        progress=False)
    assert net.device.type == "cuda" and net.dtype == torch.float32
    # The float32 drafter just trained drafts for its bfloat16 target.
    inputs = inputs_on_model(model, examples[0])
    out = speculative_generate(model, runtime_drafter(net), inputs.pop("input_ids"), max_new_tokens=6,
                               num_draft_tokens=3, **inputs)
    assert out.stats.drafter_forwards > 0
