"""The one-layer autoregressive fast decoder of Hybrid Decoding: a `WhisperForCausalLM` on the frozen encoder.

Lim et al., "Hybrid Decoding: Rapid Pass and Selective Detailed Correction for Sequence Models"
(arXiv 2508.19671) attach a light decoder to the shared encoder; its whole hypothesis is the draft
the big decoder verifies. `CTCFastDecoder` (fast_decoder.py) is the non-autoregressive default;
this file is the autoregressive option: one Whisper decoder layer (same width and vocabulary as
the target) reading the target's frozen encoder states through cross-attention, initialised from
the target's own embeddings, positions, final norm and one of its decoder layers, then trained by
distillation (`speech/train_fast.py`).

Per utterance it drafts the WHOLE hypothesis greedily with its own KV cache, up to end-of-text or
the decoder's position limit, continuing the target's forced prompt (start, language, task,
no-timestamps) and applying the target's token suppression, so that a copy of a one-layer target
reproduces the target's greedy transcript exactly. The hypothesis excludes the prompt and the
end-of-text token, like the CTC hypothesis; `HybridDrafter` then verifies it unchanged.

Two options make it cheap on a real Whisper (tiny.en: a 51864 x 384 output head costs ~40% of a
whole 4-layer decoder step on a CPU):
- `shares_target_embeddings`: the token embedding and output head ARE the target's (bound at load
  time by `attach_ar_fast_decoder`, never saved), so a checkpoint holds only the layer, positions
  and final norm (a few MB);
- `draft_vocab`: a reduced drafting vocabulary (FR-Spec, Zhao et al., arXiv 2502.14856): drafting
  projects onto these token ids only (the rows of the shared head), e.g. 4096 instead of 51864. The
  target still verifies over its full vocabulary, so hybrid strict stays lossless; a token outside
  the list is simply never drafted.

Because it is a plain `WhisperForCausalLM` (saved with `save_pretrained`), the same weights also
serve as the assistant of transformers' assisted generation
(`whisper.generate(input_features, assistant_model=ar_fast_decoder)`), which hands the assistant
the target's encoder output (no second encoder), distil-whisper style.
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, WhisperConfig, WhisperForCausalLM

from ..cached_model import cache_argument, model_vocab_size, output_cache
from ..devices import input_device
from ..errors import MMSpecError
from ..kernels.int8_linear import Int8Linear, int8_drafting_available, int8_linears
from ..policies import DraftLengthPolicy
from ..sampling import SamplingConfig
from ..types import Proposal, Verdict
from .fast_decoder import check_draft_vocab
from .hybrid import HybridDrafter
from .lean_decoder import LeanDecoderState, LeanWhisperDecoder
from .target import encoder_outputs_of

AR_FAST_DECODER_FOLDER = "ar_fast_decoder"


@dataclass
class UtteranceCache:
    """One utterance's lean drafting cache, kept between re-drafts (batch of one).

    `fed` lists the token ids whose keys/values the cache holds. A re-draft keeps the cache of the
    longest prefix it shares with the new committed transcript and feeds only the rest (the
    correction, or the target's bonus token), so the encoder's cross-attention projections and the
    accepted tokens are computed once per utterance, not once per re-draft.
    """

    states: torch.Tensor | None = None  # the encoder states the cache was started from
    runner: LeanWhisperDecoder | None = None
    state: LeanDecoderState | None = None
    fed: list[int] = field(default_factory=list)


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ARFastDecoder(WhisperForCausalLM):
    """A `WhisperForCausalLM` that drafts whole hypotheses (the `HypothesisSource` protocol of hybrid.py).

    Extra config fields (saved in config.json, defaults for use outside the pipeline):
      - `draft_prompt_ids`: the forced prompt it continues (the target's, as seen in training);
      - `draft_suppress_tokens`, `draft_begin_suppress_tokens`: the target's suppression lists.
    `ARHybridDrafter` replaces all three per utterance with the bound target's own values.
      - `shares_target_embeddings`: embeddings and head come from the target (`attach_ar_fast_decoder`);
      - `shares_target_decoder`: the WHOLE decoder is the target's (a self-drafter: the target's own
        layers, drafting over `draft_vocab` only); the folder then holds no weights at all;
      - `draft_vocab`: token ids drafting projects onto (None: the whole vocabulary);
      - `draft_redraft`, `draft_redraft_tokens`: how `make_hybrid_drafter` drafts by default (see
        `ARHybridDrafter`), so a shipped fast decoder carries the setting it was measured with;
      - `draft_weights`: "int8" = lean drafting steps run weight-only int8 copies of the decoder's linear
        layers and head, made once at first use (`mmspec.kernels.int8_linear`; on a CPU only, elsewhere
        the weights as they are). The target verifies with its own weights: the output does not change.
    """

    # With shared embeddings the checkpoint has no embedding/head: they are bound from the target.
    _keys_to_ignore_on_load_missing = [r"model\.decoder\.embed_tokens\.weight", r"proj_out\.weight"]

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._draft_head: tuple[Any, torch.Tensor, torch.Tensor] | None = None  # (source weight, rows, ids)
        self._int8: dict[Any, Int8Linear] = {}  # int8 copies for lean drafting, by module (and "head")
        self.prompt_ids: list[int] | None = None  # set per utterance by ARHybridDrafter
        self.suppress_tokens: list[int] | None = None
        self.begin_suppress_tokens: list[int] | None = None
        self.last_steps = 0  # decoder forwards of the last hypothesis (for honest drafter counts)

    def make_hybrid_drafter(self, **kwargs: Any) -> "ARHybridDrafter":
        """The hybrid drafter this fast decoder needs (see `hybrid.hybrid_drafter_for`); re-drafting as the
        config says unless `redraft` / `redraft_tokens` are given."""
        kwargs.setdefault("redraft", bool(getattr(self.config, "draft_redraft", False)))
        if kwargs["redraft"]:
            kwargs.setdefault("redraft_tokens", getattr(self.config, "draft_redraft_tokens", None))
        return ARHybridDrafter(self, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> "ARFastDecoder":
        """As transformers'; a self-drafter folder (`shares_target_decoder`) has no weights: its modules are
        placeholders (meta tensors) until `attach_ar_fast_decoder` binds the target's decoder."""
        folder = Path(str(pretrained_model_name_or_path))
        config_file = folder / "config.json"
        if not (config_file.is_file() and json.loads(config_file.read_text()).get("shares_target_decoder")):
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        config = WhisperConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = cls(config)
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
        return model.eval()

    @classmethod
    def for_target(cls, target_model: PreTrainedModel, *, num_layers: int = 1, init_layer: int = 0,
                   init_layers: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None,
                   share_embeddings: bool = False, share_decoder: bool = False,
                   draft_vocab: Sequence[int] | None = None) -> "ARFastDecoder":
        """A fresh fast decoder sized for `target_model`, initialised from its decoder.

        Learned positions and the final layer norm are copied; embeddings and the LM head are copied
        too, or with `share_embeddings` ARE the target's (not saved; see the module docstring). Each
        of the `num_layers` layers is a copy of the target's decoder layer `init_layer` (default 0,
        the first: it reads the raw token embeddings, as the fast decoder's only layer does; -1 is
        the last). `init_layers` instead copies these target layers, in order (one fast-decoder layer
        each: e.g. (0, 2, 3) skips a layer). `share_decoder`: a self-drafter, the target's whole decoder
        (every layer, embeddings and head; nothing copied or saved). `draft_vocab`: the reduced drafting
        vocabulary (token ids), or None.
        """
        decoder = getattr(getattr(target_model, "model", None), "decoder", None)
        if decoder is None or not hasattr(decoder, "layers"):
            raise MMSpecError(f"{type(target_model).__name__} has no Whisper-style decoder to initialise the fast decoder from")
        layers = len(decoder.layers)
        if share_decoder:
            init_layers = range(layers)
        sources = [init_layer] * num_layers if init_layers is None else [int(i) for i in init_layers]
        for index in sources:
            if not -layers <= index < layers:
                raise MMSpecError(f"init_layer {index} is out of range: the target has {layers} decoder layers")
        if not sources:
            raise MMSpecError(f"a fast decoder needs at least one layer, got num_layers={num_layers}, init_layers={init_layers}")
        num_layers = len(sources)
        config = copy.deepcopy(target_model.config)
        config.decoder_layers = num_layers
        config.is_encoder_decoder = False
        config.architectures = [cls.__name__]
        generation = target_model.generation_config
        config.draft_suppress_tokens = list(generation.suppress_tokens or [])
        config.draft_begin_suppress_tokens = list(generation.begin_suppress_tokens or [])
        config.draft_prompt_ids = [int(t) for t in prompt_ids] if prompt_ids is not None else None
        # Suppression lives in the draft_* fields only: if the generation config carried it too,
        # transformers' assisted generation would apply it twice (the target's processors are
        # already passed to the assistant), with the wrong begin index.
        config.suppress_tokens = None
        config.begin_suppress_tokens = None
        config.forced_decoder_ids = None
        share_embeddings = share_embeddings or share_decoder
        config.shares_target_embeddings = bool(share_embeddings)
        config.shares_target_decoder = bool(share_decoder)
        if share_embeddings:
            # Both come from the target at load time: nothing in the checkpoint to tie (transformers
            # would call a checkpoint without either "corrupted").
            config.tie_word_embeddings = False
        config.draft_vocab = check_draft_vocab(draft_vocab, config.vocab_size)
        model = cls(config).to(dtype=target_model.dtype, device=input_device(target_model))  # not meta when offloaded
        source = decoder.state_dict()
        state = {k: v for k, v in source.items() if not k.startswith("layers.")}
        for i, index in enumerate(sources):
            prefix = f"layers.{index % layers}."
            state.update({f"layers.{i}.{k[len(prefix):]}": v for k, v in source.items() if k.startswith(prefix)})
        model.model.decoder.load_state_dict(state, strict=True)
        with torch.no_grad():
            model.proj_out.weight.copy_(target_model.get_output_embeddings().weight)  # same tensor if tied
        model.generation_config = GenerationConfig(
            decoder_start_token_id=generation.decoder_start_token_id, eos_token_id=generation.eos_token_id,
            pad_token_id=generation.pad_token_id, bos_token_id=generation.bos_token_id,
        )
        if share_embeddings:
            model.share_target_embeddings(target_model)
        return model.eval()

    @property
    def shares_target_decoder(self) -> bool:
        return bool(getattr(self.config, "shares_target_decoder", False))

    # --- shared embeddings, reduced vocabulary --------------------------------------------------

    @property
    def shares_target_embeddings(self) -> bool:
        return bool(getattr(self.config, "shares_target_embeddings", False))

    def share_target_embeddings(self, target_model: PreTrainedModel) -> None:
        """Use the target's token embedding and output head modules (the same tensors, no copy); with
        `shares_target_decoder`, its whole decoder."""
        if self.shares_target_decoder:
            self.model.decoder = target_model.get_decoder()
        else:
            self.model.decoder.embed_tokens = target_model.get_decoder().embed_tokens
        self.proj_out = target_model.get_output_embeddings()
        self._draft_head = None

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """As transformers', but without the target's embedding and head when they are shared."""
        if self.shares_target_decoder:
            # Nothing of its own to save: the config (draft vocabulary, settings) is the whole drafter.
            Path(save_directory).mkdir(parents=True, exist_ok=True)
            self.config.save_pretrained(save_directory)
            self.generation_config.save_pretrained(save_directory)
            return
        if self.shares_target_embeddings and kwargs.get("state_dict") is None:
            kwargs["state_dict"] = {k: v for k, v in self.state_dict().items()
                                    if k not in ("model.decoder.embed_tokens.weight", "proj_out.weight")}
        super().save_pretrained(save_directory, *args, **kwargs)

    def draft_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(head weight rows drafting projects onto, their token ids or None for the whole vocabulary)."""
        vocab = getattr(self.config, "draft_vocab", None)
        weight = self.proj_out.weight
        if weight.is_meta:
            raise MMSpecError("this fast decoder drafts with its model's own decoder: attach it to the model first "
                              "(attach_ar_fast_decoder, or load it through TranscriptionPipeline)")
        if not vocab:
            return weight, None
        cached = self._draft_head
        if cached is None or cached[0] is not weight or cached[1].dtype != weight.dtype or cached[1].device != weight.device:
            ids = torch.tensor(vocab, dtype=torch.long, device=weight.device)
            # One contiguous [K, D] copy, made once: slicing per step would cost more than it saves.
            cached = (weight, weight.detach()[ids].contiguous(), ids)
            self._draft_head = cached
        return cached[1], cached[2]

    # --- drafting -----------------------------------------------------------------------------

    def _prompt(self, prompt_ids: Sequence[int] | torch.Tensor | None) -> list[int]:
        if prompt_ids is None:
            prompt_ids = self.prompt_ids if self.prompt_ids is not None else getattr(self.config, "draft_prompt_ids", None)
        if prompt_ids is None:
            start = self.generation_config.decoder_start_token_id or self.config.decoder_start_token_id
            if start is None:
                raise MMSpecError("the AR fast decoder needs a prompt: pass prompt_ids (the target's forced decoder prompt)")
            prompt_ids = [start]
        ids = prompt_ids.flatten().tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
        return [int(t) for t in ids]

    def _suppression(self) -> tuple[list[int], list[int]]:
        suppress = self.suppress_tokens if self.suppress_tokens is not None else getattr(self.config, "draft_suppress_tokens", None)
        begin = self.begin_suppress_tokens if self.begin_suppress_tokens is not None else getattr(
            self.config, "draft_begin_suppress_tokens", None)
        return list(suppress or []), list(begin or [])

    def _stop_ids(self) -> set[int]:
        eos = self.generation_config.eos_token_id
        if eos is None:
            eos = self.config.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple)) else ({int(eos)} if eos is not None else set())

    @torch.inference_mode()
    def hypothesis(self, encoder_hidden_states: torch.Tensor, prompt_ids: Sequence[int] | torch.Tensor | None = None,
                   max_new_tokens: int | None = None, lean: bool = True,
                   draft_cache: UtteranceCache | None = None) -> list[list[int]]:
        """Greedy hypotheses, one list of target token ids per utterance (no prompt, no end-of-text).

        encoder_hidden_states [B, T, D]: the target encoder's output. `prompt_ids`: the forced prompt
        to continue (default: the one set by `ARHybridDrafter`, else the config's). `max_new_tokens`:
        default as many as the decoder's positions allow after the prompt. `lean`: run the steps with
        `LeanWhisperDecoder` (same maths, a fraction of the per-call cost); False uses the
        transformers forward. `draft_cache`: an `UtteranceCache` to continue (one utterance, lean steps): the
        cache of the prefix it shares with `prompt_ids` is reused and only the rest is fed.
        """
        prompt = self._prompt(prompt_ids)
        limit = self.config.max_target_positions - len(prompt)
        if max_new_tokens is not None:
            limit = min(limit, max_new_tokens)
        batch = encoder_hidden_states.shape[0]
        states = encoder_hidden_states.to(dtype=self.dtype, device=self.device)
        suppress, begin = self._suppression()
        stops = self._stop_ids()
        tokens = torch.tensor([prompt] * batch, dtype=torch.long, device=self.device)
        head, vocab_ids = self.draft_head()
        if vocab_ids is not None:
            # Suppression and stops in the reduced vocabulary's positions (tokens outside it are never drafted).
            position = {int(t): i for i, t in enumerate(vocab_ids.tolist())}
            suppress = [position[t] for t in suppress if t in position]
            begin = [position[t] for t in begin if t in position]
            stops = {position[t] for t in stops if t in position}
            if not stops:
                raise MMSpecError("the draft vocabulary lacks end-of-text: the fast decoder could never end a hypothesis")
        suppress_ids = torch.tensor(suppress, dtype=torch.long, device=self.device)  # built once, not per step
        done = [False] * batch
        out: list[list[int]] = [[] for _ in range(batch)]
        step_input = tokens
        if draft_cache is not None:
            if batch != 1 or not lean:
                raise MMSpecError("a draft cache continues one utterance with lean steps")
            step_logits, step_input = self._cached_steps(draft_cache, encoder_hidden_states, states, head, prompt)
        elif lean:
            step_logits = self._lean_steps(states, head)
        else:
            step_logits = self._transformers_steps(states, head, vocab_ids)
        self.last_steps = 0
        for step in range(max(0, limit)):
            logits = step_logits(step_input).float()
            if draft_cache is not None:
                draft_cache.fed += step_input[0].tolist()
            self.last_steps += 1
            # The same -inf fill as Whisper's SuppressTokens(AtBegin)LogitsProcessor (see target.py).
            if suppress:
                logits.index_fill_(1, suppress_ids, float("-inf"))
            if step == 0 and begin:
                logits[:, begin] = float("-inf")
            choice = logits.argmax(-1)
            for row, token in enumerate(choice.tolist()):
                if done[row]:
                    continue
                if token in stops:
                    done[row] = True
                else:
                    out[row].append(token if vocab_ids is None else int(vocab_ids[token]))
            if all(done):
                break
            step_input = (choice if vocab_ids is None else vocab_ids[choice])[:, None]
        return out

    def lean_runner(self, head: torch.Tensor) -> LeanWhisperDecoder:
        """The lean step runner over this decoder and the drafting `head` rows (int8 copies if the config asks)."""
        if getattr(self.config, "draft_weights", None) != "int8" or not int8_drafting_available(head.device):
            return LeanWhisperDecoder(self.model.decoder, self.proj_out, head_weight=head)
        modules = [m for layer in self.model.decoder.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        self._int8.update(int8_linears(modules, self._int8))
        if "head" not in self._int8 or self._int8["head"].source is not head:
            self._int8["head"] = Int8Linear(head)  # head rows have no bias (see LeanWhisperDecoder.logits)
        return LeanWhisperDecoder(self.model.decoder, self.proj_out, head_weight=head,
                                  linears={m: self._int8[m] for m in modules}, head=self._int8["head"])

    def _lean_steps(self, states: torch.Tensor, head: torch.Tensor) -> Callable[[torch.LongTensor], torch.Tensor]:
        runner = self.lean_runner(head)
        state = runner.start(states)
        return lambda ids: runner.step(state, ids)

    def _cached_steps(self, draft_cache: UtteranceCache, given: torch.Tensor, states: torch.Tensor, head: torch.Tensor,
                       prompt: list[int]) -> tuple[Callable[[torch.LongTensor], torch.Tensor], torch.LongTensor]:
        """Steps over the utterance cache, and the part of `prompt` it has not seen yet (`given`: the
        encoder states as passed, which identify the utterance; `states`: them in this model's dtype)."""
        if draft_cache.runner is None or draft_cache.runner.head_weight is not head or draft_cache.states is not given:
            draft_cache.runner = self.lean_runner(head)
            draft_cache.state, draft_cache.states, draft_cache.fed = draft_cache.runner.start(states), given, []
        # At least the last prompt token is fed again: its step gives the first draft's logits.
        keep = min(_shared_prefix(draft_cache.fed, prompt), len(prompt) - 1)
        draft_cache.runner.truncate(draft_cache.state, keep)
        del draft_cache.fed[keep:]
        runner, state = draft_cache.runner, draft_cache.state
        rest = torch.tensor([prompt[keep:]], dtype=torch.long, device=self.device)
        return (lambda ids: runner.step(state, ids)), rest

    def _transformers_steps(self, states: torch.Tensor, head: torch.Tensor,
                            vocab_ids: torch.Tensor | None) -> Callable[[torch.LongTensor], torch.Tensor]:
        cache = None

        def step(ids: torch.LongTensor) -> torch.Tensor:
            nonlocal cache
            result = self(input_ids=ids, encoder_outputs=states, **{cache_argument(self): cache}, use_cache=True)
            cache = output_cache(result)
            return result.logits[:, -1] if vocab_ids is None else result.logits[:, -1, vocab_ids]

        return step


class ARHybridDrafter(HybridDrafter):
    """`HybridDrafter` for an `ARFastDecoder`: the draft continues the target's actual prompt.

    The CTC hypothesis needs only encoder states; an autoregressive one also needs the forced
    prompt (which holds the detected language) and the target's suppression lists, which only the
    drafter sees (the prompt is `sequence` in `prefill`, the target is bound). Drafter forwards
    count every autoregressive step of the fast decoder, not one per hypothesis.

    `redraft=True` (our extension, not in the paper): after a round in which the big decoder
    rejected a draft, the fast decoder drafts the rest of the utterance again, continuing the
    corrected transcript, instead of re-aligning the old hypothesis. An autoregressive fast
    decoder can condition on the correction (a CTC one cannot), so the new draft follows the big
    decoder's path; the price is more fast-decoder steps, which `redraft_tokens` caps (a re-draft
    past the next likely correction is mostly thrown away). With a cap the drafter becomes a chain
    drafter: every round drafts `redraft_tokens` tokens past the committed transcript, continuing
    one lean cache per utterance (`UtteranceCache`), so each round feeds only the target's last token.
    """

    def __init__(self, fast_decoder: ARFastDecoder, *, redraft: bool = False, redraft_tokens: int | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(fast_decoder, ARFastDecoder):
            raise MMSpecError(f"ARHybridDrafter needs an ARFastDecoder, got {type(fast_decoder).__name__}")
        super().__init__(fast_decoder, **kwargs)
        if redraft_tokens is not None and redraft_tokens < 1:
            raise MMSpecError(f"redraft_tokens must be >= 1 (or None for the whole rest), got {redraft_tokens}")
        self.redraft = redraft
        self.redraft_tokens = redraft_tokens  # a re-draft stops after this many tokens (None: to end-of-text)
        self.redrafts = 0
        self._encoder_states: torch.Tensor | None = None
        self._prompt: list[int] = []
        self._suppression: tuple[list[int], list[int]] = ([], [])
        self._rejected = False
        self._fresh = False  # a hypothesis was drafted since the last verdict
        self._utterance_cache: UtteranceCache | None = None

    @property
    def drafts_batches(self) -> bool:  # type: ignore[override]
        return not self.redraft  # re-drafting follows one recording's committed text

    def prefill_batch(self, batch: Any, model_inputs: dict[str, Any]) -> None:
        """Each recording's hypothesis continues its own forced prompt (recordings sharing a prompt, e.g. one
        detected language, are drafted together in one batched pass of the fast decoder)."""
        self._reset()
        self._read_suppression()
        states = encoder_outputs_of(self.target.model, model_inputs).last_hidden_state
        prompts = batch.tokens.tolist()
        self._hypotheses = [[] for _ in prompts]
        for prompt in dict.fromkeys(map(tuple, prompts)):
            rows = [b for b, row in enumerate(prompts) if tuple(row) == prompt]
            with self._drafting_setup(list(prompt)):
                found = self.fast_decoder.hypothesis(states[rows])
            self.forwards += self.fast_decoder.last_steps
            for b, hypothesis in zip(rows, found):
                self._hypotheses[b] = hypothesis
        self._start_cursors(batch)

    def _read_suppression(self) -> None:
        if self.target is not None:
            generation = self.target.model.generation_config
            self._suppression = (list(generation.suppress_tokens or []), list(generation.begin_suppress_tokens or []))

    def prefill(self, sequence: torch.LongTensor, model_inputs: dict[str, Any]) -> None:
        self._prompt = [int(t) for t in sequence[0].tolist()]
        self._read_suppression()
        self.redrafts, self._rejected = 0, False
        if not self.redraft:
            with self._drafting_setup(self._prompt):
                super().prefill(sequence, model_inputs)
            self.forwards += max(0, self.fast_decoder.last_steps - 1)  # the base class counted one
            return
        self._encoder_states = self._start(sequence, model_inputs)
        self._utterance_cache = UtteranceCache()
        self._redraft([])
        self.redrafts = 0
        self._hand_over_cross_attention()

    def _hand_over_cross_attention(self) -> None:
        """A self-drafter projected the encoder states through the target's own cross-attention layers before
        the target's prefill: the target takes those keys/values instead of projecting them a second time."""
        cache, decoder = self._utterance_cache, self.fast_decoder
        reuse = getattr(self.target, "reuse_cross_attention", None)
        if (reuse is not None and getattr(decoder, "shares_target_decoder", False) and cache is not None
                and cache.state is not None and cache.states is self._encoder_states
                and decoder.dtype == self._encoder_states.dtype and decoder.device == self._encoder_states.device):
            reuse(self._encoder_states, cache.state.cross)

    @contextmanager
    def _drafting_setup(self, prompt: list[int]) -> Iterator[None]:
        """The fast decoder continues `prompt` with the target's suppression lists, for one call."""
        decoder: ARFastDecoder = self.fast_decoder  # type: ignore[assignment]
        decoder.prompt_ids = prompt
        decoder.suppress_tokens, decoder.begin_suppress_tokens = self._suppression
        try:
            yield
        finally:
            decoder.prompt_ids = decoder.suppress_tokens = decoder.begin_suppress_tokens = None

    def propose(self, sequence: torch.LongTensor, max_tokens: int, sampling: SamplingConfig,
                generator: torch.Generator | None, policy: DraftLengthPolicy) -> Proposal:
        wanted = self._rejected or self.redraft_tokens is not None  # capped: a new chain every round
        if self.redraft and wanted and not self._fresh and max_tokens > 0 and self._encoder_states is not None:
            self._redraft(sequence[0, len(self._prompt):].tolist())
        return super().propose(sequence, max_tokens, sampling, generator, policy)

    def _redraft(self, committed: list[int]) -> None:
        """A new hypothesis: the committed transcript + the fast decoder's continuation of it."""
        decoder: ARFastDecoder = self.fast_decoder  # type: ignore[assignment]
        with self._drafting_setup(self._prompt + committed):
            # Begin-suppression applies to the first token after the forced prompt only.
            if committed:
                decoder.begin_suppress_tokens = []
            rest = decoder.hypothesis(self._encoder_states, max_new_tokens=self.redraft_tokens, draft_cache=self._utterance_cache)[0]
        self.forwards += decoder.last_steps
        self.redrafts += 1
        stats = self.stats
        self.set_hypothesis(committed + rest)
        self.stats = stats
        self.offset, self.floor, self.misses, self._rejected, self._fresh = 0, len(committed), 0, False, True

    def observe(self, sequence: torch.LongTensor, verdict: Verdict, target_step: Any) -> None:
        self._fresh = False
        if self._last is not None:
            self._rejected = int(verdict.num_accepted[0]) < self._last[1]
        super().observe(sequence, verdict, target_step)


def attach_ar_fast_decoder(fast_decoder: ARFastDecoder, model: PreTrainedModel) -> ARFastDecoder:
    """Check that the fast decoder fits `model`, move it to the model's dtype and device (checkpoints ship
    in float16), then bind the target's embedding and head if it shares them."""
    check_ar_fast_decoder(fast_decoder, model)
    device = input_device(model)  # `model.device` reads "meta" when accelerate offloaded the model's first parameter
    if fast_decoder.shares_target_decoder:
        fast_decoder.share_target_embeddings(model)  # every module is the model's: nothing to move
        return fast_decoder
    if fast_decoder.dtype != model.dtype or fast_decoder.device != device:
        fast_decoder.to(dtype=model.dtype, device=device)
    if fast_decoder.shares_target_embeddings:
        if any(module.weight.device.type == "meta" for module in (model.get_decoder().embed_tokens, model.get_output_embeddings())):
            raise MMSpecError("this AR fast decoder shares the model's token embedding and output head, which the device "
                              "map offloads: keep model.decoder.embed_tokens and proj_out on a device, or use a CTC fast decoder")
        fast_decoder.share_target_embeddings(model)
    return fast_decoder


def check_ar_fast_decoder(fast_decoder: ARFastDecoder, model: PreTrainedModel) -> None:
    """One clear error when an AR fast decoder was not built for this model's encoder and vocabulary."""
    vocab = model_vocab_size(model)
    mine = model_vocab_size(fast_decoder)
    if mine != vocab:
        raise MMSpecError(f"the AR fast decoder predicts {mine} tokens but the model has {vocab}: it was trained for another model")
    width = getattr(model.config, "d_model", None)
    if width is not None and fast_decoder.config.d_model != width:
        raise MMSpecError(f"the AR fast decoder reads {fast_decoder.config.d_model}-wide encoder states, the model's are {width}")
    layers = getattr(model.config, "decoder_layers", None)
    if fast_decoder.shares_target_decoder and layers != fast_decoder.config.decoder_layers:
        raise MMSpecError(f"this self-drafter was made for a model with {fast_decoder.config.decoder_layers} decoder layers, "
                          f"the model has {layers}: it belongs to another model")
