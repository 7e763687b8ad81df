"""MAR and continuous speculative decoding on CUDA: seeded repeats with a CUDA and a CPU generator, the
draft-equals-target identity (cspd reproduces ar) on the GPU, the pipeline moved with .to("cuda"), and
bfloat16. Skipped without a CUDA GPU."""

import pytest
import torch

from mmspec.image_ar.cspd import cspd_generate
from mmspec.image_ar.mar import tiny_mar
from mmspec.image_ar.masked_decode import target_generate
from mmspec.sampling import seeded_generator

from ..image_ar.tiny_class_conditional import mar_pipeline

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
LABELS = [1, 5]


def pair(dtype=torch.float32):
    return (tiny_mar(1, encoder_depth=1, decoder_depth=1).to("cuda", dtype),
            tiny_mar(0, encoder_depth=2, decoder_depth=2).to("cuda", dtype))


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_cspd_runs_and_repeats_on_cuda(generator_device):
    draft, target = pair()
    kwargs = dict(labels=torch.tensor(LABELS), num_iter=8, num_draft=3, prefill_ratio=0.15, cfg=2.0)
    runs = [cspd_generate(draft, target, 2, generator=seeded_generator(generator_device, 0), **kwargs)
            for _ in range(2)]
    assert runs[0].tokens.device.type == "cuda" and torch.isfinite(runs[0].tokens).all()
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert 0 <= runs[0].stats.accepted <= runs[0].stats.drafted


def test_draft_equal_to_target_reproduces_the_target_alone():
    _, target = pair()
    kwargs = dict(labels=torch.tensor(LABELS), num_iter=6, cfg=2.0)
    same = cspd_generate(target, target, 2, num_draft=1, prefill_ratio=0.0, generator=seeded_generator("cpu", 4),
                         **kwargs)
    alone, _ = target_generate(target, 2, generator=seeded_generator("cpu", 4), **kwargs)
    assert same.stats.accepted == same.stats.drafted > 0 and torch.equal(same.tokens, alone)


def test_a_cpu_generator_draws_what_it_draws_on_the_cpu():
    """The target alone with a CPU generator: the CUDA tokens match the CPU ones up to float error."""
    kwargs = dict(labels=torch.tensor(LABELS), num_iter=6, cfg=2.0)
    gpu, _ = target_generate(pair()[1], 2, generator=seeded_generator("cpu", 2), **kwargs)
    cpu, _ = target_generate(tiny_mar(0, encoder_depth=2, decoder_depth=2), 2, generator=seeded_generator("cpu", 2),
                             **kwargs)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-3, atol=1e-3)


def test_pipeline_on_cuda():
    pipe = mar_pipeline().to("cuda")
    for method in ("ar", "cspd"):
        for generator in (None, torch.Generator().manual_seed(0), torch.Generator(device="cuda").manual_seed(0)):
            out = pipe(class_labels=[0, 1], method=method, generator=generator, progress_bar=False)
            assert len(out.images) == 2 and out.tokens.device.type == "cuda"


def test_bfloat16_runs():
    draft, target = pair(torch.bfloat16)
    out = cspd_generate(draft, target, 2, labels=torch.tensor(LABELS), num_iter=6, num_draft=2, cfg=2.0,
                        generator=seeded_generator("cpu", 0))
    assert out.tokens.device.type == "cuda" and torch.isfinite(out.tokens.float()).all()


def test_cli_bench_and_generate_image_on_cuda(tmp_path, capsys):
    """`--device cuda` moves a saved pipeline to the GPU: the bench's rows and an image come out."""
    import json

    from mmspec.cli import main

    mar_pipeline().save_pretrained(tmp_path / "m")
    assert main(["bench", "image", "--model", str(tmp_path / "m"), "--num-samples", "2", "--repeats", "1",
                 "--device", "cuda", "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["methods"]}
    assert rows["cspd k=2"]["drafted"] > 0 and rows["ar"]["target_forwards"] == 2 * 6
    assert main(["generate-image", "1", "--model", str(tmp_path / "m"), "--device", "cuda",
                 "--out", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").is_file()
