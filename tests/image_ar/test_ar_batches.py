"""Several class labels decode as one batch through the core loop: all rows in one forward per token."""

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar import CFGTarget, ar_generate
from mmspec.image_ar.llamagen import tiny_llamagen
from mmspec.sampling import SamplingConfig, choose_next

LABELS = [0, 2, 1, 2]


@pytest.fixture(scope="module")
def model():
    return tiny_llamagen()


def lockstep_reference(model, labels, sampling, generator, guidance_scale):
    """Plain AR sampling written out: one guided forward per token for every row, one draw per step."""
    target = CFGTarget(model, guidance_scale)
    logits = target.start(torch.tensor(labels))[:, -1]
    tokens = []
    for step in range(target.num_tokens):
        tokens.append(choose_next(logits, sampling, generator))
        if step + 1 < target.num_tokens:
            logits = target.extend(tokens[-1][:, None])[:, -1]
    return torch.stack(tokens, dim=1).view(-1, target.grid_size, target.grid_size)


@pytest.mark.parametrize("guidance_scale", [1.0, 2.0])
@pytest.mark.parametrize("sampling", [SamplingConfig(do_sample=True), SamplingConfig(do_sample=True, temperature=0.8, top_k=20),
                                      SamplingConfig(do_sample=False)], ids=["sample", "warped", "greedy"])
def test_a_batch_of_labels_equals_the_lockstep_reference(model, sampling, guidance_scale):
    out = ar_generate(model, LABELS, sampling, torch.Generator().manual_seed(4), guidance_scale=guidance_scale)
    expected = lockstep_reference(model, LABELS, sampling, torch.Generator().manual_seed(4), guidance_scale)
    assert torch.equal(out.tokens, expected)
    assert out.stats.tau == 1.0 and out.stats.new_tokens == len(LABELS) * model.config.block_size


def test_greedy_rows_equal_each_label_alone(model):
    greedy = SamplingConfig(do_sample=False)
    out = ar_generate(model, LABELS, greedy, guidance_scale=2.0)
    for row, label in enumerate(LABELS):
        assert torch.equal(out.tokens[row], ar_generate(model, [label], greedy, guidance_scale=2.0).tokens[0])


def test_image_batches_refuse_drafts(model):
    from mmspec import SpeculativeDecoder
    from mmspec.image_ar import GuidedImageDrafter
    from mmspec.image_ar.target import GuidedImageTarget

    decoder = SpeculativeDecoder(GuidedImageTarget(CFGTarget(model)), GuidedImageDrafter(CFGTarget(tiny_llamagen(seed=1))))
    with pytest.raises(MMSpecError, match="one sequence at a time"):
        decoder.generate(torch.tensor([[0], [1]]), max_new_tokens=4, eos_token_id=())


def test_pipeline_batches_plain_ar(tmp_path):
    """SpeculativeImagePipeline(batch_size=N) decodes N labels together (method ar): greedy images equal the
    one-by-one ones; sampled ones follow the lockstep reference; other methods and round callbacks are refused."""
    from mmspec.image_ar import SpeculativeImagePipeline

    from .tiny_image_folder import build_tiny_folder

    pipe = SpeculativeImagePipeline.from_pretrained(build_tiny_folder(tmp_path / "m"))
    labels = [0, 1, 2, 1, 0]
    one_by_one = pipe(class_labels=labels, method="ar", temperature=0, progress_bar=False)
    batched = pipe(class_labels=labels, method="ar", temperature=0, progress_bar=False, batch_size=2)
    assert torch.equal(batched.tokens, one_by_one.tokens) and len(batched.images) == 5
    assert batched.stats.new_tokens == one_by_one.stats.new_tokens
    sampled = pipe(class_labels=labels[:3], method="ar", seed=3, progress_bar=False, batch_size=3, guidance_scale=2.0)
    expected = lockstep_reference(pipe.runner.target.model, labels[:3], SamplingConfig(do_sample=True),
                                  torch.Generator().manual_seed(3), 2.0)
    assert torch.equal(sampled.tokens, expected)
    with pytest.raises(MMSpecError, match="drafts one image at a time"):
        pipe(class_labels=labels, method="sjd", batch_size=2, progress_bar=False)
    with pytest.raises(MMSpecError, match="batch_size must be an integer >= 1"):
        pipe(class_labels=labels, batch_size=0, progress_bar=False)
