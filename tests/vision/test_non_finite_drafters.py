"""A trained drafter whose weights hold NaN or infinity is refused when it loads: its probabilities would
reach the sampler (torch.multinomial's RuntimeError) or silently never agree with the target."""

from __future__ import annotations

import math

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.vision.msd import MSDDrafterModel, load_msd_drafter

from .tiny_vlms import llava


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_drafter_with_non_finite_weights_is_refused_at_load(tmp_path, bad):
    torch.manual_seed(0)
    model = MSDDrafterModel.from_target_config(llava().model.config.get_text_config())
    model.save_pretrained(tmp_path / "good")
    load_msd_drafter(tmp_path / "good")  # finite: loads
    _, parameter = next(iter(model.named_parameters()))
    with torch.no_grad():
        parameter.view(-1)[0] = bad
    model.save_pretrained(tmp_path / "bad")
    with pytest.raises(MMSpecError, match="not finite"):
        load_msd_drafter(tmp_path / "bad")
