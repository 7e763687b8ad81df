"""The fast decoder of Hybrid Decoding: a light non-autoregressive CTC head on the frozen encoder.

Lim et al., "Hybrid Decoding: Rapid Pass and Selective Detailed Correction for Sequence Models"
(arXiv 2508.19671): a lightweight decoder attached to the pretrained encoder of an attention
encoder-decoder ASR model produces the whole hypothesis in one pass; the big decoder verifies it.
Only the added module is trained; the big model is not touched.

Here the fast decoder is: a linear projection of the encoder states, an optional learned
upsampling (CTC needs at least as many frames as output tokens plus repeats; Whisper's encoder
gives 50 frames per second, plenty, but a toy model with a short window may not), one transformer
encoder layer, and a linear layer over the target's vocabulary plus one CTC blank (the last id).
Greedy CTC decoding (argmax per frame, collapse repeats, drop blanks) turns it into token ids of
the target's own vocabulary, so no mapping between tokenizers is needed. On a real Whisper the full
vocabulary (51864 ids) makes the head the costliest part of the pass, so a `draft_vocab` (the most
frequent ids, FR-Spec style) can replace it: the head then predicts those ids plus the blank, and
the target still verifies over its whole vocabulary (lossless either way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import ModelOutput

from ..cached_model import model_vocab_size
from ..errors import MMSpecError

MODEL_TYPE = "mmspec_ctc_fast_decoder"


class CTCFastDecoderConfig(PretrainedConfig):
    """Configuration of `CTCFastDecoder`.

    Args:
        vocab_size: the target's vocabulary (logit width); the CTC blank is id `vocab_size`.
        encoder_hidden_size: width of the target encoder's output (Whisper's d_model).
        hidden_size, num_attention_heads, intermediate_size, num_layers: the small transformer.
        upsample: frames produced per encoder frame (>= 1).
        max_positions: learned positional embeddings over the (upsampled) frames.
        dropout: used in training only.
        draft_vocab: the token ids the head predicts (None: the whole vocabulary); the blank follows them.
    """

    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 51865,
        encoder_hidden_size: int = 384,
        hidden_size: int = 256,
        num_attention_heads: int = 4,
        intermediate_size: int = 1024,
        num_layers: int = 1,
        upsample: int = 1,
        max_positions: int = 1500,
        dropout: float = 0.1,
        draft_vocab: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.encoder_hidden_size = encoder_hidden_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.num_layers = num_layers
        self.upsample = upsample
        self.max_positions = max_positions
        self.dropout = dropout
        self.draft_vocab = check_draft_vocab(draft_vocab, vocab_size)
        super().__init__(**kwargs)

    @property
    def blank_id(self) -> int:
        """The blank's column of the head: after the vocabulary it predicts."""
        return len(self.draft_vocab) if self.draft_vocab else self.vocab_size


@dataclass
class CTCFastDecoderOutput(ModelOutput):
    """logits [B, T', V + 1] (V: the draft vocabulary's size when there is one; blank last); loss when labels were given."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class CTCFastDecoder(PreTrainedModel):
    """Non-autoregressive CTC head over a frozen encoder's output (see the module docstring)."""

    config_class = CTCFastDecoderConfig
    base_model_prefix = "fast_decoder"
    main_input_name = "encoder_hidden_states"

    def __init__(self, config: CTCFastDecoderConfig) -> None:
        super().__init__(config)
        if config.upsample < 1:
            raise MMSpecError(f"upsample must be >= 1, got {config.upsample}")
        self.input_proj = nn.Linear(config.encoder_hidden_size, config.hidden_size * config.upsample)
        self.positions = nn.Embedding(config.max_positions, config.hidden_size)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model=config.hidden_size,
                nhead=config.num_attention_heads,
                dim_feedforward=config.intermediate_size,
                dropout=config.dropout,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.blank_id + 1)
        self.post_init()
        self._column = {token: column for column, token in enumerate(config.draft_vocab or [])}

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def blank_id(self) -> int:
        return self.config.blank_id

    def forward(
        self,
        encoder_hidden_states: torch.Tensor,
        labels: torch.LongTensor | None = None,
        label_lengths: torch.LongTensor | None = None,
        **_: Any,
    ) -> CTCFastDecoderOutput:
        """encoder_hidden_states [B, T, D_enc] -> logits [B, T * upsample, V + 1].

        labels [B, L] (padded with -100): head columns (`label_columns`: the target's token ids, or
        their places in the draft vocabulary); the CTC loss is averaged over the batch, each
        utterance's loss divided by its label length (torch's "mean").
        """
        batch, frames, _ = encoder_hidden_states.shape
        hidden = self.input_proj(encoder_hidden_states.to(self.input_proj.weight.dtype))
        hidden = hidden.view(batch, frames * self.config.upsample, self.config.hidden_size)
        length = hidden.shape[1]
        if length > self.config.max_positions:
            raise MMSpecError(
                f"the fast decoder reads at most {self.config.max_positions} frames, got {length} "
                f"({frames} encoder frames x upsample {self.config.upsample})"
            )
        hidden = hidden + self.positions.weight[:length]
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.head(self.norm(hidden))
        loss = None
        if labels is not None:
            loss = ctc_loss(logits, labels, self.blank_id, label_lengths)
        return CTCFastDecoderOutput(loss=loss, logits=logits)

    @torch.inference_mode()
    def hypothesis(self, encoder_hidden_states: torch.Tensor) -> list[list[int]]:
        """Greedy CTC hypotheses, one list of target token ids per utterance."""
        logits = self(encoder_hidden_states).logits
        paths = [ctc_greedy_decode(row, self.blank_id) for row in logits.argmax(-1)]
        vocab = self.config.draft_vocab
        return [[vocab[c] for c in path] for path in paths] if vocab else paths

    def label_columns(self, tokens: Sequence[int]) -> list[int]:
        """The head columns of a transcript's token ids; ids outside the draft vocabulary are left out
        (the fast decoder learns to skip what it cannot write; the target's verification puts it back)."""
        if not self.config.draft_vocab:
            return [int(t) for t in tokens]
        return [self._column[t] for t in tokens if t in self._column]

    @classmethod
    def for_target(cls, target_model: PreTrainedModel, **config_kwargs: Any) -> "CTCFastDecoder":
        """A fresh fast decoder sized for `target_model`'s encoder and vocabulary."""
        encoder_width = getattr(target_model.config, "d_model", None) or target_model.config.hidden_size
        max_source = getattr(target_model.config, "max_source_positions", 1500)
        upsample = config_kwargs.get("upsample", 1)
        config_kwargs.setdefault("max_positions", max_source * upsample)
        config = CTCFastDecoderConfig(
            vocab_size=model_vocab_size(target_model), encoder_hidden_size=encoder_width, **config_kwargs
        )
        return cls(config)


