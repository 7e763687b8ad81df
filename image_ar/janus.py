"""Janus / Janus-Pro text-to-image generation (transformers' `JanusForConditionalGeneration`) as a guided target.

Janus (Wu et al. 2024; Chen et al. 2025, "Janus-Pro") generates an image as a sequence of VQ codes
after a text prompt ending in the begin-of-image token. transformers' `generate(generation_mode="image")`
does it token by token:

    rows      = [prompt; unconditional prompt]       every prompt token but BOS and BOI -> pad
    embeds    = text embeddings of the rows, then `prepare_embeddings_for_image_generation(code)`
                (generation_embeddings + generation_aligner) for each image code
    hidden    = model.model.language_model(inputs_embeds, cache)
    logits    = model.model.generation_head(hidden)  guided: uncond + scale * (cond - uncond)

`JanusCFGTarget` runs the same computation over several positions per forward, with a
`DynamicCache` it crops on rejection, and exposes the `CFGTarget` interface, so every method runs on
it through the core loop unchanged (`image_ar.decode`: `GuidedImageTarget` over it).
Conditions are prompt indices: `start([i])` generates for `prompts[i]`.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from mmspec.cached_model import cache_argument, output_cache
from mmspec.errors import MMSpecError
from mmspec.sampling import SamplingConfig

from .methods import MethodConfig, MethodRunner
from .target import CFGTarget, ImageTokensOutput

JANUS_GUIDANCE_SCALE = 5.0  # Janus' default when the generation config sets none

class JanusCFGTarget(CFGTarget):
    """A `JanusForConditionalGeneration` plus a KV cache, seen through classifier-free guidance.

    Args:
        model: the Janus model.
        prompts: token ids of each text prompt (1-D each), already formatted for image generation
            (the processor's `generation_mode="image"` template, ending with the BOI token); may be
            left empty and given later with `set_prompts`.
        guidance_scale: CFG scale (None: the model's generation config, as Janus' own `generate` reads
            it, else Janus' default 5).
        bos_token_id, boi_token_id, pad_token_id: default to the model's generation config, as
            transformers' image `generate` reads them (`generation_kwargs["boi_token_id"]`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        prompts: Sequence[torch.Tensor | Sequence[int]] = (),
        guidance_scale: float | None = None,
        *,
        bos_token_id: int | None = None,
        boi_token_id: int | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        if not all(hasattr(getattr(model, "model", None), name) for name in ("generation_head", "vqmodel", "language_model")):
            raise MMSpecError(f"{type(model).__name__} is not a Janus image generator (JanusForConditionalGeneration)")
        if guidance_scale is None:
            shipped = getattr(getattr(model, "generation_config", None), "guidance_scale", None)
            guidance_scale = JANUS_GUIDANCE_SCALE if shipped is None else float(shipped)
        super().__init__(model, guidance_scale)
        self.prompts: list[torch.LongTensor] = []
        if len(prompts):
            self.set_prompts(prompts)
        generation = model.generation_config
        extra = getattr(generation, "generation_kwargs", None) or {}
        self.bos = generation.bos_token_id if bos_token_id is None else bos_token_id
        self.boi = extra.get("boi_token_id", getattr(generation, "boi_token_id", None)) if boi_token_id is None else boi_token_id
        self.pad = generation.pad_token_id if pad_token_id is None else pad_token_id
        if self.uses_guidance and self.pad is None:
            raise MMSpecError("classifier-free guidance needs a pad token to blank the unconditional prompt; pass pad_token_id")
        self._prompt_length = 0

    def set_prompts(self, prompts: Sequence[torch.Tensor | Sequence[int]]) -> None:
        """Replace the prompts the condition indices refer to (a pipeline call gives its own to `for_call`)."""
        encoded = [torch.as_tensor(p, dtype=torch.long, device=self.model.device).reshape(-1) for p in prompts]
        if not encoded or any(p.numel() == 0 for p in encoded):
            raise MMSpecError("Janus needs at least one non-empty prompt")
        self.prompts = encoded

    def for_call(self, guidance_scale: float | None = None,
                 prompts: Sequence[torch.Tensor | Sequence[int]] | None = None) -> "JanusCFGTarget":
        """This target for one call: the call's guidance scale and prompts (None: this one's), its own cache."""
        call = copy.copy(self)
        call.guidance_scale = self.guidance_scale if guidance_scale is None else float(guidance_scale)
        call.cache, call.batch, call.forwards, call._prompt_length = None, 0, 0, 0
        if call.uses_guidance and call.pad is None:
            raise MMSpecError("classifier-free guidance needs a pad token to blank the unconditional prompt; pass pad_token_id")
        if prompts is not None:
            call.set_prompts(prompts)
        return call

    # ------------------------------------------------------------------ sizes

    @property
    def vocab_size(self) -> int:
        return int(self.config.vq_config.num_embeddings)

    @property
    def grid_size(self) -> int:
        return int(self.config.vq_config.num_patches)

    @property
    def num_tokens(self) -> int:
        return self.grid_size**2

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length() - self._prompt_length

    # ------------------------------------------------------------------ forwards

    def unconditional(self, prompt: torch.LongTensor) -> torch.LongTensor:
        """transformers' rule: keep BOS and BOI, blank every other prompt token with pad."""
        keep = prompt == self.bos
        if self.boi is not None:
            keep |= prompt == self.boi
        return prompt.masked_fill(~keep, self.pad)

    def _prompt_rows(self, condition: torch.Tensor | Sequence[int] | int) -> torch.LongTensor:
        index = torch.as_tensor(condition, device="cpu").reshape(-1)  # a host-side prompt index
        if index.numel() != 1:
            raise MMSpecError("Janus targets decode one prompt at a time (batch size 1)")
        i = int(index[0])
        if not 0 <= i < len(self.prompts):
            raise MMSpecError(f"prompt index {i} is out of range: {len(self.prompts)} prompt(s)")
        prompt = self.prompts[i].to(self.model.device)[None]
        return torch.cat([prompt, self.unconditional(prompt)]) if self.uses_guidance else prompt

    def _image_embeds(self, tokens: torch.LongTensor) -> torch.Tensor:
        return self.model.prepare_embeddings_for_image_generation(self._rows(tokens))

    def _run(self, embeds: torch.Tensor, cache: DynamicCache | None) -> tuple[torch.Tensor, Any]:
        language_model = self.model.model.language_model
        out = language_model(inputs_embeds=embeds, **{cache_argument(language_model): cache}, use_cache=cache is not None)
        return out.last_hidden_state, output_cache(out)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._guide(self.model.model.generation_head(hidden).float())

    @torch.no_grad()
    def start(self, class_labels: Any, tokens: torch.LongTensor | None = None) -> torch.Tensor:
        """Prefill prompt `class_labels` (an index) plus optional image tokens [1, T]: guided logits [1, 1 + T, V]."""
        rows = self._prompt_rows(class_labels)
        embeds = self.model.get_input_embeddings()(rows)
        if tokens is not None:
            embeds = torch.cat([embeds, self._image_embeds(tokens).to(embeds.dtype)], dim=1)
        hidden, self.cache = self._run(embeds, DynamicCache(config=self.config.get_text_config()))
        self.forwards += 1
        self.batch = 1
        self._prompt_length = rows.shape[1]
        return self._logits(hidden[:, rows.shape[1] - 1 :])

    @torch.no_grad()
    def extend(self, tokens: torch.LongTensor) -> torch.Tensor:
        if self.cache is None:
            raise RuntimeError("extend() called before start()")
        hidden, self.cache = self._run(self._image_embeds(tokens), self.cache)
        self.forwards += 1
        return self._logits(hidden)

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise RuntimeError(f"cannot truncate a cache of {self.length} image tokens to {length}")
        excess = self.length - length
        if excess:
            self.cache.crop(-excess)  # transformers 5.x crops by a negative count of removed positions

    @torch.no_grad()
    def full_logits(self, class_labels: Any, tokens: torch.LongTensor) -> torch.Tensor:
        """Guided logits for prompt + tokens [N, T] without a cache (one sequence at a time): [N, 1 + T, V]."""
        labels = torch.as_tensor(class_labels, device="cpu").reshape(-1)  # host-side prompt indices
        rows = []
        for index, row_tokens in zip(labels.tolist(), tokens):
            prompt = self._prompt_rows(index)
            embeds = torch.cat([self.model.get_input_embeddings()(prompt), self._image_embeds(row_tokens[None])], dim=1)
            hidden, _ = self._run(embeds, None)
            rows.append(self._logits(hidden[:, prompt.shape[1] - 1 :]))
        return torch.cat(rows)

    # ------------------------------------------------------------------ codes <-> pixels

    def codebook_embeddings(self) -> torch.Tensor:
        """The l2-normalised code vectors Janus' VQ decoder looks up [V, D] (LANTERN / GSD latent distances)."""
        return F.normalize(self.model.model.vqmodel.quantize.embedding.weight.detach().float(), p=2, dim=-1)

    @torch.no_grad()
    def token_embeddings(self) -> torch.Tensor:
        """What the language model reads for every image code [V, hidden]: generation_embeddings then
        generation_aligner (`prepare_embeddings_for_image_generation`), GSD's latent space."""
        codes = torch.arange(self.vocab_size, device=self.model.device)
        return self.model.prepare_embeddings_for_image_generation(codes[None])[0].float()

    @torch.no_grad()
    def decode(self, tokens: torch.LongTensor) -> torch.Tensor:
        """Token grids [B, h, w] -> pixels [B, 3, H, W] in about [-1, 1] through Janus' VQ decoder."""
        if tokens.dim() != 3 or tokens.shape[1:] != (self.grid_size, self.grid_size):
            raise MMSpecError(f"expected token grids [B, {self.grid_size}, {self.grid_size}], got {tuple(tokens.shape)}")
        return self.model.model.vqmodel.decode(tokens.flatten(1)).float()


def janus_generate(
    model: PreTrainedModel,
    prompts: Sequence[torch.Tensor | Sequence[int]],
    *,
    method: str = "sjd",
    guidance_scale: float | None = None,
    sampling: SamplingConfig = SamplingConfig(do_sample=True),
    generator: torch.Generator | None = None,
    **options: Any,
) -> ImageTokensOutput:
    """One image per prompt with a training-free method (ar, sjd, gsd, lantern on Jacobi drafts).

    `guidance_scale` None: the model's generation config, else 5 (as Janus' own `generate`).

    `options` are `MethodConfig` fields (window, init, lantern_delta, gsd_window, ...). Decode the
    returned grids with `JanusCFGTarget(model, prompts).decode(out.tokens)`.
    """
    if method == "sd":
        raise MMSpecError("method 'sd' needs a drafter sharing Janus' codebook; use ar, sjd, gsd or lantern")
    target = JanusCFGTarget(model, guidance_scale=guidance_scale)
    target.set_prompts(prompts)
    runner = MethodRunner(target, codebook=target.codebook_embeddings())
    try:
        config = MethodConfig(method=method, drafts="jacobi", **options)
    except TypeError as error:
        raise MMSpecError(f"unknown method option: {error}") from None
    return runner.run(config, list(range(len(target.prompts))), sampling=sampling, generator=generator)
