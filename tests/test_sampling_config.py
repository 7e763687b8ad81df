import pytest
import torch

from mmspec import MMSpecError, SamplingConfig
from mmspec.sampling import probabilities, warp_logits


def test_top_k_keeps_k_best():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    probs = probabilities(logits, SamplingConfig(do_sample=True, top_k=2))
    assert (probs[0, [0, 2]] == 0).all() and torch.isclose(probs.sum(), torch.tensor(1.0))


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = warp_logits(logits, SamplingConfig(do_sample=True, top_p=0.7)).isfinite()[0].tolist()
    assert kept == [True, True, False, False]
    assert warp_logits(logits, SamplingConfig(do_sample=True, top_p=0.01)).isfinite()[0].tolist() == [True, False, False, False]


def test_temperature_sharpens():
    logits = torch.tensor([[1.0, 2.0]])
    cold = probabilities(logits, SamplingConfig(do_sample=True, temperature=0.5))
    assert cold[0, 1] > logits.softmax(-1)[0, 1]


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"top_k": 0}, {"top_p": 1.5}])
def test_bad_sampling_settings_are_clear_errors(kwargs):
    with pytest.raises(MMSpecError):
        SamplingConfig(do_sample=True, **kwargs)
