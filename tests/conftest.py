import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Bench commands run by the tests record nothing (mmspec.bench.results); tests that check recording pass a path.
os.environ["MMSPEC_BENCH_RESULTS"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

# Without CUDA, Triton kernels (mmspec.kernels) run in Triton's CPU interpreter, which must be chosen before
# anything imports Triton (the test models' imports do); `import torch` alone does not import it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny test models gain nothing from threads, and threads fight any background job for the cores.
torch.set_num_threads(1)

from mmspec.targets import Target  # noqa: E402
from mmspec.testing import tiny_llama  # noqa: E402

# Greedy verification reads argmaxes from a certified bfloat16 head only for heads of 4M+ weights (real vocabularies);
# the tiny test models take that path too, so every lossless test covers it (test_certified_head checks the size rule).
Target.certified_head_min_size = 0


@pytest.fixture(scope="session")
def target():
    return tiny_llama(num_layers=2, seed=0)


@pytest.fixture(scope="session")
def small_drafter():
    return tiny_llama(num_layers=1, hidden_size=32, seed=1)


@pytest.fixture
def prompt():
    return torch.tensor([[1, 17, 42, 8, 66, 17, 42, 9]])
