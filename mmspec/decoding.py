"""The shared draft/verify loop (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling").

    prefill drafter and target; the first drafts ride along with the target's prefill when they can
    while live:
        proposal = drafter.propose(k)               # tokens [B, k] (+ q [B, k, V] or None)
        step     = target.verify(committed, proposal.tokens)  # ONE target forward over k + 1 positions
        verdict  = rule(proposal, step.logits, ...) # accepted count + correction / bonus token
        commit; target.rollback(...); drafter.observe(...)

The shape of a call (one sequence drafting chains or trees, or a batch of rows) is the `mmspec.rounds` strategy
chosen once per call; the loop body is the same for all three.

Each call keeps everything it changes in a `DecodeState` (`mmspec.decode_state`), with working copies of
the target and drafter (shared weights, own caches): one decoder may serve several threads at once.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from transformers import PreTrainedModel

from .arguments import check_arguments
from .decode_state import DecodeState, RoundHook, working_copies
from .devices import input_device
from .drafters import Drafter, ModelDrafter
from .errors import MMSpecError
from .generation import resolve_generation
from .policies import DraftLengthPolicy, FixedDraftLength
from .rounds import choose_rounds
from .rule_capabilities import check_rule_shape
from .rules import AcceptanceRule, default_rule, greedy_match
from .sampling import SamplingConfig, choose_next, seeded_generator
from .stats import SpecStats
from .targets import Target, as_target
from .tree_rules import TreeAcceptanceRule, default_tree_rule
from .trees import TreeConfig

__all__ = ["RoundHook", "SpeculativeDecoder", "SpeculativeOutput", "speculative_generate"]


@dataclass
class SpeculativeOutput:
    """Like transformers' generate output: `sequences` holds prompt + new tokens; `stats` says how.
    `target` / `drafter`: the call's own working copies (its caches, counters, a drafter's own statistics)."""

    sequences: torch.LongTensor
    stats: SpecStats
    target: Target | None = None
    drafter: Drafter | None = None


def eos_ids(model: PreTrainedModel, eos_token_id: int | Iterable[int] | None) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(t) for t in eos_token_id}


def as_drafter(drafter: PreTrainedModel | Drafter) -> Drafter:
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter)
    raise MMSpecError(f"drafter must be a transformers model or an mmspec Drafter, got {type(drafter).__name__}")


class SpeculativeDecoder:
    """Binds a target, a drafter, a draft-length policy and an acceptance rule."""

    def __init__(
        self,
        target: PreTrainedModel | Target,
        drafter: PreTrainedModel | Drafter,
        policy: DraftLengthPolicy | None = None,
        rule: AcceptanceRule | TreeAcceptanceRule | None = None,
        method: str = "speculative",
        tree: TreeConfig | None = None,
        compile: bool = False,
    ) -> None:
        if compile:  # the static-shape path: fixed-width steps over static caches, compiled (mmspec.static_target)
            from .static_target import compiled_pair

            target, drafter = compiled_pair(target, drafter, policy or FixedDraftLength(5), tree)
        self.drafter = as_drafter(drafter)
        self.target = as_target(target)
        # For callers that drive the target and drafter by hand after building a decoder; each call sets its own.
        self.target.output_hidden_states = self.drafter.needs_target_hidden_states
        if self.drafter.vocab_size is not None and self.drafter.vocab_size != self.target.vocab_size:
            raise MMSpecError(
                f"drafter and target vocabularies differ ({self.drafter.vocab_size} vs {self.target.vocab_size} "
                "logits); the drafter must share the target's tokenizer"
            )
        self.drafter.bind(self.target)
        if tree is not None:
            if not isinstance(tree, TreeConfig):
                raise MMSpecError(f"tree must be a TreeConfig, got {type(tree).__name__}")
            if not self.drafter.drafts_trees:
                raise MMSpecError(f"{type(self.drafter).__name__} cannot draft trees; draft chains (leave tree unset)")
            self.target.check_tree_support()
        self.tree = tree
        self.policy = policy or FixedDraftLength(5)
        if rule is not None:
            check_rule_shape(rule, tree=tree is not None)
        self.rule = rule
        self.method = method

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.LongTensor | None,
        *,
        max_new_tokens: int | None = None,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        on_tokens: Callable[[int], None] | None = None,
        on_round: RoundHook | Callable[[torch.LongTensor, int, int], None] | None = None,
        **kwargs: Any,
    ) -> SpeculativeOutput:
        """Decode up to `max_new_tokens` as the target's `generate` would, with speculation.

        `kwargs` holds generation settings exactly as `generate` takes them (`do_sample`,
        `temperature`, `top_k`, `top_p`, `repetition_penalty`, `min_new_tokens`, ...,
        `generation_config=`, `logits_processor=`, `streamer=`; unset ones come from the target's
        `generation_config`) and model inputs (`pixel_values`, `attention_mask`, `input_features`,
        ...). Anything else is refused. An explicit `sampling` replaces do_sample / temperature /
        top-k / top-p. `on_tokens(n)` is called with the count committed each round;
        `on_round(tokens, drafted, accepted, proposed)` with the tokens themselves (1-D, on the model's
        device), the round's draft count and accepted count, and the drafts the drafter proposed, before
        verification (1-D; `proposed[:accepted]` are the kept ones, `proposed[accepted:]` the rejected
        ones; the prefill's first token: 0, 0 and no drafts). A hook taking only the first three
        arguments is called with those.

        The decoder, its target and its drafter are only read: the call runs on working copies of the
        target and drafter (their caches, counters and recordings), returned as `output.target` and
        `output.drafter`, so calls from several threads do not interfere.
        """
        if max_new_tokens is not None and max_new_tokens < 1:
            raise MMSpecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if input_ids is not None and (input_ids.dim() != 2 or input_ids.shape[1] == 0):
            raise MMSpecError(f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
        if eos_token_id is not None:
            kwargs["eos_token_id"] = eos_token_id  # a setting like any other: min-length processors use it
        settings, model_inputs = resolve_generation(self.target.model, kwargs, known_inputs=self.target.input_names(),
                                                    shipped=self.target.reads_generation_config)
        batched = batch_size_of(input_ids, model_inputs) > 1
        if sampling is not None:
            settings.sampling = sampling
            settings.config.do_sample = sampling.do_sample
        sampling = settings.sampling
        if sampling.do_sample and generator is None:
            # Seed a private generator from torch's global seed so torch.manual_seed still makes runs repeat.
            generator = seeded_generator(input_device(self.target.model))
        rule = self.rule or (default_tree_rule(sampling) if self.tree else default_rule(sampling))
        target, drafter = working_copies(self.target, self.drafter)
        state = DecodeState(
            target=target, drafter=drafter, rule=rule, capabilities=check_rule_shape(rule, tree=self.tree is not None),
            sampling=sampling, generator=generator, policy=self.policy.fresh(), stops=settings.stop_ids,
            stats=SpecStats(method=self.method), tree=self.tree, on_tokens=on_tokens, on_round=with_proposal(on_round),
            streamer=settings.streamer)
        target.output_hidden_states = drafter.needs_target_hidden_states
        # Only each row's argmax will be read: the target may take it from a certified bfloat16 head.
        target.certify_greedy = rule is greedy_match and not sampling.do_sample and self.tree is None
        rounds = choose_rounds(state, batched, model_inputs, settings.pad_token_id)
        # The caller's own inputs, before the target derives anything from them (a drafter with its own encoder).
        state.inputs = {**model_inputs, **({} if input_ids is None else {"input_ids": input_ids})}
        stats = state.stats

        with stats.timer("total"):
            with stats.timer("prefill"):
                sequence = target.initial_sequence(input_ids, model_inputs)
                prompt_length = sequence.shape[1]
                if max_new_tokens is None:
                    positions = getattr(target.model.config.get_text_config(decoder=True), "max_position_embeddings", None)
                    max_new_tokens = settings.max_new_tokens(prompt_length, positions)
                    if max_new_tokens < 1:
                        raise MMSpecError(
                            f"the prompt ({prompt_length} tokens) leaves no room under max_length="
                            f"{settings.config.max_length}: pass max_new_tokens"
                        )
                state.max_new_tokens = max_new_tokens
                settings.fix_lengths(prompt_length, max_new_tokens)
                processors = target.build_logits_processors(
                    settings.config, prompt_length, settings.user_processors, encoder_input_ids=input_ids
                )
                target.processors = processors
                state.processors = processors
                if state.streamer is not None:
                    state.streamer.put(sequence.cpu())
                # The drafter's prefill; the first drafts ride along with the target's when they can.
                proposal = rounds.begin(sequence, model_inputs)
                step = rounds.start(proposal, model_inputs)
                if proposal is None:
                    rounds.first(choose_next(step.logits[:, -1], sampling, generator))
                else:
                    rounds.commit(proposal, step, rule(proposal, step.logits, sampling, generator))
            while rounds.live:
                with stats.timer("draft"):
                    proposal = rounds.propose()
                with stats.timer("verify"):
                    step = rounds.verify(proposal)
                    rounds.commit(proposal, step, rule(proposal, step.logits, sampling, generator))

        if state.streamer is not None:
            state.streamer.end()
        sequences = rounds.finish()
        return SpeculativeOutput(sequences=sequences, stats=stats, target=target, drafter=drafter)


def batch_size_of(input_ids: torch.Tensor | None, model_inputs: dict[str, Any]) -> int:
    """Rows in a call: input_ids' (decoder-only), else the first batched model input's (encoder-decoder)."""
    if input_ids is not None:
        return int(input_ids.shape[0])
    for value in model_inputs.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
        states = getattr(value, "last_hidden_state", None)
        if states is not None:
            return int(states.shape[0])
    return 1


def with_proposal(on_round: Callable[..., None] | None) -> RoundHook | None:
    """`on_round` as the loop calls it, with the round's drafts as a fourth argument; a hook written for
    three arguments (tokens, drafted, accepted) is called without them."""
    if on_round is None:
        return None
    try:
        inspect.signature(on_round).bind(None, None, None, None)
    except TypeError:
        return lambda tokens, drafted, accepted, _proposed: on_round(tokens, drafted, accepted)
    except ValueError:  # no signature to read (some builtins): call it as documented
        pass
    return on_round


def speculative_generate(
    target: PreTrainedModel | Target,
    drafter: PreTrainedModel | Drafter,
    input_ids: torch.LongTensor | None,
    *,
    max_new_tokens: int | None = None,
    generator: torch.Generator | None = None,
    num_draft_tokens: int = 5,
    policy: DraftLengthPolicy | None = None,
    rule: AcceptanceRule | TreeAcceptanceRule | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    on_tokens: Callable[[int], None] | None = None,
    tree: TreeConfig | None = None,
    compile: bool = False,
    **kwargs: Any,
) -> SpeculativeOutput:
    """Generate with speculative decoding: the output is what `target.generate(...)` gives for the same call.

    Greedy output equals `target.generate` token for token; sampled output follows its distribution.

    Args:
        target: a transformers causal or encoder-decoder LM (or an mmspec `Target`).
        drafter: a transformers LM with the same vocabulary, or an mmspec `Drafter`.
        input_ids: prompts [B, L] (the encoder input for encoder-decoder targets). With B > 1, pad on the
            left and pass `attention_mask`; each row accepts its own drafts (`mmspec.rounds.BatchRounds`) and
            the output is `generate`'s for the batch: rows that stop early are padded with the pad token.
        max_new_tokens: as in `generate` (unset: the generation config's, else `max_length` - prompt).
        generator: the source of all randomness; a CPU generator works with a model on any device.
        num_draft_tokens: k for the default fixed policy; ignored when `policy` is given.
        policy: a draft-length policy (fixed, heuristic, adaptive confidence stop).
        rule: the acceptance rule; default greedy match, or lossless speculative sampling (with `tree`:
            a tree rule, default `greedy_tree_match` or `tree_speculative_sampling`).
        tree: draft an EAGLE-2 tree (`TreeConfig(num_nodes, top_k, depth)`) instead of a chain, verified
            in one target forward; `num_draft_tokens` and `policy` are then unused.
        on_tokens: called with the number of tokens committed each round (progress bars).
        compile: the static-shape path for a decoder-only target (text, LLaVA family, Qwen2-VL; chains, one sequence;
            draft trees on plain text targets, each tree verified padded to num_nodes + 1, `mmspec.static_trees`):
            static KV caches rolled back by moving a length pointer, every round verifying a fixed k + 1
            positions, drafter steps of one shape, each forward compiled once (`mmspec.static_target`).
            The first calls compile (slow); later calls with the same shapes reuse the graphs.
        kwargs: generation settings as `generate` takes them (`do_sample`, `temperature`, `top_k`,
            `top_p`, `repetition_penalty`, `no_repeat_ngram_size`, `bad_words_ids`,
            `min_new_tokens`, `suppress_tokens`, ..., `generation_config=`, `logits_processor=`,
            `streamer=`), unset ones taken from the target's `generation_config` as `generate`
            does; and model inputs (`pixel_values`, `attention_mask`, `input_features`, ...).
            Settings that cannot be honoured exactly (`num_beams`, `min_p`, ...) and unknown
            names are refused with an `MMSpecError`.
    """
    check_arguments(target, input_ids, max_new_tokens, generator, num_draft_tokens, policy, kwargs)
    for name, hook in (("on_tokens", on_tokens), ("on_round", kwargs.get("on_round"))):
        if hook is not None and not callable(hook):
            raise MMSpecError(f"{name} must be callable (or None), got {type(hook).__name__}")
    decoder = SpeculativeDecoder(target, drafter, policy=policy or FixedDraftLength(num_draft_tokens), rule=rule, tree=tree,
                                 compile=compile)
    return decoder.generate(
        input_ids, max_new_tokens=max_new_tokens, generator=generator, eos_token_id=eos_token_id,
        on_tokens=on_tokens, **kwargs,
    )
