"""The static-shape path (`compile=True`): fixed-width steps over static caches, compiled, lossless.

Most tests compile with dynamo's "eager" backend: the same captured graphs, fixed shapes and static cache, without
inductor's code generation (minutes on a small CPU); one greedy test runs inductor itself.
"""

import pytest
import torch
from transformers import StaticCache

from mmspec import (
    ConfidenceStopDraftLength,
    FixedDraftLength,
    HeuristicDraftLength,
    PromptLookupDrafter,
    SamplingConfig,
    TreeConfig,
    speculative_generate,
    speculative_sampling,
)
from mmspec.errors import MMSpecError
from mmspec.static_target import (
    StaticCachedModel,
    StaticModelDrafter,
    StaticTarget,
    compiled_pair,
    static_model_drafter,
    verify_widths,
)
from mmspec.targets import Target
from mmspec.testing import (
    NeverAgreeDrafter,
    assert_distribution_preserved,
    exact_continuation_distribution,
    tiny_llama,
)


@pytest.fixture(autouse=True, scope="module")
def forget_compiled_graphs():
    """Every transformers forward runs through one decorator, whose code dynamo caches graphs under: this module's
    many graphs would leave later tests' compiled calls (transformers' own static-cache generate) no room."""
    yield
    torch._dynamo.reset()



def static_pair(target, drafter, policy, backend="eager"):
    static_target = StaticTarget(target, widths=verify_widths(policy), backend=backend)
    return static_target, StaticModelDrafter(drafter, backend=backend)


