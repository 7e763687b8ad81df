"""Weight overlays and low-rank updates: training starts at the model and moves only the factors; an overlay read
back out and merged reproduces the trained weights; an overlay that does not fit is refused whole."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmspec.errors import MMSpecError
from mmspec.low_rank import LowRankDelta, add_low_rank, apply_overlay, overlay_of, remove_low_rank


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.v_proj, self.norm = nn.Linear(8, 8), nn.Linear(8, 6, bias=False), nn.LayerNorm(6)

    def forward(self, x):
        return self.norm(self.v_proj(torch.relu(self.q_proj(x))))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.ModuleList([Block(), Block()])
        self.projector = nn.Linear(6, 8)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for block in self.body:
            x = self.projector(block(x))
        return self.head(block(x))


def tiny(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def test_training_starts_at_the_model_and_moves_only_the_factors():
    model, x = tiny(), torch.randn(5, 8)
    before = model(x).detach()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.requires_grad_(False)
    params = add_low_rank(model, "body.", ("q_proj", "v_proj"), rank=2, alpha=4.0)
    assert len(params) == 2 * 4  # A and B for two layers of two blocks
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # B starts at zero
    opt = torch.optim.SGD(params, lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    assert (model(x) - before).abs().max() > 1e-3
    remove_low_rank(model)  # the frozen weights are as they were
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, frozen[name], rtol=0, atol=0)


def test_an_overlay_merged_reproduces_the_trained_weights():
    model = tiny()
    model.requires_grad_(False)
    add_low_rank(model, "body.", ("q_proj", "v_proj"), rank=3, alpha=6.0)
    for module in model.modules():
        if isinstance(module, LowRankDelta):
            nn.init.normal_(module.lora_B, std=0.1)
    with torch.no_grad():
        model.projector.weight.add_(0.3)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    effective = {f"body.{i}.{m}.weight": getattr(model.body[i], m).weight.detach().clone()
                 for i in range(2) for m in ("q_proj", "v_proj")}
    overlay = overlay_of(model, ["projector.weight"])
    assert set(overlay) == {"projector.weight", *(f"{k}.lora_{ab}" for k in effective for ab in "AB")}
    assert all(t.dtype == torch.float16 for t in overlay.values())

    fresh = tiny()  # the starting model, as the zoo loads the parent
    apply_overlay(fresh, overlay)
    merged = dict(fresh.named_parameters())
    for name, weight in effective.items():  # the factors are shipped in fp16: equal to that rounding
        torch.testing.assert_close(merged[name], weight, rtol=0, atol=2e-3)
        assert (merged[name] - trained[name.replace(".weight", ".parametrizations.weight.original")]).abs().max() > 1e-2
    torch.testing.assert_close(merged["projector.weight"], trained["projector.weight"], rtol=0, atol=1e-3)
    torch.testing.assert_close(merged["head.weight"], tiny().head.weight, rtol=0, atol=0)  # untouched


@pytest.mark.parametrize("bad, message", [
    ({"nowhere.weight": torch.zeros(2)}, "nowhere.weight \\(no such parameter\\)"),
    ({"projector.weight": torch.zeros(8, 5)}, "shape \\(8, 5\\)"),
    ({"body.0.q_proj.weight.lora_A": torch.zeros(2, 8)}, "needs both lora_A and lora_B"),
    ({"body.0.q_proj.weight.lora_A": torch.zeros(2, 7), "body.0.q_proj.weight.lora_B": torch.zeros(8, 2)}, "factors"),
    ({"body.9.q_proj.weight.lora_A": torch.zeros(2, 8), "body.9.q_proj.weight.lora_B": torch.zeros(8, 2)},
     "no such parameter"),
])
def test_an_overlay_that_does_not_fit_is_refused_whole(bad, message):
    model = tiny()
    good = {"head.weight": torch.ones(3, 6)}  # a fitting tensor beside the bad one must not be applied either
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(MMSpecError, match=f"does not fit the model: .*{message}"):
        apply_overlay(model, {**good, **bad})
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, before[name], rtol=0, atol=0)


def test_add_low_rank_refuses_what_it_cannot_do():
    with pytest.raises(MMSpecError, match="rank >= 1"):
        add_low_rank(tiny(), "body.", ("q_proj",), rank=0, alpha=1.0)
    with pytest.raises(MMSpecError, match="no linear layer named k_proj under 'body.'"):
        add_low_rank(tiny(), "body.", ("k_proj",), rank=2, alpha=1.0)
