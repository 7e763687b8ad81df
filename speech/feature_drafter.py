"""A feature drafter for Whisper: EAGLE's recipe on an encoder-decoder ASR model.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (arXiv 2401.15077):
the drafter autoregresses on the TARGET's top-layer features, not on tokens alone. Each drafter slot
reads the target's final hidden state f_j at position j and the embedding of the next token t_{j+1}
(already known), fuses them (`fc`, [f_j; e(t_{j+1})] -> d_model), runs ONE Whisper decoder layer
(self-attention over earlier slots, cross-attention over the encoder states, MLP) and the final layer
norm, and predicts f_{j+1}; the target's own output head (over a reduced drafting vocabulary,
FR-Spec) turns it into the draft t_{j+2}. Beyond the committed tokens the drafter feeds back its own
predicted features. For speech this is cheap and well informed: the slot hears the audio through
cross-attention and knows what the target was about to say through f_j.

The token embedding and the output head are the target's, bound at `bind` and never saved, so a
checkpoint holds the fusion, one layer, positions and a norm (about 5 MB in float16).

The target verifies every draft over its whole vocabulary: greedy output equals the target's own,
whatever the drafter predicts. Drafts are greedy (one-hot q), which keeps speculative sampling exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperDecoderLayer, WhisperPreTrainedModel

from ..drafters import Drafter, DraftView
from ..errors import MMSpecError
from ..types import Proposal, Verdict
from .lean_decoder import LeanDecoderState, LeanWhisperDecoder
from .target import encoder_outputs_of

FEATURE_DRAFTER_FOLDER = "feature_drafter"


def whisper_decoder_of(model: PreTrainedModel) -> nn.Module:
    """The `WhisperDecoder` of a Whisper model (`model.model.decoder`, seq2seq or causal alike)."""
    decoder = getattr(getattr(model, "model", None), "decoder", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(model, "proj_out"):
        raise MMSpecError(f"a Whisper feature drafter needs a Whisper model, got {type(model).__name__}")
    return decoder


class WhisperFeatureDrafterModel(WhisperPreTrainedModel):
    """The trainable part of a Whisper feature drafter: `fc`, `layers` (one `WhisperDecoderLayer`),
    `layer_norm`, `embed_positions`. Token embedding and output head are the target's (see `bind_target`).

    Extra config fields: `draft_vocab` (token ids the drafter projects onto; None: all) and
    `draft_tokens` (drafts per round by default).
    """

    config_class = WhisperConfig

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__(config)
        d = config.d_model
        self.fc = nn.Linear(2 * d, d)
        self.embed_positions = nn.Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList([WhisperDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)])
        self.layer_norm = nn.LayerNorm(d)
        self._target: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (embedding, head rows, ids)
        self.post_init()

    @classmethod
    def for_target(cls, target_model: PreTrainedModel, *, init_layer: int = -1, draft_vocab: list[int] | None = None,
                   draft_tokens: int = 6) -> "WhisperFeatureDrafterModel":
        """A fresh drafter sized for `target_model`: its positions, final norm and decoder layer `init_layer` copied."""
        decoder = whisper_decoder_of(target_model)
        config = WhisperConfig.from_dict(target_model.config.to_dict())
        config.decoder_layers = 1
        config.architectures = [cls.__name__]
        config.draft_vocab = None if draft_vocab is None else [int(t) for t in draft_vocab]
        config.draft_tokens = int(draft_tokens)
        model = cls(config).to(target_model.dtype)
        model.embed_positions.weight.data.copy_(decoder.embed_positions.weight.data)
        model.layer_norm.load_state_dict(decoder.layer_norm.state_dict())
        model.layers[0].load_state_dict(decoder.layers[init_layer].state_dict())
        return model

    def bind_target(self, target_model: PreTrainedModel) -> None:
        """Borrow the target's token embedding and output head (rows of `draft_vocab` only); move to the head's
        device and dtype (checkpoints ship in float16)."""
        decoder = whisper_decoder_of(target_model)
        if decoder.config.d_model != self.config.d_model or target_model.proj_out.out_features != self.config.vocab_size:
            raise MMSpecError(f"this feature drafter was made for a Whisper with d_model {self.config.d_model} and "
                              f"{self.config.vocab_size} tokens, not d_model {decoder.config.d_model} and "
                              f"{target_model.proj_out.out_features}")
        head = target_model.proj_out.weight
        vocab = self.config.draft_vocab
        ids = torch.arange(head.shape[0], device=head.device) if vocab is None else torch.tensor(vocab, device=head.device)
        self._target = (decoder.embed_tokens.weight, head if vocab is None else head[ids], ids)
        self.to(device=head.device, dtype=head.dtype)

    @property
    def bound(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._target is None:
            raise MMSpecError("bind the feature drafter to its target first (bind_target; WhisperFeatureDrafter binds it)")
        return self._target

    def fuse(self, features: torch.Tensor, tokens: torch.LongTensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        """Slot inputs [B, n, D] from target features [B, n, D] and the NEXT tokens [B, n], positions from `start`."""
        embedding = self.bound[0]
        scale = self.config.d_model ** 0.5 if self.config.scale_embedding else 1.0
        h = self.fc(torch.cat([features.to(self.fc.weight.dtype), F.embedding(tokens, embedding) * scale], dim=-1))
        positions = torch.arange(tokens.shape[1], device=tokens.device) + start
        return h + self.embed_positions.weight[positions]

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the drafting vocabulary of predicted features [..., D] (column i is `draft_vocab[i]`)."""
        return F.linear(hidden, self.bound[1])

    def runner(self) -> LeanWhisperDecoder:
        return LeanWhisperDecoder(self, nn.Identity(), head_weight=self.bound[1])

    def forward(self, features: torch.Tensor, tokens: torch.LongTensor, encoder_states: torch.Tensor) -> torch.Tensor:
        """Teacher-forced training pass: predicted features [B, L, D] for slots fed target `features` [B, L, D] and
        next `tokens` [B, L] over `encoder_states` [B, T, D] (right padding is harmless: attention is causal)."""
        runner = self.runner()
        state = runner.start(encoder_states.to(self.fc.weight.dtype))
        return runner.final_norm(runner.run_layers(state, self.fuse(features, tokens)))