def assert_same_as_generate(target, drafter, prompt, max_new_tokens, **kwargs):
    expected = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens, **{
        k: v for k, v in kwargs.items() if k == "eos_token_id"})
    out = speculative_generate(target if "static_target" not in kwargs else kwargs.pop("static_target"), drafter,
                               prompt, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    assert out.sequences.tolist() == expected.tolist()
    return out


def test_verify_widths_cover_each_policy():
    assert verify_widths(FixedDraftLength(5)) == (6,)
    assert verify_widths(ConfidenceStopDraftLength(8)) == (9,)
    assert verify_widths(HeuristicDraftLength(5, max_num_tokens=20)) == (6, 8, 16, 21)


POLICIES = {
    "fixed-1": lambda: FixedDraftLength(1),
    "fixed-4": lambda: FixedDraftLength(4),
    "heuristic": lambda: HeuristicDraftLength(2, max_num_tokens=9),
    # Stops drafting early: shorter proposals are padded to the fixed width.
    "adaptive": lambda: ConfidenceStopDraftLength(5, threshold=0.05),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", ["self", "small"])
def test_greedy_equals_generate(kind, policy, target, small_drafter, prompt):
    made = POLICIES[policy]()
    drafter = target if kind == "self" else small_drafter
    static_target, static_drafter = static_pair(target, drafter, made)
    out = assert_same_as_generate(target, static_drafter, prompt, 30, static_target=static_target, policy=made)
    if kind == "self" and policy.startswith("fixed"):
        assert out.stats.alpha == 1.0 and out.stats.target_forwards < out.stats.new_tokens


def test_a_model_drafter_subclass_keeps_its_choices(target, prompt):
    # NeverAgreeDrafter drafts the second-best token: compiled, it still never agrees.
    static_target = StaticTarget(target, widths=(4,), backend="eager")
    drafter = static_model_drafter(NeverAgreeDrafter(target), backend="eager")
    assert isinstance(drafter, NeverAgreeDrafter) and isinstance(drafter.lm, StaticCachedModel)
    out = assert_same_as_generate(target, drafter, prompt, 12, static_target=static_target, num_draft_tokens=3)
    assert out.stats.accepted == 0 and out.stats.drafted > 0


def test_no_drafter_steps_one_token_wide(target, prompt, monkeypatch):
    from mmspec import NoDrafter
    from mmspec import static_target as st

    monkeypatch.setattr(st, "DEFAULT_BACKEND", "eager")
    out = assert_same_as_generate(target, NoDrafter(), prompt, 10, compile=True)
    assert out.target.widths == (1,) and out.stats.target_forwards == 10


def test_prompt_lookup_drafts_of_any_length(target, prompt):
    # Prompt lookup proposes 0..k drafts a round: every one pads to the same width.
    static_target = StaticTarget(target, widths=(5,), backend="eager")
    repeated = torch.cat([prompt, prompt, prompt], dim=1)
    assert_same_as_generate(target, PromptLookupDrafter(), repeated, 25, static_target=static_target,
                            num_draft_tokens=4)


def test_inductor_compiled_greedy(target, small_drafter, prompt):
    """compile=True itself: inductor graphs for the verify and drafter steps; calls reuse them."""
    expected = target.generate(prompt, do_sample=False, max_new_tokens=20)
    for _ in range(2):
        out = speculative_generate(target, small_drafter, prompt, max_new_tokens=20, do_sample=False, num_draft_tokens=3,
                                   compile=True)
        assert torch.equal(out.sequences, expected)
    assert isinstance(out.target, StaticTarget) and isinstance(out.drafter, StaticModelDrafter)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_max_new_tokens_is_exact(max_new_tokens, target, prompt):
    static_target = StaticTarget(target, widths=(6,), backend="eager")
    out = assert_same_as_generate(target, target, prompt, max_new_tokens, static_target=static_target,
                                  num_draft_tokens=5)
    assert out.sequences.shape[1] == prompt.shape[1] + max_new_tokens


def test_stops_at_eos_like_generate(target, prompt):
    plain = target.generate(prompt, do_sample=False, max_new_tokens=12)
    eos = int(plain[0, prompt.shape[1] + 4])
    static_target = StaticTarget(target, widths=(7,), backend="eager")
    out = assert_same_as_generate(target, target, prompt, 12, static_target=static_target, eos_token_id=eos,
                                  num_draft_tokens=6)
    assert int(out.sequences[0, -1]) == eos


def test_rollback_moves_a_pointer_and_the_cache_grows_when_needed(target, small_drafter, prompt):
    static_target, static_drafter = static_pair(target, small_drafter, FixedDraftLength(3))
    out = assert_same_as_generate(target, static_drafter, prompt, 20, static_target=static_target,
                                  num_draft_tokens=3)
    cache = out.target.cache
    assert isinstance(cache, StaticCache) and cache.get_max_length() == 128  # one bucket: no copy, no new tensors
    assert out.stats.accepted < out.stats.drafted  # rejections happened, and were rolled back in place
    keys = cache.layers[0].keys.data_ptr()
    out = assert_same_as_generate(target, static_drafter, prompt, 20, static_target=static_target, num_draft_tokens=3)
    assert out.target.cache.layers[0].keys.data_ptr() == keys  # the next call reuses the cache
    # A longer call than the cache holds: the states move to a larger cache mid-call.
    out = assert_same_as_generate(target, static_drafter, prompt, 180, static_target=static_target,
                                  num_draft_tokens=3)
    assert out.target.cache.get_max_length() == 256
    assert int(out.target.cache.get_seq_length()) == out.target.length == out.sequences.shape[1] - 1


def test_an_overlapping_call_on_the_thread_is_refused(target, prompt):
    static_target = StaticTarget(target, widths=(4,), backend="eager")

    def nested(tokens, drafted, accepted):
        speculative_generate(static_target, target, prompt, max_new_tokens=3, do_sample=False)

    with pytest.raises(MMSpecError, match="took over"):
        speculative_generate(static_target, PromptLookupDrafter(), prompt, max_new_tokens=10, do_sample=False,
                             num_draft_tokens=3, on_round=nested)


def test_refusals(target, small_drafter, prompt):
    class CustomTarget(Target):
        pass

    with pytest.raises(MMSpecError, match="draft trees only on plain text targets"):
        speculative_generate(CustomTarget(target), small_drafter, prompt, max_new_tokens=5, compile=True,
                             tree=TreeConfig(num_nodes=4, top_k=2, depth=2))
    with pytest.raises(MMSpecError, match="transformers model as the target"):
        compiled_pair(CustomTarget(target), small_drafter, FixedDraftLength(3))
    with pytest.raises(MMSpecError, match="one sequence"):
        speculative_generate(target, small_drafter, torch.cat([prompt, prompt]), max_new_tokens=5, compile=True,
                             attention_mask=torch.ones(2, prompt.shape[1], dtype=torch.long))


VOCAB = 5
NEW_TOKENS = 4
SAMPLING_PROMPT = torch.tensor([[1, 2, 0, 4]])


@pytest.fixture(scope="module")
def peaked_static_pair():
    target = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, initializer_range=0.6, eos_token_id=None)
    drafter = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=4, initializer_range=0.6, eos_token_id=None)
    return target, static_pair(target, drafter, FixedDraftLength(3))


def draw_with(static_target, static_drafter, rule=None):
    def draw(generator):
        out = speculative_generate(static_target, static_drafter, SAMPLING_PROMPT, max_new_tokens=NEW_TOKENS,
                                   do_sample=True, generator=generator, num_draft_tokens=3, rule=rule)
        return tuple(out.sequences[0, SAMPLING_PROMPT.shape[1]:].tolist())

    return draw


