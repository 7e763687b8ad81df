"""Testing kit shared by every adapter's tests: tiny models, adversarial drafters, and the two
proofs of losslessness (greedy equality, and a statistical test of the sampled distribution)."""

from __future__ import annotations

import itertools
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from .decoding import SpeculativeOutput, speculative_generate
from .drafters import ModelDrafter
from .sampling import SamplingConfig, probabilities


def reload_from_disk(model: PreTrainedModel) -> PreTrainedModel:
    """Save and reload through `from_pretrained`, the path real checkpoints take."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return type(model).from_pretrained(folder).eval()


def tiny_llama(
    vocab_size: int = 97,
    num_layers: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
    initializer_range: float = 0.02,
    eos_token_id: int | None = 3,
) -> PreTrainedModel:
    """A random `LlamaForCausalLM` small enough for unit tests, loaded back from disk.

    A large `initializer_range` makes next-token distributions peaked and model-specific,
    which gives distribution tests their power.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=initializer_range,
        bos_token_id=1,
        eos_token_id=eos_token_id,
        pad_token_id=0,
    )
    return reload_from_disk(AutoModelForCausalLM.from_config(config))


class NeverAgreeDrafter(ModelDrafter):
    """Drafts the model's second-best token: with the model as target, greedy never accepts."""

    def choose(self, logits, sampling, generator, want_confidence):
        token = logits.topk(2, dim=-1).indices[:, 1]
        return token, None, (0.9 if want_confidence else None)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[-1], b.shape[-1])
    diff = (a[0, :n] != b[0, :n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


def assert_greedy_equal(
    target: PreTrainedModel,
    drafter: Any,
    input_ids: torch.LongTensor | None,
    *,
    max_new_tokens: int,
    reference: torch.Tensor | None = None,
    **kwargs: Any,
) -> SpeculativeOutput:
    """Speculative greedy output must equal `target.generate(do_sample=False)` token for token.

    `reference` replaces the generate call for models whose `generate` returns another layout
    (e.g. Whisper without `return_dict_in_generate`); it must be prompt + new tokens.
    """
    model_inputs = {k: v for k, v in kwargs.items() if k not in ("policy", "num_draft_tokens", "rule", "on_tokens", "tree")}
    if reference is not None:
        expected = reference
    else:
        expected = target.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens, **model_inputs)
    kwargs.setdefault("do_sample", False)  # as the reference: greedy even where the generation config samples
    out = speculative_generate(target, drafter, input_ids, max_new_tokens=max_new_tokens, **kwargs)
    if not torch.equal(out.sequences, expected):
        at = first_difference(out.sequences, expected)
        raise AssertionError(
            f"speculative greedy output differs from target.generate at position {at}:\n"
            f"  expected {expected[0].tolist()}\n  got      {out.sequences[0].tolist()}"
        )
    return out


@dataclass
class ChiSquareResult:
    statistic: float
    dof: int
    p_value: float
    num_draws: int


def chi_square(counts: Counter, expected_probs: dict[Hashable, float], min_expected: float = 5.0) -> ChiSquareResult:
    """Pearson's chi-square goodness of fit; outcomes with few expected draws are pooled into one bin."""
    total = sum(counts.values())
    unexpected = [o for o in counts if expected_probs.get(o, 0.0) <= 0.0]
    if unexpected:
        # An outcome the reference gives probability zero is an outright failure.
        return ChiSquareResult(float("inf"), 1, 0.0, total)
    observed, expected = [], []
    pooled_obs, pooled_exp = 0.0, 0.0
    for outcome, prob in expected_probs.items():
        if prob * total >= min_expected:
            observed.append(counts.get(outcome, 0))
            expected.append(prob * total)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += prob * total
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    obs = torch.tensor(observed, dtype=torch.float64)
    exp = torch.tensor(expected, dtype=torch.float64)
    statistic = float(((obs - exp) ** 2 / exp).sum())
    dof = max(len(observed) - 1, 1)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)))
    return ChiSquareResult(statistic, dof, p_value, total)


def assert_distribution_preserved(
    draw: Callable[[torch.Generator], Hashable],
    expected_probs: dict[Hashable, float],
    num_draws: int,
    *,
    seed: int = 0,
    significance: float = 1e-3,
) -> ChiSquareResult:
    """Draw `num_draws` outcomes and test them against the exact distribution (chi-square).

    Fails (AssertionError) when the fit is rejected at `significance`. Pair every use with a
    control that shows the same test rejects a wrong sampler, so a pass means something.
    """
    generator = torch.Generator().manual_seed(seed)
    counts = Counter(draw(generator) for _ in range(num_draws))
    result = chi_square(counts, expected_probs)
    if result.p_value < significance:
        raise AssertionError(
            f"sampled distribution differs from the reference: chi2 {result.statistic:.1f} on {result.dof} dof, "
            f"p = {result.p_value:.2e} over {num_draws} draws"
        )
    return result


@torch.inference_mode()
def exact_continuation_distribution(
    model: PreTrainedModel, input_ids: torch.LongTensor, num_tokens: int, sampling: SamplingConfig
) -> dict[tuple[int, ...], float]:
    """Probability of every continuation of `num_tokens` tokens (enumerated: keep the vocabulary tiny)."""
    vocab = model.config.vocab_size
    result: dict[tuple[int, ...], float] = {}
    continuations = list(itertools.product(range(vocab), repeat=num_tokens))
    batch = torch.tensor(continuations, dtype=torch.long)
    full = torch.cat([input_ids.expand(len(continuations), -1), batch], dim=1)
    logits = model(full).logits[:, input_ids.shape[1] - 1 : -1]
    probs = probabilities(logits, sampling)
    token_probs = probs.gather(-1, batch[..., None]).squeeze(-1).double().prod(dim=1)
    for cont, p in zip(continuations, token_probs.tolist()):
        if p > 0:
            result[cont] = p
    return result
