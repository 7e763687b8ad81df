"""Random models built from the real `config.json` of published checkpoints, shrunk, with the shipped
`generation_config.json` in force.

Each fixture folder beside this file holds a checkpoint's `config.json` and `generation_config.json`
(README.md says where each came from). `build(name)` loads the config with the model's own config
class, shrinks only layer counts, widths and image / patch counts (vocabulary sizes, special token ids,
rope and sliding-window settings and every generation setting stay as shipped), builds a random model,
saves it, puts the shipped `generation_config.json` into the saved folder and loads the folder back
with `from_pretrained`: the path a user's download takes, so `_from_model_config` and the other
loading rules of transformers apply exactly as they do for the real checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
from transformers import GenerationConfig, PreTrainedModel

FIXTURES = Path(__file__).parent

# A large initializer range makes a random LM's greedy choices change from token to token
# (with 0.02 a random model repeats one token), so the comparisons below mean something.
INIT = 0.3

# Small text widths; attention heads keep the shipped head_dim where rope settings depend on it.
TEXT = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def fixture(name: str) -> Path:
    return FIXTURES / name


def shipped_json(name: str, file: str = "config.json") -> dict[str, Any]:
    return json.loads((fixture(name) / file).read_text())


def shipped_generation_config(name: str) -> GenerationConfig:
    """The shipped generation config as transformers reads it (a fresh copy on every call)."""
    return GenerationConfig.from_pretrained(fixture(name))


def _set(config: Any, **values: Any) -> None:
    for key, value in values.items():
        setattr(config, key, value)


def _shrink_text(text: Any, **overrides: Any) -> None:
    values = dict(TEXT, initializer_range=INIT)
    values.update(overrides)
    _set(text, **values)
    if getattr(text, "head_dim", None) is not None and "head_dim" not in overrides:
        text.head_dim = text.hidden_size // text.num_attention_heads
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    if getattr(text, "max_window_layers", None) is not None:
        text.max_window_layers = min(text.max_window_layers, text.num_hidden_layers)


def shrink_llava(config: transformers.LlavaConfig) -> None:
    """CLIP 336 px / patch 14 -> 28 px: 4 patches (CLS dropped by the 'default' strategy) -> 4 image tokens."""
    _shrink_text(config.text_config)
    _set(config.vision_config, image_size=28, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
         num_attention_heads=2, projection_dim=32)
    config.image_seq_length = 4
    config.initializer_range = INIT


def shrink_next_video(config: transformers.LlavaNextVideoConfig) -> None:
    """CLIP 336 -> 56 px: 4 x 4 patches, average-pooled by the shipped stride 2 -> 4 tokens per frame."""
    _shrink_text(config.text_config)
    _set(config.vision_config, image_size=56, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
         num_attention_heads=2, projection_dim=32)
    config.spatial_pool_out_channels = 32
    config.image_grid_pinpoints = [[56, 112], [112, 56], [112, 112]]
    config.initializer_range = INIT


def shrink_onevision(config: transformers.LlavaOnevisionConfig) -> None:
    """SigLIP 384 -> 56 px (patch 14: 4 x 4), pooled 2 x 2 per video frame, + one newline token."""
    _shrink_text(config.text_config)
    _set(config.vision_config, image_size=56, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
         num_attention_heads=2)
    config.image_grid_pinpoints = [[56, 56], [56, 112], [112, 56], [112, 112]]
    config.initializer_range = INIT


def shrink_qwen2_vl(config: transformers.Qwen2VLConfig) -> None:
    """Keeps head_dim 128, so the shipped M-RoPE sections (16, 24, 24) still split it; a 1-block vision tower."""
    _shrink_text(config.text_config, hidden_size=256, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)
    _set(config.vision_config, depth=1, embed_dim=32, num_heads=2, hidden_size=256, initializer_range=INIT)
    config.initializer_range = INIT


def shrink_whisper(config: transformers.WhisperConfig) -> None:
    """Two thin layers each side and 64 mel frames (max_source_positions 32); vocabulary and ids as shipped."""
    _set(config, d_model=48, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
         encoder_ffn_dim=96, decoder_ffn_dim=96, num_hidden_layers=1, max_source_positions=32, init_std=0.5)


def shrink_janus(config: transformers.JanusConfig, image_tokens: int = 16) -> None:
    """4 x 4 image tokens (a 16 px VQ grid of 4 x 4), thin LM and towers; the 102400-token vocabulary,
    the 16384-code VQ codebook and the special ids stay as shipped."""
    _shrink_text(config.text_config, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4)
    _set(config.vision_config, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
         projection_dim=32, num_image_tokens=image_tokens, depth=1)
    _set(config.vq_config, latent_channels=32, base_channels=32, channel_multiplier=[1, 1], num_res_blocks=1,
         projection_dim=32, image_token_embed_dim=32, initializer_range=0.5)


# checkpoint -> (config class, model class, shrink); classes by name from transformers.
SPECS: dict[str, tuple[type, type, Callable[[Any], None]]] = {
    name: (getattr(transformers, f"{family}Config"), getattr(transformers, f"{family}ForConditionalGeneration"), shrink)
    for name, family, shrink in (
        ("llava-1.5-7b-hf", "Llava", shrink_llava),
        ("llava-onevision-qwen2-0.5b-ov-hf", "LlavaOnevision", shrink_onevision),
        ("LLaVA-NeXT-Video-7B-hf", "LlavaNextVideo", shrink_next_video),
        ("Qwen2-VL-2B-Instruct", "Qwen2VL", shrink_qwen2_vl),
        ("whisper-tiny", "Whisper", shrink_whisper),
        ("whisper-large-v3", "Whisper", shrink_whisper),
        ("Janus-Pro-1B", "Janus", shrink_janus),
    )
}


def shrunk_config(name: str) -> Any:
    config_class, _, shrink = SPECS[name]
    config = config_class.from_pretrained(fixture(name))
    shrink(config)
    return config


def _after_init(name: str, model: PreTrainedModel) -> None:
    if name.startswith("whisper"):
        with torch.no_grad():
            # pad = eos zeroes the end-of-text embedding row at init (padding_idx); a random row lets
            # transcripts end at varied lengths, as a trained model's do.
            embeddings = model.get_input_embeddings().weight
            eos = model.config.eos_token_id
            embeddings[eos] = torch.randn(embeddings.shape[1]) * model.config.init_std * 1.5


def build(name: str, seed: int = 0, generation_config: str | Path | None = None) -> PreTrainedModel:
    """A random shrunk model of checkpoint `name`, saved and loaded back with the shipped generation config."""
    config = shrunk_config(name)
    _, model_class, _ = SPECS[name]
    torch.manual_seed(seed)
    model = model_class(config).eval()
    _after_init(name, model)
    source = Path(generation_config) if generation_config is not None else fixture(name)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        shutil.copy(source / "generation_config.json", Path(folder) / "generation_config.json")
        return model_class.from_pretrained(folder).eval()
