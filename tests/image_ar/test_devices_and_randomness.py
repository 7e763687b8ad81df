"""Device and randomness discipline of the image-AR decoding paths, checked on a CPU-only machine.

On an H100, SJD and GSD failed with "Expected a 'cpu' device type for generator but found 'cuda'":
a random draw made on the default (CPU) device with the pipeline's CUDA generator. The fix routes
every draw through `mmspec.sampling` (`rand`, `randint`, `sample`, `seeded_generator`), which draw
on the generator's device and move the result (as diffusers' `randn_tensor` does), and gives every
tensor factory a device. Without a GPU, four checks hold that in place:

- a source scan: every torch factory in `image_ar/` passes `device=` (the shared scanner,
  tests/device_checks.py; reviewed exceptions listed with their reason);
- a randomness scan: no torch random function is called directly in `image_ar/` (only through
  `mmspec.sampling`), with a planted-violation control;
- a run with the default device moved to "meta" (except inside the models' own forwards): a tensor
  made without a device, or a draw made on the default device with the CPU generator, fails there
  as it would on a GPU. Every method, sampled with a CPU generator and greedy; a control re-plants
  the old Jacobi draw and sees it fail;
- seeded outputs: the same seeds give the same images as before the change, token for token.
"""

from __future__ import annotations

import ast

import pytest
import torch

from mmspec.image_ar import CFGTarget, MethodConfig, MethodRunner, tiny_llamagen, tiny_vq
from mmspec.image_ar import jacobi as jacobi_module
from mmspec.sampling import SamplingConfig, seeded_generator

from ..device_checks import ROOT, decoding_modules, default_device_elsewhere, stale_exceptions, unreviewed

# (module, function) -> why a device-less torch factory is right there.
REVIEWED = {
    ("image_ar/llamagen.py", "rope_table_2d"): "the rotary table is computed once on the CPU and moved to the model's "
                                                "device (bitwise the same table on every device)",
    ("image_ar/llamagen.py", "__init__"): "RMSNorm's weight, an nn.Parameter moved with the module",
    ("image_ar/mar.py", "__init__"): "learned position embeddings, mask token and fake latent: nn.Parameters moved "
                                      "with the module",
}
# torch functions that consume random numbers: image_ar must draw through mmspec.sampling instead.
RANDOM = {"rand", "randn", "randint", "randperm", "multinomial", "bernoulli", "normal", "poisson", "rand_like",
          "randn_like", "randint_like", "Generator"}


@pytest.mark.parametrize("module", decoding_modules("image_ar"))
def test_image_ar_code_creates_tensors_on_a_device(module):
    assert unreviewed(module, REVIEWED) == []


def test_reviewed_exceptions_are_still_needed():
    """An exception whose function no longer makes a device-less tensor is stale: remove it."""
    assert stale_exceptions(REVIEWED) == []


