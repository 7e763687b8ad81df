"""A compact LlamaGen-style class-conditional autoregressive image transformer.

Architecture and parameter names follow LlamaGen's `autoregressive/models/gpt.py` (MIT,
FoundationVision/LlamaGen), so the state dict of an official class-conditional GPT checkpoint
(`c2i_B_256.pt`, `c2i_L_256.pt`, ...) loads into `LlamaGenForClassConditional` unchanged:

    tok_embeddings.weight                      [vocab_size, dim]
    cls_embedding.embedding_table.weight       [num_classes + 1, dim]   (last row: the null class)
    layers.{i}.attention.wqkv.weight           [(n_head + 2 n_kv_head) head_dim, dim]
    layers.{i}.attention.wo.weight             [dim, dim]
    layers.{i}.feed_forward.w1/w3.weight       [ffn, dim]    w2: [dim, ffn]   (SwiGLU)
    layers.{i}.attention_norm.weight, layers.{i}.ffn_norm.weight, norm.weight   (RMSNorm)
    output.weight                              [vocab_size, dim]

Sequence layout: position 0 holds the class embedding, position 1 + j holds image token j, and the
logits at position s predict image token s. Rotary embeddings are 2-D over the token grid (half of
each head's rotary pairs turn with the row, half with the column); the class position gets an
all-zero rotation table exactly as in LlamaGen (which zeroes its query and key), so outputs match
the official model.

The KV cache (`LlamaGenCache`) is our own small class with the transformers-style
`get_seq_length()` / `crop()` interface, so speculative loops roll it back by cropping.
Only class-conditional (c2i) models are implemented; LlamaGen's text-conditional variant (120
caption tokens from FLAN-T5) is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from mmspec.errors import MMSpecError


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


class LlamaGenConfig(PretrainedConfig):
    """Hyper-parameters under LlamaGen's `ModelArgs` names (dim, n_layer, n_head, ...).

    `block_size` is the number of image tokens (a square grid: 256 = 16 x 16).
    """

    model_type = "mmspec_llamagen"
    attribute_map = {"hidden_size": "dim", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}

    def __init__(
        self,
        vocab_size: int = 16384,
        dim: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        n_kv_head: int | None = None,
        multiple_of: int = 256,
        ffn_dim_multiplier: float | None = None,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        num_classes: int = 1000,
        class_dropout_prob: float = 0.1,
        cls_token_num: int = 1,
        block_size: int = 256,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.dim = dim
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_kv_head = n_kv_head
        self.multiple_of = multiple_of
        self.ffn_dim_multiplier = ffn_dim_multiplier
        self.rope_base = rope_base
        self.norm_eps = norm_eps
        self.initializer_range = initializer_range
        self.num_classes = num_classes
        self.class_dropout_prob = class_dropout_prob
        self.cls_token_num = cls_token_num
        self.block_size = block_size
        super().__init__(**kwargs)

    @property
    def grid_size(self) -> int:
        return int(round(self.block_size**0.5))

    @property
    def null_class(self) -> int:
        """The class id used for the unconditional rows of classifier-free guidance."""
        return self.num_classes

    def validate(self) -> None:
        if self.grid_size**2 != self.block_size:
            raise MMSpecError(f"block_size must be a square number of tokens, got {self.block_size}")
        if self.dim % self.n_head:
            raise MMSpecError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        if (self.dim // self.n_head) % 4:
            raise MMSpecError("2-D rotary embeddings need a head dimension divisible by 4")
        if self.cls_token_num != 1:
            raise MMSpecError("only class-conditional models (cls_token_num = 1) are supported")


# Presets of LlamaGen's class-conditional GPT sizes (`GPT_B`, `GPT_L`, ... in gpt.py).
GPT_SIZES = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-XXXL": dict(n_layer=48, n_head=40, dim=2560),
}


def rope_table_2d(grid_size: int, head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """(cos, sin) per sequence position: [cls_token_num + grid_size**2, head_dim // 2, 2].

    The first head_dim / 4 rotary pairs rotate with the row index, the next head_dim / 4 with the
    column index; class positions get zeros (LlamaGen's convention).
    """
    half = head_dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    angles = torch.outer(torch.arange(grid_size).float(), inv_freq)  # [grid, head_dim / 4]
    grid = torch.cat(
        [angles[:, None, :].expand(-1, grid_size, -1), angles[None, :, :].expand(grid_size, -1, -1)], dim=-1
    )  # [row, col, head_dim / 2]
    table = torch.stack([grid.cos(), grid.sin()], dim=-1).flatten(0, 1)
    return torch.cat([torch.zeros(cls_token_num, half, 2), table])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x [B, T, H, D] by table [T, D // 2, 2]."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[None, :, None, :, 0], table[None, :, None, :, 1]
    rotated = torch.stack(
        [pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], dim=-1
    )
    return rotated.flatten(3).type_as(x)


class LlamaGenCache:
    """Per-layer keys and values [B, n_kv_head, T, head_dim]; rolled back with `crop`."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def get_seq_length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    def update(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(key)
            self.values.append(value)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], key], dim=2)
            self.values[layer] = torch.cat([self.values[layer], value], dim=2)
        return self.keys[layer], self.values[layer]

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions; a negative value removes that many (transformers' rule)."""
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        if max_length < 0:
            raise ValueError("cannot crop more positions than the cache holds")
        self.keys = [k[:, :, :max_length] for k in self.keys]
        self.values = [v[:, :, :max_length] for v in self.values]

    def select_rows(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


class LabelEmbedder(nn.Module):
    """Class label -> one conditioning embedding; the extra last row is the null (unconditional) class."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)

    def forward(self, labels: torch.LongTensor) -> torch.Tensor:
        return self.embedding_table(labels)[:, None]


class FeedForward(nn.Module):
    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        hidden = int(2 * (4 * config.dim) / 3)
        if config.ffn_dim_multiplier is not None:
            hidden = int(config.ffn_dim_multiplier * hidden)
        hidden = find_multiple(hidden, config.multiple_of)
        self.w1 = nn.Linear(config.dim, hidden, bias=False)
        self.w3 = nn.Linear(config.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    def __init__(self, config: LlamaGenConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        self.head_dim = config.dim // config.n_head
        self.wqkv = nn.Linear(config.dim, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, cache: LlamaGenCache | None, mask: torch.Tensor | None):
        batch, length, dim = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([dim, kv, kv], dim=-1)
        q = apply_rope(q.view(batch, length, self.n_head, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(batch, length, self.n_kv_head, self.head_dim), rope).transpose(1, 2)
        v = v.view(batch, length, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        groups = self.n_head // self.n_kv_head
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and length > 1)
        return self.wo(out.transpose(1, 2).reshape(batch, length, dim))


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaGenConfig, layer: int) -> None:
        super().__init__()
        self.attention = Attention(config, layer)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, rope, cache, mask):
        h = x + self.attention(self.attention_norm(x), rope, cache, mask)
        return h + self.feed_forward(self.ffn_norm(h))


@dataclass
class LlamaGenOutput(ModelOutput):
    # `cache`, not `past_key_values`: transformers 5.24 renames that keyword on every ModelOutput.
    logits: torch.Tensor | None = None
    cache: LlamaGenCache | None = None
    loss: torch.Tensor | None = None


class LlamaGenForClassConditional(PreTrainedModel):
    """Class-conditional LlamaGen GPT. `forward(class_labels=..., input_ids=...)`:

    - `class_labels` [B] (prefill, or training): the class embedding goes first;
    - `input_ids` [B, T]: image tokens, appended after the class position or after the cache;
    - `labels` [B, T']: image tokens to predict (cross-entropy over the returned logits).
    Use `config.null_class` as the label of classifier-free guidance's unconditional rows.
    """

    config_class = LlamaGenConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    _no_split_modules = ["TransformerBlock"]

    def __init__(self, config: LlamaGenConfig) -> None:
        config.validate()
        super().__init__(config)
        self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self._rope: torch.Tensor | None = None
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Module:
        return self.tok_embeddings

    def get_output_embeddings(self) -> nn.Module:
        return self.output

    @property
    def rope(self) -> torch.Tensor:
        if self._rope is None or self._rope.device != self.device:
            c = self.config
            with torch.inference_mode(False):  # a normal tensor, usable later with autograd too
                self._rope = rope_table_2d(c.grid_size, c.dim // c.n_head, c.rope_base, c.cls_token_num).to(self.device)
        return self._rope

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        class_labels: torch.LongTensor | None = None,
        past_key_values: LlamaGenCache | None = None,
        use_cache: bool = False,
        labels: torch.LongTensor | None = None,
        return_dict: bool = True,
        **_: Any,
    ) -> LlamaGenOutput:
        parts = []
        if class_labels is not None:
            parts.append(self.cls_embedding(class_labels))
        if input_ids is not None:
            parts.append(self.tok_embeddings(input_ids))
        if not parts:
            raise MMSpecError("LlamaGen forward needs class_labels and/or input_ids")
        h = torch.cat(parts, dim=1)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if past == 0 and class_labels is None:
            raise MMSpecError("the first forward (empty cache) must include class_labels")
        length = h.shape[1]
        if past + length > self.config.cls_token_num + self.config.block_size:
            raise MMSpecError(
                f"sequence of {past + length} positions exceeds the model's {self.config.block_size} image tokens"
            )
        cache = past_key_values if past_key_values is not None else (LlamaGenCache() if use_cache else None)
        rope = self.rope[past : past + length]
        mask = None
        if past > 0:
            # New position i (absolute past + i) may attend to every key at absolute index <= past + i.
            mask = torch.arange(past + length, device=h.device)[None, :] <= (past + torch.arange(length, device=h.device))[:, None]
        for layer in self.layers:
            h = layer(h, rope, cache, mask)
        logits = self.output(self.norm(h)).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, -labels.shape[1] :].reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return LlamaGenOutput(logits=logits, cache=cache, loss=loss)

    @classmethod
    def from_llamagen_checkpoint(cls, path: str, config: LlamaGenConfig) -> "LlamaGenForClassConditional":
        """Load an official LlamaGen `.pt` GPT checkpoint (keys `model`, `module` or `state_dict`)."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("model", "module", "state_dict"):
            if isinstance(state, dict) and key in state and isinstance(state[key], dict):
                state = state[key]
                break
        state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}
        state = {k: v for k, v in state.items() if not k.endswith("freqs_cis") and "kv_cache" not in k}
        model = cls(config)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise MMSpecError(f"checkpoint does not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model.eval()


# The defaults of `tiny_llamagen` (LlamaGenConfig fields).
TINY_LLAMAGEN = dict(vocab_size=12, num_classes=3, dim=32, n_layer=2, n_head=2, multiple_of=8, initializer_range=0.02)


def tiny_llamagen(grid_size: int = 4, seed: int = 0, **config: Any) -> LlamaGenForClassConditional:
    """A random model small enough for unit tests: `TINY_LLAMAGEN` overridden by `config` (any LlamaGenConfig
    field; a large initializer_range gives peaked distributions), `grid_size` x `grid_size` image tokens,
    half as many key/value heads as heads unless `n_kv_head` is given."""
    torch.manual_seed(seed)
    settings = {**TINY_LLAMAGEN, **config}
    settings.setdefault("n_kv_head", max(1, settings["n_head"] // 2))
    return LlamaGenForClassConditional(LlamaGenConfig(block_size=grid_size * grid_size, **settings)).eval()