def test_sampling_matches_target(peaked_static_pair):
    target, (static_target, static_drafter) = peaked_static_pair
    exact = exact_continuation_distribution(target, SAMPLING_PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    assert_distribution_preserved(draw_with(static_target, static_drafter), exact, num_draws=600, seed=11)


def resample_from_target_rule(proposal, target_logits, sampling, generator):
    """Control: the correction drawn from p instead of the residual norm(max(p - q, 0))."""
    verdict = speculative_sampling(proposal, target_logits, sampling, generator)
    if int(verdict.num_accepted[0]) < proposal.length:
        p = target_logits[:, int(verdict.num_accepted[0])].softmax(-1)
        verdict.next_token = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    return verdict


def test_control_wrong_residual_fails(peaked_static_pair):
    target, (static_target, static_drafter) = peaked_static_pair
    exact = exact_continuation_distribution(target, SAMPLING_PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_distribution_preserved(draw_with(static_target, static_drafter, rule=resample_from_target_rule), exact,
                                      num_draws=600, seed=11)


def test_bench_text_mmspec_compiled_row(target, small_drafter):
    """`mmspec bench text --compile`: the mmspec-compiled row, compiled before timing, its tokens those of generate."""
    from mmspec.bench.text import bench_text

    prompts = [torch.tensor([[1, 5, 9, 12]]), torch.tensor([[1, 7, 7, 3, 2, 8]])]
    report = bench_text(target, small_drafter, prompts, max_new_tokens=10, num_draft_tokens=3, repeats=1,
                        progress=False, policies=(), include_lookup=False, include_assisted=False,
                        include_compiled=False, include_mmspec_compiled=True)
    data = report.to_dict()
    rows = {row["method"]: row for row in data["methods"]}
    assert set(rows) == {"plain-greedy", "mmspec-compiled"}
    assert rows["mmspec-compiled"]["identical_to_reference"] and rows["mmspec-compiled"]["new_tokens"] == 20
    assert data["settings"]["compile_s[mmspec-compiled]"] >= 0


def test_cli_bench_text_compile_flag(monkeypatch, capsys):
    import mmspec.bench.text as bench_text_module
    from mmspec.bench.harness import run_benchmark
    from mmspec.cli import main
    from mmspec.stats import SpecStats
    from mmspec.zoo import entries

    if "shapes-caption-lm" not in {e.name for e in entries()}:
        pytest.skip("needs the zoo")
    seen = []

    def fake_bench(target, drafter, prompts, **options):
        seen.append(options["include_mmspec_compiled"])
        return run_benchmark("t", {"a": lambda item: ([1], SpecStats(new_tokens=1))}, [0], reference="a", repeats=1,
                             warmup=0, progress=False)

    monkeypatch.setattr(bench_text_module, "bench_text", fake_bench)
    for flags, expected in (([], False), (["--compile"], True)):
        assert main(["bench", "text", "--num-samples", "1", "--json", *flags]) == 0
        assert seen[-1] is expected
    assert main(["bench", "text", "--num-samples", "1", "--compile", "--batch-size", "2"]) != 0
    assert "--compile decodes one sequence" in capsys.readouterr().err


def test_cli_generate_compile_flag(monkeypatch, capsys):
    import mmspec.decoding
    from mmspec.cli import main
    from mmspec.zoo import entries

    if "shapes-caption-lm" not in {e.name for e in entries()}:
        pytest.skip("needs the zoo")
    seen = []
    real = mmspec.decoding.speculative_generate

    def spy(*args, **kwargs):
        seen.append(kwargs["compile"])
        return real(*args, **{**kwargs, "compile": False})  # the flag's path, without the long compile

    monkeypatch.setattr(mmspec.decoding, "speculative_generate", spy)
    for flags, expected in (([], False), (["--compile"], True)):
        assert main(["generate", "a red", "--max-new-tokens", "4", "--threads", "1", *flags]) == 0
        assert seen[-1] is expected
    capsys.readouterr()


def test_compiled_steps_return_hidden_states_like_eager(target, prompt):
    """Drafters that read the target's hidden states (feature drafters) get them from the compiled step too."""
    static_target = StaticTarget(target, widths=(5,), backend="eager")
    eager = Target(target)
    for wrapped in (static_target, eager):
        wrapped.output_hidden_states = True
        wrapped.start(prompt)
    tokens = torch.tensor([[5, 6, 7]])
    compiled_step, eager_step = (t.verify(tokens[:, :1], tokens[:, 1:]) for t in (static_target, eager))
    assert torch.allclose(compiled_step.logits, eager_step.logits, atol=1e-5)
    assert len(compiled_step.hidden_states) == len(eager_step.hidden_states)
    for a, b in zip(compiled_step.hidden_states, eager_step.hidden_states):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_a_model_split_over_devices_is_refused(prompt):
    model = tiny_llama(num_layers=2, seed=5)
    model.hf_device_map = {"model.embed_tokens": "cpu", "model.layers": "disk"}
    with pytest.raises(MMSpecError, match="on one device"):
        StaticTarget(model, backend="eager")
    model.hf_device_map = {"": "cpu"}  # loaded with device_map on one device: fine
    StaticTarget(model, backend="eager")


def test_cli_bench_overhead_compile_flag(monkeypatch, capsys):
    import mmspec.bench.text as bench_text_module
    from mmspec.bench.harness import run_benchmark
    from mmspec.cli import main
    from mmspec.stats import SpecStats

    seen = []

    def fake_bench(target, drafter, prompts, **options):
        seen.append(options["include_mmspec_compiled"])
        return run_benchmark("t", {"a": lambda item: ([1], SpecStats(new_tokens=1))}, [0], reference="a", repeats=1,
                             warmup=0, progress=False)

    monkeypatch.setattr(bench_text_module, "bench_text", fake_bench)
    for flags, expected in (([], False), (["--compile"], True)):
        assert main(["bench", "overhead", "--layers", "2", "--hidden", "64", "--num-prompts", "1", "--json", *flags]) == 0
        assert seen[-1] is expected
    capsys.readouterr()


def test_steps_near_the_position_limit_go_unpadded(target, small_drafter, prompt):
    """Padding must not run past the model's positions (a learned table would fail): the last steps feed only the
    real tokens; the output is still generate's."""
    limit = target.config.max_position_embeddings
    static_target, static_drafter = static_pair(target, small_drafter, FixedDraftLength(5))
    ends = []
    compiled = static_target._steps.forward

    def recording(**inputs):
        ends.append(int(inputs["cache"].get_seq_length()) + inputs["input_ids"].shape[1])
        return compiled(**inputs)

    static_target._steps.forward = recording
    out = assert_same_as_generate(target, static_drafter, prompt, limit - prompt.shape[1] - 1,
                                  static_target=static_target, num_draft_tokens=5)
    assert out.sequences.shape[1] == limit - 1
    assert ends and max(ends) <= limit


def test_a_model_changed_between_calls_is_compiled_afresh(prompt):
    """The compiled steps check the model once per call, not its modules at every step: a model changed between
    calls (here its weights cast to float64) gets fresh graphs and a fresh cache, and the
    output is still generate's."""
    model = tiny_llama(num_layers=2, seed=3)
    static_target = StaticTarget(model, widths=(4,), backend="eager")
    assert_same_as_generate(model, PromptLookupDrafter(), prompt, 12, static_target=static_target)
    first = static_target._steps.forward
    assert_same_as_generate(model, PromptLookupDrafter(), prompt, 12, static_target=static_target)
    assert static_target._steps.forward is first  # unchanged: the same graphs
    model.double()
    out = assert_same_as_generate(model, PromptLookupDrafter(), prompt, 12, static_target=static_target)
    assert static_target._steps.forward is not first
    assert static_target._local.cache.layers[0].keys.dtype == torch.float64  # this thread's cache, made afresh
    assert out.stats.target_forwards > 1


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_models_are_freed_with_their_last_reference(backend, prompt, monkeypatch):
    """compile=True keeps each model's static wrapper (graphs, caches) for its next call, and the wrapper holds
    the model: kept in a process-wide table, the models lived as long as the process. Dropped by the caller, a
    target and its drafter are collected with their graphs."""
    import gc
    import weakref

    from mmspec import static_target as st

    monkeypatch.setattr(st, "DEFAULT_BACKEND", backend)
    target, drafter = tiny_llama(num_layers=1, hidden_size=32, seed=5), tiny_llama(num_layers=1, hidden_size=32, seed=6)
    out = speculative_generate(target, drafter, prompt, max_new_tokens=6, do_sample=False, num_draft_tokens=2,
                               compile=True)
    assert isinstance(out.target, StaticTarget)
    target_alive, drafter_alive = weakref.ref(target), weakref.ref(drafter)
    del target, drafter, out
    gc.collect()
    assert target_alive() is None and drafter_alive() is None


def test_copies_of_a_compiled_model_start_without_its_wrappers(prompt, monkeypatch):
    """The wrappers live on the model they serve; a deep copy or a pickle of that model starts without them (they
    hold the original), and decodes on its own."""
    import copy
    import pickle

    from mmspec import NoDrafter
    from mmspec import static_target as st

    monkeypatch.setattr(st, "DEFAULT_BACKEND", "eager")
    model = tiny_llama(num_layers=1, hidden_size=32, seed=7)
    assert_same_as_generate(model, NoDrafter(), prompt, 4, compile=True)
    assert st.static_wrappers(model)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)), copy.copy(model)):
        assert not st.static_wrappers(twin)
        out = assert_same_as_generate(twin, NoDrafter(), prompt, 4, compile=True)
        assert out.target.model is twin
