"""Batch > 1: every row decodes as it would alone, though rows accept different numbers of drafts."""

import pytest
import torch

from mmspec import SamplingConfig, speculative_generate, speculative_sampling
from mmspec.decoding import SpeculativeDecoder
from mmspec.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from mmspec.errors import MMSpecError
from mmspec.policies import ConfidenceStopDraftLength
from mmspec.testing import assert_distribution_preserved, exact_continuation_distribution, tiny_llama
from mmspec.trees import TreeConfig

PROMPTS = [
    [1, 17, 42, 8, 66, 17, 42, 9],
    [1, 5, 6],
    [1, 9, 9, 9, 9, 12],
    [1, 70, 71, 72, 73, 74, 75, 76, 77, 78],
    [1, 33],
    [1, 40, 41, 40, 41, 40],
    [1, 2, 3, 4, 5, 6, 7],
    [1, 88, 12, 88],
]


def left_padded(prompts, pad=0):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def drafters(target, small_drafter):
    return {"model": small_drafter, "self": ModelDrafter(target), "lookup": PromptLookupDrafter(), "plain": NoDrafter()}


@pytest.mark.parametrize("size", [1, 3, 8])
@pytest.mark.parametrize("name", ["model", "self", "lookup", "plain"])
def test_greedy_batch_equals_generate_and_each_row_alone(target, small_drafter, size, name):
    prompts = PROMPTS[:size]
    ids, mask = left_padded(prompts)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    out = speculative_generate(target, drafters(target, small_drafter)[name], ids, attention_mask=mask,
                               max_new_tokens=24, num_draft_tokens=4)
    assert torch.equal(out.sequences, expected)
    for row, prompt in enumerate(prompts):
        alone = target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):]
        assert torch.equal(out.sequences[row, ids.shape[1]:], alone)
    assert out.stats.new_tokens == 24 * size


def test_self_drafting_accepts_everything_in_a_batch(target):
    """A row's drafts are judged against that row only: the target drafting for itself never misses."""
    ids, mask = left_padded(PROMPTS)
    out = speculative_generate(target, ModelDrafter(target), ids, attention_mask=mask, max_new_tokens=21, num_draft_tokens=4)
    assert out.stats.alpha == 1.0
    # Per row: the prefill verifies the first 4 drafts (5 tokens), three rounds of 4 + 1, then 1 token.
    assert out.stats.tau == pytest.approx(21 / 5)
    assert [row.new_tokens for row in out.stats.rows] == [21] * len(PROMPTS)
    assert all(row.target_forwards == 5 and row.rounds == 5 for row in out.stats.rows)
    assert out.stats.rows[0].total_time == out.stats.total_time > 0


def test_generation_settings_follow_each_row(target, small_drafter):
    """Logits processors see each row's own prefix (its padded prompt and its own tokens), as in `generate`."""
    ids, mask = left_padded(PROMPTS[:5])
    settings = dict(repetition_penalty=1.4, no_repeat_ngram_size=2, min_new_tokens=6)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, **settings)
    for drafter in (small_drafter, PromptLookupDrafter()):
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20, num_draft_tokens=3, **settings)
        assert torch.equal(out.sequences, expected)


class RowCountingDrafter(ModelDrafter):
    """Records how many rows each round drafts for."""

    def __init__(self, model):
        super().__init__(model)
        self.sizes = []

    def propose(self, view):
        if view.batch is not None:
            self.sizes.append(view.batch.size)
        return super().propose(view)


def test_rows_that_stop_leave_the_batch(target, small_drafter):
    """End tokens stop rows at different times; they are padded like `generate` pads them and stop costing work."""
    ids, mask = left_padded(PROMPTS[:6])
    free = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    stop = int(free[0, ids.shape[1] + 3])  # row 0 produces this token early; other rows later or never
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=stop)
    drafter = RowCountingDrafter(small_drafter)
    out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=24, num_draft_tokens=3,
                               eos_token_id=stop)
    assert torch.equal(out.sequences, expected)
    sizes = out.drafter.sizes  # recorded by the call's own working copy of the drafter
    assert sizes[0] < 6 or sizes[-1] < sizes[0]
    assert sizes == sorted(sizes, reverse=True)


def test_a_batch_without_padding_needs_no_mask(target, small_drafter):
    ids = torch.tensor([[1, 5, 6, 7], [1, 9, 9, 12], [1, 33, 2, 4]])
    expected = target.generate(ids, max_new_tokens=12, do_sample=False)
    out = speculative_generate(target, small_drafter, ids, max_new_tokens=12, num_draft_tokens=4)
    assert torch.equal(out.sequences, expected)


# --- sampling: each row's distribution is its target's --------------------------------------------

VOCAB = 5
NEW_TOKENS = 4
SAMPLED_PROMPTS = [[1, 2, 0, 4], [3, 1], [2, 2, 2], [4], [0, 1, 2, 3, 4], [2, 3], [1, 1, 4, 0], [3, 3, 0]]


