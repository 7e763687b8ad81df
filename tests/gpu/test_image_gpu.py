"""Image-AR methods on CUDA: every method with a CUDA generator and with a CPU one (the CLI's), seeded repeats,
the same draws as on the CPU, the pipeline moved with .to("cuda"). Skipped without a CUDA GPU.

This is where "Expected a 'cpu' device type for generator but found 'cuda'" (SJD and GSD on an H100)
would show again; the CPU-only checks are in test_devices_and_randomness.py.
"""

import pytest
import torch

from mmspec.image_ar import CFGTarget, MethodRunner, SpeculativeImagePipeline, tiny_llamagen, tiny_vq
from mmspec.sampling import SamplingConfig, seeded_generator

from ..image_ar.test_devices_and_randomness import CONFIGS
from ..image_ar.tiny_image_folder import build_tiny_folder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")
SAMPLE = SamplingConfig(do_sample=True)


def make_runner(device) -> MethodRunner:
    target = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, seed=0, initializer_range=0.3).to(device)
    drafter = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, n_layer=1, seed=1, initializer_range=0.3).to(device)
    return MethodRunner(CFGTarget(target, 1.0), drafter, tiny_vq(codebook_size=12).to(device).codebook_embeddings())


@pytest.fixture(scope="module")
def runners():
    return make_runner(CUDA), make_runner("cpu")


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
@pytest.mark.parametrize("name", CONFIGS)
def test_every_method_runs_and_repeats_on_cuda(runners, name, generator_device):
    on_gpu, _ = runners
    runs = [on_gpu.run(CONFIGS[name], [0, 2], sampling=SAMPLE, generator=seeded_generator(generator_device, 7)).tokens
            for _ in range(2)]
    assert runs[0].device.type == "cuda" and runs[0].shape == (2, 4, 4)
    assert torch.equal(runs[0], runs[1])
    greedy = on_gpu.run(CONFIGS[name], [1], sampling=SamplingConfig(do_sample=False)).tokens
    assert greedy.shape == (1, 4, 4)


@pytest.mark.parametrize("name", CONFIGS)
def test_cpu_generator_draws_what_it_draws_on_the_cpu(runners, name):
    """A seed means the same thing on every device (up to float differences in the probabilities)."""
    on_gpu, on_cpu = runners
    gpu = on_gpu.run(CONFIGS[name], [0, 2], sampling=SAMPLE, generator=seeded_generator("cpu", 3)).tokens.cpu()
    cpu = on_cpu.run(CONFIGS[name], [0, 2], sampling=SAMPLE, generator=seeded_generator("cpu", 3)).tokens
    assert torch.equal(gpu, cpu)


def test_pipeline_on_cuda(tmp_path):
    pipe = SpeculativeImagePipeline.from_pretrained(build_tiny_folder(tmp_path / "m"), device="cuda")
    for method, options in [("sjd", {}), ("gsd", {}), ("lantern", {"lantern_k": 4}), ("sd", {}), ("ar", {})]:
        for generator in (None, torch.Generator().manual_seed(0), torch.Generator(device="cuda").manual_seed(0)):
            out = pipe(class_labels=[0, 1], method=method, generator=generator, progress_bar=False, **options)
            assert len(out.images) == 2 and out.tokens.device.type == "cuda"
