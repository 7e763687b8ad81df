import pytest
import torch

from mmspec.image_ar import SpeculativeImagePipeline, tiny_llamagen

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model():
    """4 x 4 grid, 12 codes, 3 classes; peaked distributions."""
    return tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, seed=0, initializer_range=0.3)


@pytest.fixture(scope="session")
def micro_model():
    """2 x 2 grid, 3 codes: 81 possible images, small enough to enumerate exactly."""
    return tiny_llamagen(vocab_size=3, grid_size=2, num_classes=2, dim=16, n_layer=1, n_head=2, seed=5, initializer_range=0.8)


@pytest.fixture(scope="module")
def pipe(folder):
    """The pipeline of the test module's `folder` fixture."""
    return SpeculativeImagePipeline.from_pretrained(folder)
