"""Write small CTranslate2 Whisper folders for the reader's tests, as CTranslate2's Whisper converter lays them out.

`tiny_ct2_whisper()` builds a random tiny `WhisperForConditionalGeneration` whose vocabulary is a
byte-level tokenizer (256 bytes + Whisper's specials + 1501 timestamps); `write_ct2_folder()` writes
`model.bin` (binary version 6, WhisperSpec revision 3: fused q/k/v, zero k biases, one alias for the
output projection), `config.json` and `tokenizer.json` (without the timestamps, as faster-whisper
folders ship it). Options produce the malformed files the reader must refuse.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import WhisperConfig, WhisperForConditionalGeneration

SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
            "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
TYPE_IDS = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3, np.dtype(np.float16): 4}
BYTES = 256
EOT, SOT, NO_TIMESTAMPS = BYTES, BYTES + 1, BYTES + SPECIALS.index("<|notimestamps|>")
VOCAB = BYTES + len(SPECIALS) + 1501


def byte_tokenizer() -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    return tokenizer


def tiny_ct2_whisper(seed: int = 0) -> WhisperForConditionalGeneration:
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_source_positions=1500, max_target_positions=64, decoder_start_token_id=SOT,
                           pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT, init_std=0.2)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # random biases and norms, so that a swapped or dropped tensor shows in the logits
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                parameter.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    return model


def ct2_variables(model: WhisperForConditionalGeneration, dtype=np.float32) -> dict[str, np.ndarray]:
    """CTranslate2's WhisperSpec variables of `model` (the settings as 0-d integer arrays)."""
    s = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    d = model.config.d_model
    out: dict[str, np.ndarray] = {}

    def put(name: str, array: np.ndarray) -> None:
        out[name] = np.ascontiguousarray(array, dtype=dtype)

    def norm(prefix: str, source: str) -> None:
        put(f"{prefix}/gamma", s[f"{source}.weight"])
        put(f"{prefix}/beta", s[f"{source}.bias"])

    def self_attention(prefix: str, source: str, norm_source: str) -> None:
        norm(f"{prefix}/layer_norm", norm_source)
        put(f"{prefix}/linear_0/weight", np.concatenate([s[f"{source}.{p}_proj.weight"] for p in "qkv"]))
        put(f"{prefix}/linear_0/bias", np.concatenate([s[f"{source}.q_proj.bias"], np.zeros(d), s[f"{source}.v_proj.bias"]]))
        put(f"{prefix}/linear_1/weight", s[f"{source}.out_proj.weight"])
        put(f"{prefix}/linear_1/bias", s[f"{source}.out_proj.bias"])

    def cross_attention(prefix: str, source: str, norm_source: str) -> None:
        norm(f"{prefix}/layer_norm", norm_source)
        put(f"{prefix}/linear_0/weight", s[f"{source}.q_proj.weight"])
        put(f"{prefix}/linear_0/bias", s[f"{source}.q_proj.bias"])
        put(f"{prefix}/linear_1/weight", np.concatenate([s[f"{source}.k_proj.weight"], s[f"{source}.v_proj.weight"]]))
        put(f"{prefix}/linear_1/bias", np.concatenate([np.zeros(d), s[f"{source}.v_proj.bias"]]))
        put(f"{prefix}/linear_2/weight", s[f"{source}.out_proj.weight"])
        put(f"{prefix}/linear_2/bias", s[f"{source}.out_proj.bias"])

    def ffn(prefix: str, source: str) -> None:
        norm(f"{prefix}/layer_norm", f"{source}.final_layer_norm")
        put(f"{prefix}/linear_0/weight", s[f"{source}.fc1.weight"])
        put(f"{prefix}/linear_0/bias", s[f"{source}.fc1.bias"])
        put(f"{prefix}/linear_1/weight", s[f"{source}.fc2.weight"])
        put(f"{prefix}/linear_1/bias", s[f"{source}.fc2.bias"])

    for conv in ("conv1", "conv2"):
        put(f"encoder/{conv}/weight", s[f"model.encoder.{conv}.weight"])
        put(f"encoder/{conv}/bias", s[f"model.encoder.{conv}.bias"])
    for stack, layers in (("encoder", model.config.encoder_layers), ("decoder", model.config.decoder_layers)):
        put(f"{stack}/position_encodings/encodings", s[f"model.{stack}.embed_positions.weight"])
        norm(f"{stack}/layer_norm", f"model.{stack}.layer_norm")
        for i in range(layers):
            source = f"model.{stack}.layers.{i}"
            self_attention(f"{stack}/layer_{i}/self_attention", f"{source}.self_attn", f"{source}.self_attn_layer_norm")
            if stack == "decoder":
                cross_attention(f"{stack}/layer_{i}/attention", f"{source}.encoder_attn", f"{source}.encoder_attn_layer_norm")
            ffn(f"{stack}/layer_{i}/ffn", source)
    put("decoder/embeddings/weight", s["model.decoder.embed_tokens.weight"])
    settings = {"decoder/activation": np.int8(3), "decoder/alibi": np.int8(0), "decoder/alignment_heads": np.int16(1),
                "decoder/alignment_layer": np.int16(-1), "decoder/num_heads": np.int16(model.config.decoder_attention_heads),
                "decoder/pre_norm": np.int8(1), "decoder/scale_embeddings": np.int8(0),
                "decoder/start_from_zero_embedding": np.int8(0), "encoder/num_heads": np.int16(model.config.encoder_attention_heads)}
    out.update({k: np.asarray(v) for k, v in settings.items()})
    return out


def _string(text: str) -> bytes:
    raw = text.encode("utf-8") + b"\0"
    return struct.pack("<H", len(raw)) + raw


def model_bin(variables: dict[str, np.ndarray], aliases: dict[str, str], spec: str = "WhisperSpec", revision: int = 3,
              version: int = 6) -> bytes:
    parts = [struct.pack("<I", version), _string(spec), struct.pack("<I", revision), struct.pack("<I", len(variables))]
    for name in sorted(variables):
        value = variables[name]
        parts += [_string(name), struct.pack("<B", value.ndim), *(struct.pack("<I", n) for n in value.shape),
                  struct.pack("<B", TYPE_IDS[value.dtype]), struct.pack("<I", value.nbytes), value.tobytes()]
    parts.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        parts += [_string(alias), _string(target)]
    return b"".join(parts)


def write_ct2_folder(model: WhisperForConditionalGeneration, folder: Path, *, dtype=np.float32, spec: str = "WhisperSpec",
                     revision: int = 3, variables: dict[str, np.ndarray] | None = None, extra: bytes = b"") -> Path:
    """A faster-whisper style folder for `model` (`variables` replaces the converted ones, to plant faults)."""
    folder.mkdir(parents=True, exist_ok=True)
    variables = ct2_variables(model, dtype) if variables is None else variables
    blob = model_bin(variables, {"decoder/projection/weight": "decoder/embeddings/weight"}, spec, revision)
    (folder / "model.bin").write_bytes(blob + extra)
    settings = {"alignment_heads": [[1, 0], [1, 2]], "lang_ids": [BYTES + 2], "suppress_ids": [1, 2, 3],
                "suppress_ids_begin": [5, EOT]}
    (folder / "config.json").write_text(json.dumps(settings))
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    return folder
