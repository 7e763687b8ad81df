"""The core loop on CUDA: greedy equality, seeded repeats, a CPU generator with a CUDA model, ragged batches."""

import pytest
import torch

from mmspec import PromptLookupDrafter, speculative_generate
from mmspec.drafters import NoDrafter
from mmspec.testing import NeverAgreeDrafter, assert_greedy_equal, tiny_llama

from ..test_batch_decoding import PROMPTS, left_padded
from ..test_generation_fidelity import PROMPT, tiny_mistral, tiny_t5, with_generation_config

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def pair():
    return (tiny_llama(seed=0, initializer_range=0.3).to(CUDA),
            tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3).to(CUDA))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_equals_generate_on_cuda(pair, dtype):
    target, small = (m.to(dtype) for m in pair)
    prompt = PROMPT.to(CUDA)
    for drafter in (target, small, NeverAgreeDrafter(target), PromptLookupDrafter()):
        assert_greedy_equal(target, drafter, prompt, max_new_tokens=24, num_draft_tokens=4)
    for m in pair:
        m.to(torch.float32)


def test_generation_config_settings_on_cuda(pair):
    target, small = pair
    model = with_generation_config(target.cpu(), repetition_penalty=1.3, no_repeat_ngram_size=3,
                                   suppress_tokens=[13]).to(CUDA)
    target.to(CUDA)
    assert_greedy_equal(model, small, PROMPT.to(CUDA), max_new_tokens=24, num_draft_tokens=4)


def test_sliding_window_and_seq2seq_on_cuda():
    target, small = tiny_mistral(0).to(CUDA), tiny_mistral(1, layers=1, hidden=32).to(CUDA)
    assert_greedy_equal(target, small, PROMPT.to(CUDA), max_new_tokens=30, num_draft_tokens=5)
    t5, t5_small = tiny_t5(0, d_model=32, layers=2).to(CUDA), tiny_t5(1, d_model=16, layers=1).to(CUDA)
    ids = torch.tensor([[5, 9, 14, 3, 22, 40, 1]], device=CUDA)
    assert_greedy_equal(t5, t5_small, ids, max_new_tokens=20, num_draft_tokens=4, attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_seeded_sampling_repeats(pair, generator_device):
    target, small = pair
    runs = [
        speculative_generate(target, small, PROMPT.to(CUDA), do_sample=True, max_new_tokens=24, num_draft_tokens=4,
                             generator=torch.Generator(device=generator_device).manual_seed(7)).sequences
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


def test_cpu_generator_draws_what_it_draws_on_the_cpu(pair):
    """A seed means the same thing on every device (up to float differences in the probabilities)."""
    target, small = pair
    on_gpu = speculative_generate(target, small, PROMPT.to(CUDA), do_sample=True, max_new_tokens=8, num_draft_tokens=4,
                                  generator=torch.Generator().manual_seed(3)).sequences.cpu()
    target_cpu, small_cpu = tiny_llama(seed=0, initializer_range=0.3), tiny_llama(seed=1, num_layers=1, hidden_size=32,
                                                                                  initializer_range=0.3)
    on_cpu = speculative_generate(target_cpu, small_cpu, PROMPT, do_sample=True, max_new_tokens=8, num_draft_tokens=4,
                                  generator=torch.Generator().manual_seed(3)).sequences
    assert torch.equal(on_gpu, on_cpu)


# --- batches: ragged rows --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ragged_batch_equals_generate_on_cuda(pair, dtype):
    target, small = (m.to(dtype) for m in pair)
    ids, mask = (t.to(CUDA) for t in left_padded(PROMPTS))
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    for drafter in (small, PromptLookupDrafter(), NoDrafter()):
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20, num_draft_tokens=4)
        assert torch.equal(out.sequences, expected)
        assert out.sequences.device.type == "cuda"
    for m in pair:
        m.to(torch.float32)


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_seeded_batch_sampling_repeats(pair, generator_device):
    target, small = pair
    ids, mask = (t.to(CUDA) for t in left_padded(PROMPTS[:4]))
    runs = [speculative_generate(target, small, ids, attention_mask=mask, do_sample=True, max_new_tokens=16,
                                 generator=torch.Generator(device=generator_device).manual_seed(3)).sequences
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_drafter_steps_equal_the_models_forward_on_cuda(dtype):
    from mmspec.kernels.lean_llama import LeanCausalLM

    model = tiny_llama(seed=1, num_layers=2, hidden_size=32, initializer_range=0.3).to(CUDA, dtype)
    assert LeanCausalLM.supports(model)
    prompt, step = PROMPT.to(CUDA), torch.tensor([[5, 9, 11]], device=CUDA)
    with torch.inference_mode():
        ours, theirs = (model(prompt, use_cache=True).past_key_values for _ in range(2))
        logits = LeanCausalLM(model).forward(step, ours, logits_to_keep=0)
        expected = model(step, past_key_values=theirs, use_cache=True).logits
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(logits.float(), expected.float(), rtol=0, atol=tolerance)
