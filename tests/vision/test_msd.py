"""MSD drafter: lossless against the target's own greedy decoding (untrained and briefly trained),
seeded and distribution-preserving sampling, a cache that stays equal to a fresh forward, and the modality split itself."""

import pytest
import torch
from transformers import DynamicCache

from mmspec import FixedDraftLength, MMSpecError, SamplingConfig, speculative_generate
from mmspec.testing import (
    assert_distribution_preserved,
    assert_greedy_equal,
    exact_continuation_distribution,
    tiny_llama,
)
from mmspec.types import Proposal
from mmspec.vision.distill_data import generate_distill_data
from mmspec.vision.drafter_training import train_drafter
from mmspec.vision.msd import MSDDrafter, MSDDrafterModel, causal_attention_mask, msd_slot_inputs

from .tiny_vlms import BOS, IMAGE, llava, next_video, qwen2_vl_image


def untrained(model, seed=0, **options):
    torch.manual_seed(seed)
    return MSDDrafterModel.from_target_config(model.config.get_text_config(), **options)


def llava_prompt(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.tensor([BOS]), torch.randint(4, 180, (2,), generator=gen), torch.full((4,), IMAGE),
                     torch.randint(4, 180, (4,), generator=gen)])[None]
    return ids, torch.randn(1, 3, 28, 28, generator=gen)


@pytest.fixture(scope="module")
def case():
    return llava()


@pytest.fixture(scope="module")
def trained(case, tmp_path_factory):
    """A drafter trained briefly on the target's traces of the prompts the tests decode."""
    folder = tmp_path_factory.mktemp("msd")
    examples = [{"input_ids": ids, "pixel_values": pixels} for ids, pixels in map(llava_prompt, range(3))]
    generate_distill_data(case.model, examples, folder / "data", max_new_tokens=16, progress=False)
    return train_drafter(case.model, "msd", folder / "data", folder / "out", steps=40, batch_size=4, lr=3e-3,
                         curriculum="none", checkpoint_every=0, progress=False)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_untrained_greedy_identical(case, k):
    out = assert_greedy_equal(case.model, MSDDrafter(untrained(case.model)), case.input_ids, max_new_tokens=16,
                              policy=FixedDraftLength(k), **case.inputs)
    assert out.stats.drafted > 0 and out.stats.accepted < out.stats.drafted  # rejections exercised


@pytest.mark.parametrize("k", [1, 3, 5])
def test_trained_greedy_identical(case, trained, k):
    ids, pixels = llava_prompt(1)
    out = assert_greedy_equal(case.model, MSDDrafter(trained), ids, max_new_tokens=16, policy=FixedDraftLength(k),
                              pixel_values=pixels)
    assert out.stats.accepted > 0  # the trained drafter agrees with the target sometimes


@pytest.mark.parametrize("build", [next_video, qwen2_vl_image], ids=["nextvideo", "qwen2vl"])
def test_other_vlm_classes_greedy_identical(build):
    other = build()
    assert_greedy_equal(other.model, MSDDrafter(untrained(other.model)), other.input_ids, max_new_tokens=10,
                        policy=FixedDraftLength(3), **other.inputs)


def test_sampling_runs_and_repeats(case, trained):
    def run(seed):
        return speculative_generate(case.model, MSDDrafter(trained), case.input_ids, max_new_tokens=12, do_sample=True,
                                    num_draft_tokens=3, generator=torch.Generator().manual_seed(seed), **case.inputs)

    first, again = run(5), run(5)
    assert torch.equal(first.sequences, again.sequences)
    assert first.sequences.shape[1] > case.input_ids.shape[1]
    assert first.stats.drafted > 0


