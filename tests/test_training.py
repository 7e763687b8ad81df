"""mmspec.training: the schedule, the step loop, fit, checkpoints and where recipes may write."""

import math

import pytest
import torch
from torch import nn

from mmspec.errors import MMSpecError
from mmspec.training import (
    Checkpoints,
    TrainingLoop,
    adamw,
    fit,
    output_folder,
    seed_everything,
    warmup_cosine,
)
from mmspec.zoo import MODELS_DIR


def test_warmup_cosine_factor():
    assert [warmup_cosine(s, 20, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert warmup_cosine(4, 20, 4) == 1.0
    assert warmup_cosine(12, 20, 4) == pytest.approx(0.5)
    assert warmup_cosine(20, 20, 4) == 0.0 and warmup_cosine(50, 20, 4) == 0.0  # stays at the floor past the end
    assert warmup_cosine(0, 10, 0) == 1.0  # no warm-up


def test_warmup_cosine_floor_peak_and_progress():
    assert warmup_cosine(1, 100, 4, peak=2e-3) == 2e-3 * 2 / 4
    assert warmup_cosine(100, 100, 4, floor=0.1, peak=2e-3) == pytest.approx(2e-4)
    assert warmup_cosine(52, 100, 4, floor=0.1) == pytest.approx(0.55)
    # By progress (e.g. wall-clock share of a budget) instead of steps: the step count is ignored.
    assert warmup_cosine(7, 0, 4, floor=0.05, progress=0.5) == pytest.approx(0.525)
    assert warmup_cosine(7, 0, 4, floor=0.05, progress=2.0) == pytest.approx(0.05)
    assert warmup_cosine(2, 0, 4, floor=0.05, progress=0.9) == 0.75  # still warming up


def test_adamw_takes_only_trainable_parameters():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model[0].weight.requires_grad_(False)
    opt = adamw(model, 1e-3, betas=(0.9, 0.95), weight_decay=0.05)
    params = opt.param_groups[0]["params"]
    assert len(params) == 3 and all(p is not model[0].weight for p in params)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["weight_decay"] == 0.05


def test_training_loop_fixed_steps_and_budget():
    loop = TrainingLoop(max_minutes=60, steps=4, disable=True)
    assert list(loop) == [0, 1, 2, 3] and loop.done == 4 and loop.planned() == 4
    spent = TrainingLoop(max_minutes=0, steps=0, disable=True)  # a budget already spent: one step, then stop
    assert list(spent) == [0] and spent.done == 1
    probing = TrainingLoop(max_minutes=60, steps=0, probe=2, disable=True)
    assert probing.planned() == 10**6
    for step in probing:  # fitted to the budget after probing steps 1 and 2: far more than the 4 taken here
        if step == 3:
            break
    assert probing.total > 100


def regression(seed):
    seed_everything(seed)
    x = torch.randn(32, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    model = nn.Linear(4, 1)

    def batch_loss(indices):
        return nn.functional.mse_loss(model(x[indices]).squeeze(-1), y[indices])

    return fit(model, batch_loss, 32, 60, batch_size=8, learning_rate=0.3, warmup_steps=5, seed=seed,
               progress_bar=False, desc="fit")


def test_fit_is_seeded_and_learns():
    first, again, other = regression(0), regression(0), regression(1)
    assert first == again  # bit-identical for one seed
    assert first != other  # control: another seed draws other batches
    assert len(first) == 60 and sum(first[-5:]) < 0.1 * sum(first[:5])


def test_checkpoints_keep_the_newest_and_refuse_foreign_ones(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt", "test-format", "msd", keep=2)
    assert checkpoints.latest() is None and checkpoints.load() is None
    for step in (10, 20, 30):
        checkpoints.save(step, {"weights": torch.full((2,), float(step))})
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000020.pt", "step-00000030.pt"]
    state = checkpoints.load()
    assert state["step"] == 30 and torch.equal(state["weights"], torch.full((2,), 30.0))
    with pytest.raises(MMSpecError, match="not a test-format checkpoint of kind 'flash'"):
        Checkpoints(tmp_path / "ckpt", "test-format", "flash").load()
    (tmp_path / "ckpt" / "step-00000040.pt").write_bytes(b"truncated")
    with pytest.raises(MMSpecError, match="cannot read checkpoint"):
        checkpoints.load()
    checkpoints.clear()
    assert not (tmp_path / "ckpt").exists() and checkpoints.load() is None


def test_output_folder_never_the_package_unless_told(tmp_path, monkeypatch):
    zoo = MODELS_DIR / "shapes-image-ar"
    monkeypatch.chdir(tmp_path)
    assert output_folder(None, False, zoo) == tmp_path.joinpath("shapes-image-ar").relative_to(tmp_path)
    assert output_folder(str(tmp_path / "run"), False, zoo) == tmp_path / "run"
    assert output_folder(None, True, zoo) == zoo
    assert output_folder(str(zoo), True, zoo) == zoo
    for inside in (zoo, zoo / "vq", MODELS_DIR.parent.parent):
        with pytest.raises(MMSpecError, match="inside the installed mmspec package; pass --into-zoo"):
            output_folder(str(inside), False, zoo)
    with pytest.raises(MMSpecError, match="--into-zoo writes to"):
        output_folder(str(tmp_path / "run"), True, zoo)


def test_seed_everything_seeds_all_three():
    import random

    import numpy as np

    seed_everything(3)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(3)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    seed_everything(4)
    assert random.random() != first[0] and not math.isclose(torch.rand(1).item(), first[2])