AutoConfig.register(MODEL_TYPE, CTCFastDecoderConfig, exist_ok=True)


def check_draft_vocab(draft_vocab: Sequence[int] | None, vocab_size: int) -> list[int] | None:
    """A reduced drafting vocabulary as a list of distinct ids inside the vocabulary (None: the whole one)."""
    if draft_vocab is None:
        return None
    ids = [int(t) for t in draft_vocab]
    if not ids:
        raise MMSpecError("the draft vocabulary is empty")
    if len(set(ids)) != len(ids):
        raise MMSpecError("the draft vocabulary lists a token id twice")
    if not all(0 <= t < vocab_size for t in ids):
        raise MMSpecError(f"the draft vocabulary holds token ids outside 0..{vocab_size - 1}")
    return ids


def ctc_greedy_decode(frame_ids: torch.Tensor | Sequence[int], blank_id: int) -> list[int]:
    """Best-path CTC decoding of per-frame argmax ids [T]: collapse repeats, then drop blanks."""
    ids = frame_ids.tolist() if isinstance(frame_ids, torch.Tensor) else list(frame_ids)
    out: list[int] = []
    previous = None
    for token in ids:
        if token != previous and token != blank_id:
            out.append(int(token))
        previous = token
    return out


def ctc_loss(logits: torch.Tensor, labels: torch.LongTensor, blank_id: int, label_lengths: torch.LongTensor | None = None) -> torch.Tensor:
    """CTC loss of logits [B, T, V + 1] against labels [B, L] padded with -100 (or with explicit lengths)."""
    if label_lengths is None:
        label_lengths = (labels >= 0).sum(dim=1)
    log_probs = logits.float().log_softmax(-1).transpose(0, 1)  # [T, B, C]
    input_lengths = torch.full((logits.shape[0],), logits.shape[1], dtype=torch.long, device=logits.device)
    targets = labels.clamp(min=0)
    return nn.functional.ctc_loss(log_probs, targets, input_lengths, label_lengths, blank=blank_id, zero_infinity=True)


def target_encoder_states(target_model: PreTrainedModel, input_features: torch.Tensor) -> torch.Tensor:
    """The frozen target encoder's output [B, T, D] (no gradient)."""
    with torch.no_grad():
        return target_model.get_encoder()(input_features, return_dict=True).last_hidden_state


def distillation_labels(target_model: PreTrainedModel, input_features: torch.Tensor, max_new_tokens: int = 128) -> list[int]:
    """The target's own greedy transcript of one clip [1, mel bins, frames], as training labels.

    Token ids without the forced prompt and without end-of-text (what the fast decoder must draft).
    Decoded through `WhisperTarget`, i.e. exactly the transcript Whisper's greedy `generate` gives.
    """
    from ..decoding import speculative_generate
    from ..drafters import NoDrafter
    from .target import WhisperTarget

    target = WhisperTarget(target_model)
    inputs: dict[str, Any] = {"input_features": input_features}
    prompt = target.prompt_ids(inputs)
    limit = target.max_new_tokens_for(prompt.shape[1], max_new_tokens)
    out = speculative_generate(target, NoDrafter(), None, max_new_tokens=limit, decoder_input_ids=prompt, **inputs)
    tokens = out.sequences[0, prompt.shape[1]:].tolist()
    eos = target_model.generation_config.eos_token_id
    stops = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    while tokens and tokens[-1] in stops:
        tokens.pop()
    return tokens