def test_cache_equals_a_fresh_forward_after_rollbacks(case, trained):
    """The drafter's rolled-back cache holds exactly the KV a single forward over the committed slots gives."""
    ids, pixels = llava_prompt(2)
    drafter = MSDDrafter(trained)
    out = speculative_generate(case.model, drafter, ids, max_new_tokens=16, num_draft_tokens=4, pixel_values=pixels)
    assert out.stats.rounds > 1
    drafter = out.drafter  # the call's own working copy holds its cache
    fed = drafter.cache.get_seq_length()
    assert fed == drafter._fed
    seq = out.sequences[:, : fed + 1]
    with torch.no_grad():
        hidden = case.model(input_ids=seq, pixel_values=pixels, output_hidden_states=True).hidden_states
        embed = case.model.get_input_embeddings()
        visual = seq[:, 1:] == IMAGE
        inputs = trained.slot_inputs(embed(seq[:, 1:]), hidden[-1][:, :-1], visual, hidden[0][:, 1:])
        fresh = DynamicCache()
        trained(inputs, torch.arange(fed)[None], past_key_values=fresh, use_cache=True)
    torch.testing.assert_close(drafter.cache.layers[0].keys, fresh.layers[0].keys, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(drafter.cache.layers[0].values, fresh.layers[0].values, atol=1e-4, rtol=1e-4)


def test_visual_slots_bypass_fc(case):
    model = untrained(case.model)
    token_embeds, features, visual_embeds = torch.randn(3, 1, 2, 64).unbind(0)
    visual = torch.tensor([[True, False]])
    inputs = model.slot_inputs(token_embeds, features, visual, visual_embeds)
    assert torch.equal(inputs[0, 0], visual_embeds[0, 0])  # the target's visual embedding, untouched
    torch.testing.assert_close(inputs[0, 1], model.fc(torch.cat([token_embeds, features], -1))[0, 1])
    # The features do not reach a visual slot at all.
    again = model.slot_inputs(token_embeds, features + 1.0, visual, visual_embeds)
    assert torch.equal(again[0, 0], inputs[0, 0]) and not torch.equal(again[0, 1], inputs[0, 1])
    assert msd_slot_inputs(inputs, None, None) is inputs


def test_causal_mask_with_padding_and_past():
    mask = causal_attention_mask(torch.tensor([[1, 1, 1, 0]]), 1, 2, 2, torch.float32, torch.device("cpu"))
    allowed = (mask == 0)[0, 0]
    assert allowed.tolist() == [[True, True, True, False], [True, True, True, False]]
    assert causal_attention_mask(None, 1, 1, 5, torch.float32, torch.device("cpu")) is None


def test_refuses_a_drafter_for_another_hidden_size(case):
    small = untrained(case.model, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8)
    with pytest.raises(MMSpecError, match="hidden size"):
        speculative_generate(case.model, MSDDrafter(small), case.input_ids, max_new_tokens=2, **case.inputs)


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(MMSpecError, match="no MSD drafter"):
        MSDDrafter(tmp_path / "missing")


class UniformClaimDrafter(MSDDrafter):
    """Control: samples drafts like MSD but reports a uniform q, which breaks lossless sampling."""

    def propose(self, *args, **kwargs):
        proposal = super().propose(*args, **kwargs)
        probs = None if proposal.probs is None else torch.full_like(proposal.probs, 1.0 / proposal.probs.shape[-1])
        return Proposal(tokens=proposal.tokens, probs=probs)


@pytest.mark.slow
@pytest.mark.parametrize("drafter_class, lossless", [(MSDDrafter, True), (UniformClaimDrafter, False)], ids=["msd", "control"])
def test_sampled_distribution_is_the_targets(drafter_class, lossless):
    """On a tiny text vocabulary MSD is plain EAGLE: the sampled continuations follow the target's law exactly."""
    target = tiny_llama(vocab_size=5, hidden_size=32, num_layers=1, seed=3, initializer_range=0.6, eos_token_id=None)
    model = untrained(target, seed=4, initializer_range=0.1)
    prompt = torch.tensor([[1, 2, 0, 4]])

    def draw(generator):
        out = speculative_generate(target, drafter_class(model), prompt, max_new_tokens=4, do_sample=True,
                                   generator=generator, num_draft_tokens=3)
        return tuple(out.sequences[0, 4:].tolist())

    exact = exact_continuation_distribution(target, prompt, 4, SamplingConfig(do_sample=True))
    if lossless:
        assert_distribution_preserved(draw, exact, num_draws=1200, seed=11)
    else:
        with pytest.raises(AssertionError, match="differs from the reference"):
            assert_distribution_preserved(draw, exact, num_draws=1200, seed=11)
