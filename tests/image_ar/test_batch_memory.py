"""`bench image --batch-size` larger than the memory holds is refused before any image is made, naming the
batch size that fits; the batch sizes the benchmarks use pass."""

from __future__ import annotations

import pytest

from mmspec.cli import main
from mmspec.zoo import entries

needs_zoo = pytest.mark.skipif(not {"shapes-var", "shapes-mar"} <= {e.name for e in entries()}, reason="needs the zoo")


@needs_zoo
@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["shapes-var", "shapes-mar"])
def test_a_batch_beyond_the_memory_is_refused_with_the_size_that_fits(model, capsys):
    code = main(["bench", "image", "--model", model, "--num-samples", "2000000", "--batch-size", "2000000",
                 "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mmspec: error: --batch-size 2000000:") and "use --batch-size" in last, last


@needs_zoo
@pytest.mark.parametrize("model", ["shapes-var", "shapes-mar"])
def test_the_benchmarks_batch_sizes_fit(model):
    from mmspec.cli.image_batches import check_batch_fits
    from mmspec.image_ar.pipeline import SpeculativeImagePipeline

    pipe = SpeculativeImagePipeline.from_pretrained(model)
    check_batch_fits(pipe, 16, available=2 * 1024**3)  # BENCHMARKS.md's --batch-size 16, with 2 GB free
