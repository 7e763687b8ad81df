"""Bad calls get one clear MMSpecError, not a traceback from deep inside torch."""

import pytest
import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from mmspec import MMSpecError, speculative_generate
from mmspec.testing import tiny_llama


class NoCacheConfig(PretrainedConfig):
    model_type = "no-cache-lm"

    def __init__(self, vocab_size=97, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size


class NoCacheLM(PreTrainedModel):
    """A causal LM that never returns a KV cache."""

    config_class = NoCacheConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, 8)
        self.head = torch.nn.Linear(8, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, return_dict=None, **kwargs):
        return CausalLMOutputWithPast(logits=self.head(self.embed(input_ids)), past_key_values=None)


def test_vocabulary_mismatch(target, prompt):
    other = tiny_llama(vocab_size=50, num_layers=1, hidden_size=32)
    with pytest.raises(MMSpecError, match="vocabularies differ"):
        speculative_generate(target, other, prompt, max_new_tokens=5)


def test_batch_with_a_drafter_of_one_sequence(target, prompt):
    from mmspec.drafters import JacobiDrafter

    with pytest.raises(MMSpecError, match="JacobiDrafter drafts one sequence at a time; pass a batch of one"):
        speculative_generate(target, JacobiDrafter(target.config.vocab_size), prompt.repeat(2, 1), max_new_tokens=5)


def test_drafter_without_cache(target, prompt):
    with pytest.raises(MMSpecError, match="returned no KV cache"):
        speculative_generate(target, NoCacheLM(NoCacheConfig()), prompt, max_new_tokens=5)


def test_padded_attention_mask(target, prompt):
    mask = torch.ones_like(prompt)
    mask[0, 0] = 0
    with pytest.raises(MMSpecError, match="padding"):
        speculative_generate(target, target, prompt, max_new_tokens=5, attention_mask=mask)


@pytest.mark.parametrize("bad", [{"max_new_tokens": 0}, {"num_draft_tokens": 0}, {"temperature": -1.0, "do_sample": True}])
def test_bad_numbers(target, prompt, bad):
    kwargs = {"max_new_tokens": 5, **bad}
    with pytest.raises(MMSpecError):
        speculative_generate(target, target, prompt, **kwargs)


def test_empty_prompt(target):
    with pytest.raises(MMSpecError, match="non-empty"):
        speculative_generate(target, target, torch.empty(1, 0, dtype=torch.long), max_new_tokens=5)


def test_not_a_model(target, prompt):
    with pytest.raises(MMSpecError, match="drafter must be"):
        speculative_generate(target, "gpt2", prompt, max_new_tokens=5)
