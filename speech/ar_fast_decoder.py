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

Because it is a plain `WhisperForCausalLM` (saved with `save_pretrained`), the same weights also
serve as the assistant of transformers' assisted generation
(`whisper.generate(input_features, assistant_model=ar_fast_decoder)`), which hands the assistant
the target's encoder output (no second encoder), distil-whisper style.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, WhisperForCausalLM

from ..cached_model import model_vocab_size
from ..errors import MMSpecError
from ..policies import DraftLengthPolicy
from ..sampling import SamplingConfig
from ..types import Proposal, Verdict
from .hybrid import HybridDrafter
from .lean_decoder import LeanWhisperDecoder
from .target import encoder_outputs_of

AR_FAST_DECODER_FOLDER = "ar_fast_decoder"


class ARFastDecoder(WhisperForCausalLM):
    """A `WhisperForCausalLM` that drafts whole hypotheses (the `HypothesisSource` protocol of hybrid.py).

    Extra config fields (saved in config.json, defaults for use outside the pipeline):
      - `draft_prompt_ids`: the forced prompt it continues (the target's, as seen in training);
      - `draft_suppress_tokens`, `draft_begin_suppress_tokens`: the target's suppression lists.
    `ARHybridDrafter` replaces all three per utterance with the bound target's own values.
    """

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.prompt_ids: list[int] | None = None  # set per utterance by ARHybridDrafter
        self.suppress_tokens: list[int] | None = None
        self.begin_suppress_tokens: list[int] | None = None
        self.last_steps = 0  # decoder forwards of the last hypothesis (for honest drafter counts)

    def make_hybrid_drafter(self, **kwargs: Any) -> "ARHybridDrafter":
        """The hybrid drafter this fast decoder needs (see `hybrid.hybrid_drafter_for`)."""
        return ARHybridDrafter(self, **kwargs)

    @classmethod
    def for_target(cls, target_model: PreTrainedModel, *, num_layers: int = 1, init_layer: int = 0,
                   prompt_ids: Sequence[int] | None = None) -> "ARFastDecoder":
        """A fresh fast decoder sized for `target_model`, initialised from its decoder.

        Embeddings, learned positions, the final layer norm and the LM head are copied; each of the
        `num_layers` layers is a copy of the target's decoder layer `init_layer` (default 0, the first:
        it reads the raw token embeddings, as the fast decoder's only layer does; -1 is the last).
        """
        decoder = getattr(getattr(target_model, "model", None), "decoder", None)
        if decoder is None or not hasattr(decoder, "layers"):
            raise MMSpecError(f"{type(target_model).__name__} has no Whisper-style decoder to initialise the fast decoder from")
        layers = len(decoder.layers)
        if not -layers <= init_layer < layers:
            raise MMSpecError(f"init_layer {init_layer} is out of range: the target has {layers} decoder layers")
        if num_layers < 1:
            raise MMSpecError(f"num_layers must be >= 1, got {num_layers}")
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
        model = cls(config).to(dtype=target_model.dtype, device=target_model.device)
        source = decoder.state_dict()
        state = {k: v for k, v in source.items() if not k.startswith("layers.")}
        layer_prefix = f"layers.{init_layer % layers}."
        for i in range(num_layers):
            state.update({f"layers.{i}.{k[len(layer_prefix):]}": v for k, v in source.items() if k.startswith(layer_prefix)})
        model.model.decoder.load_state_dict(state, strict=True)
        with torch.no_grad():
            model.proj_out.weight.copy_(target_model.get_output_embeddings().weight)  # same tensor if tied
        model.generation_config = GenerationConfig(
            decoder_start_token_id=generation.decoder_start_token_id, eos_token_id=generation.eos_token_id,
            pad_token_id=generation.pad_token_id, bos_token_id=generation.bos_token_id,
        )
        return model.eval()

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
                   max_new_tokens: int | None = None, lean: bool = True) -> list[list[int]]:
        """Greedy hypotheses, one list of target token ids per utterance (no prompt, no end-of-text).

        encoder_hidden_states [B, T, D]: the target encoder's output. `prompt_ids`: the forced prompt
        to continue (default: the one set by `ARHybridDrafter`, else the config's). `max_new_tokens`:
        default as many as the decoder's positions allow after the prompt. `lean`: run the steps with
        `LeanWhisperDecoder` (same maths, a fraction of the per-call cost); False uses the
        transformers forward.
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
        suppress_ids = torch.tensor(suppress, dtype=torch.long, device=self.device)  # built once, not per step
        done = [False] * batch
        out: list[list[int]] = [[] for _ in range(batch)]
        step_logits = self._lean_steps(states) if lean else self._transformers_steps(states)
        step_input = tokens
        self.last_steps = 0
        for step in range(max(0, limit)):
            logits = step_logits(step_input).float()
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
                    out[row].append(token)
            if all(done):
                break
            step_input = choice[:, None]
        return out

    def _lean_steps(self, states: torch.Tensor) -> Callable[[torch.LongTensor], torch.Tensor]:
        runner = LeanWhisperDecoder(self.model.decoder, self.proj_out)
        state = runner.start(states)
        return lambda ids: runner.step(state, ids)

    def _transformers_steps(self, states: torch.Tensor) -> Callable[[torch.LongTensor], torch.Tensor]:
        cache = None

        def step(ids: torch.LongTensor) -> torch.Tensor:
            nonlocal cache
            result = self(input_ids=ids, encoder_outputs=states, past_key_values=cache, use_cache=True)
            cache = result.past_key_values
            return result.logits[:, -1]

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
    past the next likely correction is mostly thrown away).
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

    def prefill(self, sequence: torch.LongTensor, model_inputs: dict[str, Any]) -> None:
        self._prompt = [int(t) for t in sequence[0].tolist()]
        if self.target is not None:
            generation = self.target.model.generation_config
            self._suppression = (list(generation.suppress_tokens or []), list(generation.begin_suppress_tokens or []))
        self.redrafts, self._rejected = 0, False
        with self._drafting_setup(self._prompt):
            super().prefill(sequence, model_inputs)
        if self.redraft:
            self._encoder_states = encoder_outputs_of(self.target.model, model_inputs).last_hidden_state
        self.forwards += max(0, self.fast_decoder.last_steps - 1)  # the base class counted one

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
        if self.redraft and self._rejected and max_tokens > 0 and self._encoder_states is not None:
            self._redraft(sequence[0, len(self._prompt):].tolist())
        return super().propose(sequence, max_tokens, sampling, generator, policy)

    def _redraft(self, committed: list[int]) -> None:
        """A new hypothesis: the committed transcript + the fast decoder's continuation of it."""
        decoder: ARFastDecoder = self.fast_decoder  # type: ignore[assignment]
        with self._drafting_setup(self._prompt + committed):
            # Begin-suppression applies to the first token after the forced prompt only.
            if committed:
                decoder.begin_suppress_tokens = []
            rest = decoder.hypothesis(self._encoder_states, max_new_tokens=self.redraft_tokens)[0]
        self.forwards += decoder.last_steps
        self.redrafts += 1
        stats = self.stats
        self.set_hypothesis(committed + rest)
        self.stats = stats
        self.offset, self.floor, self.misses, self._rejected = 0, len(committed), 0, False

    def observe(self, sequence: torch.LongTensor, verdict: Verdict, target_step: Any) -> None:
        if self._last is not None:
            self._rejected = int(verdict.num_accepted[0]) < self._last[1]
        super().observe(sequence, verdict, target_step)


def check_ar_fast_decoder(fast_decoder: ARFastDecoder, model: PreTrainedModel) -> None:
    """One clear error when an AR fast decoder was not built for this model's encoder and vocabulary."""
    vocab = model_vocab_size(model)
    mine = model_vocab_size(fast_decoder)
    if mine != vocab:
        raise MMSpecError(f"the AR fast decoder predicts {mine} tokens but the model has {vocab}: it was trained for another model")
    width = getattr(model.config, "d_model", None)
    if width is not None and fast_decoder.config.d_model != width:
        raise MMSpecError(f"the AR fast decoder reads {fast_decoder.config.d_model}-wide encoder states, the model's are {width}")