def direct_random_calls(source: str, module: str) -> list[str]:
    """`module:line torch.f` for each call of a torch random function (`torch.rand(...)`, `x.multinomial(...)`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RANDOM):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "torch" or node.func.attr in ("multinomial", "bernoulli"):
            found.append(f"{module}:{node.lineno} {node.func.attr}")
    return found


@pytest.mark.parametrize("module", decoding_modules("image_ar"))
def test_randomness_goes_through_mmspec_sampling(module):
    """Draws and generators come from mmspec.sampling (rand, randint, sample, seeded_generator): device-correct."""
    assert direct_random_calls((ROOT / module).read_text(), module) == []


def test_randomness_scan_flags_planted_calls():
    planted = ("import torch\ndef f(g, p):\n    a = torch.rand(3, generator=g)\n    b = p.multinomial(1)\n"
               "    return torch.Generator(device='cpu'), torch.randint(4, (1,), generator=g, device=p.device)\n")
    assert direct_random_calls(planted, "x.py") == ["x.py:3 rand", "x.py:4 multinomial", "x.py:5 Generator",
                                                     "x.py:5 randint"]


# ---- default device elsewhere ----------------------------------------------------------------




@pytest.fixture(scope="module")
def runner():
    target = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, seed=0, initializer_range=0.3)
    drafter = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, n_layer=1, seed=1, initializer_range=0.3)
    return MethodRunner(CFGTarget(target, 1.0), drafter, tiny_vq(codebook_size=12).codebook_embeddings())


CONFIGS = {
    "ar": MethodConfig(method="ar"),
    "sd": MethodConfig(method="sd", num_draft_tokens=3),
    "sjd-random": MethodConfig(method="sjd", window=5, init="random"),
    "sjd-left": MethodConfig(method="sjd", window=5, init="left"),
    "gsd": MethodConfig(method="gsd", window=5, init="random", gsd_prob_threshold=0.5, gsd_distance_threshold=None),
    "gsd-embeddings": MethodConfig(method="gsd", window=5, init="random", gsd_distance_threshold=5.0),
    "gsd-codebook": MethodConfig(method="gsd", window=5, init="random", gsd_distance_threshold=1.0, gsd_latents="codebook"),
    "lantern-jacobi": MethodConfig(method="lantern", drafts="jacobi", lantern_delta=0.3, lantern_k=5, window=5, init="random"),
    "lantern-drafter": MethodConfig(method="lantern", drafts="drafter", lantern_delta=0.3, lantern_k=5, num_draft_tokens=3),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_no_tensor_or_draw_lands_on_the_default_device(runner, name):
    """Sampled with a CPU generator (the CLI's) and greedy, drafter and neighbour tables built inside."""
    runner._neighbours.clear()  # LANTERN's table is built under the check too
    runner._embeddings = None  # and GSD's embedding table
    models = [runner.target.model, runner.drafter_model]
    with default_device_elsewhere(*models):
        sampled = runner.run(CONFIGS[name], [0, 2], sampling=SamplingConfig(do_sample=True),
                             generator=seeded_generator("cpu", 3))
        greedy = runner.run(CONFIGS[name], [1], sampling=SamplingConfig(do_sample=False))
    assert sampled.tokens.shape == (2, 4, 4) and sampled.tokens.device.type == "cpu"
    assert greedy.tokens.shape == (1, 4, 4)


def test_the_check_catches_the_old_jacobi_draw(runner, monkeypatch):
    """Control: the draw SJD made before (on the default device, with the caller's generator) fails here, as
    "Expected a 'cpu' device type for generator but found 'cuda'" did on an H100."""

    def old_initial_token(position, tokens, grid, vocab, strategy, generator, device="cpu"):
        return int(torch.randint(vocab, (1,), generator=generator))

    monkeypatch.setattr(jacobi_module, "initial_token", old_initial_token)
    with pytest.raises(RuntimeError):
        with default_device_elsewhere(runner.target.model):
            runner.run(CONFIGS["sjd-random"], [0], sampling=SamplingConfig(do_sample=True), generator=seeded_generator("cpu", 0))
    assert "forward" not in vars(runner.target.model)  # the model got its own forward back


# ---- seeded outputs --------------------------------------------------------------------------

# Token grids (flattened) of labels [0, 2] with torch.Generator().manual_seed(11), recorded before the
# draws moved to mmspec.sampling's helpers: a CPU generator gives exactly the numbers it gave.
GOLDEN = {
    "ar": [[9, 7, 4, 6, 5, 9, 9, 9, 2, 8, 6, 9, 5, 9, 9, 9], [7, 6, 5, 1, 9, 9, 9, 7, 6, 5, 9, 9, 7, 9, 7, 6]],
    "sd": [[9, 7, 5, 6, 9, 2, 0, 10, 1, 9, 5, 1, 9, 5, 9, 5], [1, 9, 5, 2, 9, 5, 1, 9, 7, 5, 1, 2, 5, 9, 9, 9]],
    "sjd-random": [[9, 7, 0, 7, 5, 5, 9, 7, 6, 9, 7, 6, 9, 4, 2, 11], [1, 7, 9, 7, 0, 1, 7, 6, 9, 7, 10, 2, 6, 5, 9, 5]],
    "sjd-left": [[9, 7, 0, 1, 9, 9, 7, 9, 7, 6, 9, 9, 9, 7, 6, 6], [10, 3, 11, 9, 5, 5, 1, 6, 5, 6, 5, 1, 0, 11, 2, 5]],
    "lantern-jacobi": [[9, 7, 11, 9, 6, 9, 9, 6, 6, 6, 11, 6, 9, 1, 1, 7], [4, 11, 2, 2, 2, 7, 2, 11, 3, 9, 3, 9, 9, 6, 9, 3]],
    "lantern-drafter": [[0, 9, 11, 2, 5, 3, 6, 1, 11, 2, 0, 5, 1, 11, 11, 11], [1, 3, 8, 10, 3, 8, 6, 0, 11, 2, 6, 7, 8, 5, 9, 5]],
}


@pytest.mark.parametrize("name", GOLDEN)
def test_seeded_outputs_are_unchanged(runner, name):
    out = runner.run(CONFIGS[name], [0, 2], sampling=SamplingConfig(do_sample=True), generator=torch.Generator().manual_seed(11))
    assert out.tokens.flatten(1).tolist() == GOLDEN[name]
    again = runner.run(CONFIGS[name], [0, 2], sampling=SamplingConfig(do_sample=True), generator=seeded_generator("cpu", 11))
    assert torch.equal(out.tokens, again.tokens)