class WhisperFeatureDrafter(Drafter):
    """Drafts `k` tokens a round from the target's features (see the module docstring). Batch of one.

    Bookkeeping: slot j of the drafter's cache consumed (feature of position j, token j + 1). After the
    target's prefill of the prompt the features of every prompt position are known; after a verification
    those of the positions it committed. `propose` first feeds every known slot not fed yet in one pass,
    then one slot per further draft on its own predicted features; `observe` crops the draft slots.
    """

    needs_target_hidden_states = True
    drafts_from_prompt = False
    vocab_size = None  # drafts through the target's own head: vocabularies always agree

    def __init__(self, model: WhisperFeatureDrafterModel | str | Path) -> None:
        if isinstance(model, (str, Path)):
            model = load_feature_drafter(model)
        if not isinstance(model, WhisperFeatureDrafterModel):
            raise MMSpecError(f"WhisperFeatureDrafter needs a WhisperFeatureDrafterModel, got {type(model).__name__}")
        self.model = model.eval()
        self.target: Any = None
        self.forwards = 0
        self._runner: LeanWhisperDecoder | None = None
        self._state: LeanDecoderState | None = None
        self._features: torch.Tensor | None = None  # [P, D] the target's features of positions 0..P-1
        self._true_slots = 0  # slots in the cache fed with target features (the rest are this round's drafts)

    def bind(self, target: Any) -> None:
        self.model.bind_target(target.model)
        self.target = target
        self._runner = self.model.runner()

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        sequence = view.sequence
        if self.target is None:
            raise MMSpecError("WhisperFeatureDrafter must be bound to a target (use it through SpeculativeDecoder)")
        if sequence.shape[0] != 1:
            raise MMSpecError("the Whisper feature drafter drafts one recording at a time; pass a batch of one")
        states = encoder_outputs_of(self.target.model, model_inputs).last_hidden_state
        self._state = self._runner.start(states.to(self.model.fc.weight.dtype))
        self._features, self._true_slots = None, 0

    def _require_features(self, step: Any) -> torch.Tensor:
        if step.hidden_states is None:
            raise MMSpecError("the feature drafter needs the target's hidden states (run it through SpeculativeDecoder)")
        return step.hidden_states[-1][0]  # the decoder's final-normed states of this forward's positions [n, D]

    def _slot(self, features: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        """Feed slots (features [n, D], next tokens [n]); the predicted feature of the last one [D]."""
        self.forwards += 1
        h = self.model.fuse(features[None], tokens[None], self._state.length)
        return self._runner.final_norm(self._runner.run_layers(self._state, h)[0, -1])

    def propose(self, view: DraftView) -> Proposal:
        sequence, length = view.sequence, view.sequence.shape[1]
        limit = self.model.config.max_target_positions - 1
        max_tokens = min(view.max_tokens, limit - length)
        if max_tokens <= 0:
            return Proposal.empty(sequence)
        # True slots first: slot j pairs the target's feature at j with committed token j + 1.
        new = slice(self._true_slots, length - 1)
        feature = self._slot(self._features[new], sequence[0, new.start + 1 : length])
        self._true_slots = length - 1
        ids = self.model.bound[2]
        drafts: list[torch.Tensor] = []
        for index in range(max_tokens):
            token = ids[self.model.draft_logits(feature).argmax()].to(sequence.device)
            drafts.append(token)
            if index + 1 < max_tokens:
                feature = self._slot(feature[None], token[None])
        return Proposal(tokens=torch.stack(drafts)[None].to(sequence.dtype))

    def observe(self, view: DraftView, verdict: Verdict | None, target_step: Any) -> None:
        """Take the target's features of the prompt; after a round, drop the draft slots and keep the target's
        features of the positions it committed."""
        if verdict is None:
            self._features = self._require_features(target_step)
            return
        LeanWhisperDecoder.truncate(self._state, self._true_slots)
        accepted = int(verdict.num_accepted[0])
        verified = self._require_features(target_step)  # newest committed token, then the drafts
        self._features = torch.cat([self._features, verified[: accepted + 1]])


def load_feature_drafter(folder: str | Path) -> WhisperFeatureDrafterModel:
    """A saved feature drafter, with one clear error for a missing or foreign folder."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise MMSpecError(f"no Whisper feature drafter in {str(folder)!r} (config.json not found)")
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        architectures = []
    if WhisperFeatureDrafterModel.__name__ not in architectures:
        raise MMSpecError(f"{str(folder)!r} holds no Whisper feature drafter (its config.json names "
                          f"{', '.join(map(str, architectures)) or 'no architecture'})")
    try:
        model = WhisperFeatureDrafterModel.from_pretrained(str(path))
    except Exception as err:  # wrong model type, missing or mismatched weights
        raise MMSpecError(f"could not load a Whisper feature drafter from {str(folder)!r}: "
                          f"{str(err).strip().splitlines()[0]}") from err
    return model.eval()