@pytest.fixture(scope="module")
def peaked_pair():
    target = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, initializer_range=0.6, eos_token_id=None)
    drafter = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=4, initializer_range=0.6, eos_token_id=None)
    return target, drafter


def resample_from_target_rule(proposal, target_logits, sampling, generator):
    """Control: after a rejection, the correction is drawn from p instead of norm(max(p - q, 0))."""
    verdict = speculative_sampling(proposal, target_logits, sampling, generator)
    rows = torch.arange(target_logits.shape[0])
    p = target_logits[rows, verdict.num_accepted].softmax(-1)
    redrawn = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    verdict.next_token = torch.where(verdict.num_accepted < proposal.length, redrawn, verdict.next_token)
    return verdict


def batch_draws(target, drafter, rule, num_draws, size=3, seed=7):
    ids, mask = left_padded(SAMPLED_PROMPTS[:size])
    generator = torch.Generator().manual_seed(seed)
    rows = [[] for _ in range(size)]
    for _ in range(num_draws):
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=True,
                                   generator=generator, num_draft_tokens=3, rule=rule)
        for row, tokens in zip(rows, out.sequences[:, ids.shape[1]:].tolist()):
            row.append(tuple(tokens))
    return rows


def check_rows(target, rows):
    for prompt, draws in zip(SAMPLED_PROMPTS, rows):  # as many rows as were drawn
        exact = exact_continuation_distribution(target, torch.tensor([prompt]), NEW_TOKENS, SamplingConfig(do_sample=True))
        replay = iter(draws)
        assert_distribution_preserved(lambda generator: next(replay), exact, num_draws=len(draws))


@pytest.mark.slow
@pytest.mark.parametrize("size", [3, 8])
def test_sampled_rows_follow_the_target(peaked_pair, size):
    target, drafter = peaked_pair
    check_rows(target, batch_draws(target, drafter, None, num_draws=2500, size=size))


@pytest.mark.slow
def test_control_wrong_residual_fails_in_a_batch(peaked_pair):
    target, drafter = peaked_pair
    with pytest.raises(AssertionError, match="differs from the reference"):
        check_rows(target, batch_draws(target, drafter, resample_from_target_rule, num_draws=2500))


# --- what a batch refuses ------------------------------------------------------------------------


@pytest.mark.parametrize("extra, message", [
    ({"tree": TreeConfig()}, "draft trees decode one sequence"),
    ({"policy": ConfidenceStopDraftLength()}, "confidence-stopped"),
])
def test_batch_refusals(target, small_drafter, extra, message):
    ids, mask = left_padded(PROMPTS[:3])
    with pytest.raises(MMSpecError, match=message):
        speculative_generate(target, small_drafter, ids, attention_mask=mask, max_new_tokens=4, **extra)


def test_round_hooks_are_refused(target, small_drafter):
    ids, mask = left_padded(PROMPTS[:3])
    with pytest.raises(MMSpecError, match="on_round"):
        SpeculativeDecoder(target, small_drafter).generate(ids, attention_mask=mask, max_new_tokens=4,
                                                           on_round=lambda tokens, drafted, accepted: None)


def test_right_padding_is_refused(target, small_drafter):
    ids = torch.tensor([[1, 5, 6, 0], [1, 9, 9, 12]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(MMSpecError, match="padding_side='left'"):
        speculative_generate(target, small_drafter, ids, attention_mask=mask, max_new_tokens=4)


# --- the batch bench -----------------------------------------------------------------------------


def test_batch_bench_rows_are_identical_to_plain_batched_generate(target, small_drafter):
    from mmspec.bench.batches import bench_text_batches

    prompts = [p for p in PROMPTS[:5]]
    report = bench_text_batches(target, small_drafter, prompts, (1, 3), pad_token_id=0, max_new_tokens=10,
                                num_draft_tokens=3, repeats=1, progress=False)
    data = report.to_dict()
    assert set(data["batch_sizes"]) == {"1", "3"}
    for size in data["batch_sizes"].values():
        methods = {m["method"]: m for m in size["methods"]}
        assert set(methods) == {"plain-batched", "mmspec-batched", "mmspec-prompt-lookup"}
        assert all(m["identical_to_reference"] for m in methods.values())
        assert all(m["new_tokens"] == 10 * len(prompts) for m in methods.values())
    assert "batch" in report.to_table().splitlines()[1]


@pytest.mark.slow
def test_cli_bench_text_batch_sizes(capsys):
    import json

    from mmspec.cli import main
    from mmspec.zoo import entries

    if "shapes-caption-lm" not in {e.name for e in entries()}:
        pytest.skip("needs the zoo")
    assert main(["bench", "text", "--batch-size", "2,4", "--num-samples", "4", "--max-new-tokens", "8",
                 "--repeats", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["batch_sizes"]) == {"2", "4"}
