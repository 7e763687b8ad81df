"""The losses of CoDe's specialised fine-tune: each model learns only its own scales."""

from __future__ import annotations

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar.code_training import drafter_loss, drop_labels, refiner_loss
from mmspec.image_ar.var import VAR
from mmspec.image_ar.var_vq import tiny_var_vq
from mmspec.sampling import seeded_generator

PATCH_NUMS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def vq():
    return tiny_var_vq(vocab_size=16, z_channels=8, patch_nums=PATCH_NUMS, seed=0)


def var_of(seed, depth=2):
    torch.manual_seed(seed)
    return VAR(vocab_size=16, Cvae=8, num_classes=5, depth=depth, embed_dim=32, num_heads=2, patch_nums=PATCH_NUMS)


def codes_of(seed, B=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(16, (B, pn * pn), generator=g) for pn in PATCH_NUMS]


def test_the_drafter_loss_sees_only_the_drafted_scales(vq):
    model, labels, codes = var_of(0).eval(), torch.tensor([0, 1, 2, 3]), codes_of(1)
    loss = drafter_loss(model, vq, labels, codes, draft_steps=2, cond_drop_rate=0.0)
    later = codes[:2] + codes_of(2)[2:]  # other codes on scales 2 and 3: neither targets nor inputs of 0..1
    assert torch.equal(loss, drafter_loss(model, vq, labels, later, draft_steps=2, cond_drop_rate=0.0))
    # Control: another code on scale 1 (a target of the drafter) changes it.
    other = [codes[0], codes_of(2)[1], *codes[2:]]
    assert not torch.equal(loss, drafter_loss(model, vq, labels, other, draft_steps=2, cond_drop_rate=0.0))


def test_the_refiner_loss_is_zero_for_the_teacher_itself_and_trains_only_late_scales(vq):
    teacher, labels, codes = var_of(0).eval(), torch.tensor([0, 1, 2, 3]), codes_of(1)
    twin = var_of(5).eval()
    twin.load_state_dict(teacher.state_dict())
    assert refiner_loss(twin, teacher, vq, labels, codes, from_scale=2, cond_drop_rate=0.0).abs() < 1e-6
    student = var_of(1, depth=1).eval()
    loss = refiner_loss(student, teacher, vq, labels, codes, from_scale=2, cond_drop_rate=0.0)
    assert loss > 0
    loss.backward()
    assert student.head.weight.grad.abs().sum() > 0 and teacher.head.weight.grad is None


def test_class_dropout_uses_the_generator_and_the_unconditional_class():
    model, labels = var_of(0), torch.arange(5).repeat(40)
    dropped = drop_labels(model, labels, 0.5, seeded_generator("cpu", 0))
    assert torch.equal(dropped, drop_labels(model, labels, 0.5, seeded_generator("cpu", 0)))
    changed = dropped != labels
    assert 0.3 < changed.float().mean() < 0.7 and (dropped[changed] == 5).all()


def test_a_few_drafter_steps_lower_its_loss(vq):
    model, labels, codes = var_of(0).init_weights().train(), torch.tensor([0, 1, 2, 3]), codes_of(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = drafter_loss(model, vq, labels, codes, draft_steps=3, cond_drop_rate=0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_scales_outside_the_model_are_refused(vq):
    with pytest.raises(MMSpecError, match="outside"):
        drafter_loss(var_of(0), vq, torch.tensor([0]), codes_of(1, B=1), draft_steps=5)
