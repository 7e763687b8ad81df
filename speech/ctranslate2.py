"""Read CTranslate2 Whisper checkpoints (faster-whisper folders) into transformers' Whisper, offline.

    model, processor = load_ct2_whisper("path/to/faster-whisper-folder")   # model.bin, config.json, tokenizer.json

A faster-whisper folder holds `model.bin` (CTranslate2's own binary format), `config.json`
(generation settings: suppressed ids, alignment heads, language ids) and `tokenizer.json`.
Only numpy reads the file; CTranslate2 itself is not needed.

The binary layout (CTranslate2's `ModelSpec` serialisation, binary version 6), little-endian:

    uint32 binary_version; string spec_name; uint32 spec_revision; uint32 num_variables
    per variable: string name; uint8 rank; uint32 dims[rank]; uint8 dtype; uint32 num_bytes; bytes
    uint32 num_aliases; per alias: string alias; string variable_name

where a string is a uint16 length (terminating NUL included) then the bytes. Rank-0 variables are
the spec's settings (activation, pre_norm, num_heads, ...). Every fact is checked while reading:
a file that does not add up, an unknown spec or revision, or quantized weights are refused with
one clear `MMSpecError` (int8 / int16 checkpoints would need CTranslate2's dequantisation, which
is not reproduced here: convert them again with `--quantization float16`).

Mapping onto `WhisperForConditionalGeneration` (the inverse of CTranslate2's Whisper converter):
self-attention stores fused q, k, v (`linear_0`, [3d, d]; its k bias must be zeros, transformers'
k projection has none) and the output (`linear_1`); cross-attention stores q (`linear_0`), fused
k, v (`linear_1`) and the output (`linear_2`); layer norms are gamma/beta; both position tables
are stored; the output projection is an alias of the token embedding (tied). Every transformers
parameter is filled and every CTranslate2 variable is used, or loading fails.

The tokenizer file lacks Whisper's 1501 timestamp tokens (<|0.00|> ... <|30.00|>); they are added
so the vocabulary matches the embedding (51864 for English-only models, 51865 multilingual).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MMSpecError, first_line
from .ct2_settings import checked_settings

CT2_MODEL_FILE = "model.bin"
SUPPORTED_BINARY_VERSIONS = (6,)
SUPPORTED_SPECS = {"WhisperSpec": (3,)}
# CTranslate2's DataType enum (include/ctranslate2/types.h).
DTYPES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
NUMPY_DTYPES = {"float32": np.float32, "int8": np.int8, "int16": np.int16, "int32": np.int32,
                "float16": np.float16, "bfloat16": np.uint16}
# CTranslate2's ActivationType enum -> transformers' activation name (Whisper uses exact GELU).
ACTIVATIONS = {0: "relu", 3: "gelu"}
TIMESTAMP_TOKENS = 1501  # <|0.00|> ... <|30.00|> in steps of 0.02 s
ENGLISH_ONLY_VOCAB = 51864


@dataclass
class CT2Checkpoint:
    """What a CTranslate2 `model.bin` holds: its header, named arrays (settings are 0-d) and aliases."""

    binary_version: int
    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def setting(self, name: str) -> int:
        value = self.variables.get(name)
        if value is None or value.ndim != 0:
            raise MMSpecError(f"the CTranslate2 checkpoint lacks the setting {name!r}")
        return int(value)


class _Reader:
    def __init__(self, data: Any, path: str) -> None:
        self.data, self.offset, self.path = data, 0, path

    def take(self, size: int) -> Any:
        if self.offset + size > len(self.data):
            raise MMSpecError(f"{self.path!r} is truncated: not a complete CTranslate2 model.bin")
        piece = self.data[self.offset:self.offset + size]
        self.offset += size
        return piece

    def number(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = bytes(self.take(self.number("H")))
        if not raw.endswith(b"\0"):
            raise MMSpecError(f"{self.path!r} is not a CTranslate2 model.bin (a name is not NUL-terminated)")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise MMSpecError(f"{self.path!r} is not a CTranslate2 model.bin (a name is not UTF-8)") from None


def read_ct2_checkpoint(path: str | os.PathLike) -> CT2Checkpoint:
    """Parse a CTranslate2 `model.bin`: header, every variable (float16 / float32 / bfloat16 arrays and
    integer settings) and the aliases. The file is memory-mapped; arrays are read-only views of it
    until converted."""
    path = str(path)
    try:
        with open(path, "rb") as handle:
            data = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError) as error:  # ValueError: mmap of an empty file
        raise MMSpecError(f"cannot read the CTranslate2 checkpoint {path!r}: {error}") from None
    reader = _Reader(data, path)
    version = reader.number("I")
    if version not in SUPPORTED_BINARY_VERSIONS:
        raise MMSpecError(f"{path!r}: CTranslate2 binary version {version} is not supported (this reader knows "
                          f"{', '.join(map(str, SUPPORTED_BINARY_VERSIONS))})")
    spec, revision = reader.string(), reader.number("I")
    if spec not in SUPPORTED_SPECS:
        raise MMSpecError(f"{path!r} holds a CTranslate2 {spec!r} model; only Whisper checkpoints (WhisperSpec) are supported")
    if revision not in SUPPORTED_SPECS[spec]:
        raise MMSpecError(f"{path!r}: {spec} revision {revision} is not supported (known: {SUPPORTED_SPECS[spec]})")
    checkpoint = CT2Checkpoint(version, spec, revision)
    for _ in range(reader.number("I")):
        name = reader.string()
        shape = tuple(reader.number("I") for _ in range(reader.number("B")))
        type_id, num_bytes = reader.number("B"), reader.number("I")
        if type_id not in DTYPES:
            raise MMSpecError(f"{path!r}: variable {name!r} has an unknown data type id {type_id}")
        dtype = DTYPES[type_id]
        itemsize = np.dtype(NUMPY_DTYPES[dtype]).itemsize
        if num_bytes != int(np.prod(shape, dtype=np.int64)) * itemsize:
            raise MMSpecError(f"{path!r}: variable {name!r} declares {num_bytes} bytes for shape {shape} of {dtype}")
        if name in checkpoint.variables:
            raise MMSpecError(f"{path!r}: variable {name!r} appears twice")
        array = np.frombuffer(reader.take(num_bytes), dtype=NUMPY_DTYPES[dtype]).reshape(shape)
        checkpoint.variables[name], checkpoint.dtypes[name] = array, dtype
    for _ in range(reader.number("I")):
        alias, target = reader.string(), reader.string()
        if target not in checkpoint.variables:
            raise MMSpecError(f"{path!r}: alias {alias!r} points to a missing variable {target!r}")
        checkpoint.aliases[alias] = target
    if reader.offset != len(data):
        raise MMSpecError(f"{path!r}: {len(data) - reader.offset} bytes left after the last alias: not a CTranslate2 model.bin")
    quantized = sorted(n for n, t in checkpoint.dtypes.items() if t in ("int8", "int16") and checkpoint.variables[n].ndim > 0)
    if quantized or any(n.endswith("weight_scale") for n in checkpoint.variables):
        raise MMSpecError(f"{path!r} is a quantized CTranslate2 checkpoint (e.g. {quantized[0] if quantized else 'weight_scale'}); "
                          "only float16 / float32 / bfloat16 weights are read: convert the model again with "
                          "--quantization float16")
    return checkpoint


def _float32(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # the upper half of a float32
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


class _Weights:
    """Float32 arrays by CTranslate2 name (aliases resolved), remembering which were used."""

    def __init__(self, checkpoint: CT2Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.checkpoint.variables or name in self.checkpoint.aliases

    def __call__(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        target = self.checkpoint.aliases.get(name, name)
        if target not in self.checkpoint.variables:
            raise MMSpecError(f"the CTranslate2 checkpoint lacks {name!r}")
        array = self.checkpoint.variables[target]
        if shape is not None and array.shape != shape:
            raise MMSpecError(f"CTranslate2 variable {name!r} has shape {array.shape}, expected {shape}")
        self.used.add(name)
        self.used.add(target)
        return _float32(array, self.checkpoint.dtypes[target])

    def setting(self, name: str) -> int:
        self.used.add(name)
        return self.checkpoint.setting(name)

    def unused(self) -> list[str]:
        return sorted((set(self.checkpoint.variables) | set(self.checkpoint.aliases)) - self.used)


def _count_layers(checkpoint: CT2Checkpoint, stack: str) -> int:
    layers = {int(n.split("/")[1].removeprefix("layer_")) for n in checkpoint.variables
              if re.match(rf"{stack}/layer_\d+/", n)}
    if layers != set(range(len(layers))) or not layers:
        raise MMSpecError(f"the CTranslate2 checkpoint's {stack} layers are not numbered 0..n-1: {sorted(layers)}")
    return len(layers)


def _split_zero_key_bias(bias: np.ndarray, parts: int, key_index: int, name: str) -> list[np.ndarray]:
    pieces = np.split(bias, parts)
    if np.any(pieces[key_index] != 0):
        raise MMSpecError(f"CTranslate2 variable {name!r} has a non-zero key bias; transformers' Whisper has none")
    return pieces


def _attention(weights: _Weights, prefix: str, out: str, d: int, state: dict[str, np.ndarray], cross: bool) -> None:
    """One attention block: fused CT2 projections -> transformers' q/k/v/out projections and layer norm."""
    state[f"{out}_layer_norm.weight"] = weights(f"{prefix}/layer_norm/gamma", (d,))
    state[f"{out}_layer_norm.bias"] = weights(f"{prefix}/layer_norm/beta", (d,))
    attn = f"{out}."
    if cross:
        state[f"{attn}q_proj.weight"] = weights(f"{prefix}/linear_0/weight", (d, d))
        state[f"{attn}q_proj.bias"] = weights(f"{prefix}/linear_0/bias", (d,))
        k, v = np.split(weights(f"{prefix}/linear_1/weight", (2 * d, d)), 2)
        _, v_bias = _split_zero_key_bias(weights(f"{prefix}/linear_1/bias", (2 * d,)), 2, 0, f"{prefix}/linear_1/bias")
        output = f"{prefix}/linear_2"
    else:
        q, k, v = np.split(weights(f"{prefix}/linear_0/weight", (3 * d, d)), 3)
        q_bias, _, v_bias = _split_zero_key_bias(weights(f"{prefix}/linear_0/bias", (3 * d,)), 3, 1, f"{prefix}/linear_0/bias")
        state[f"{attn}q_proj.weight"], state[f"{attn}q_proj.bias"] = q, q_bias
        output = f"{prefix}/linear_1"
    state[f"{attn}k_proj.weight"], state[f"{attn}v_proj.weight"], state[f"{attn}v_proj.bias"] = k, v, v_bias
    state[f"{attn}out_proj.weight"] = weights(f"{output}/weight", (d, d))
    state[f"{attn}out_proj.bias"] = weights(f"{output}/bias", (d,))


def _ffn(weights: _Weights, prefix: str, out: str, d: int, state: dict[str, np.ndarray]) -> int:
    state[f"{out}.final_layer_norm.weight"] = weights(f"{prefix}/layer_norm/gamma", (d,))
    state[f"{out}.final_layer_norm.bias"] = weights(f"{prefix}/layer_norm/beta", (d,))
    fc1 = weights(f"{prefix}/linear_0/weight")
    state[f"{out}.fc1.weight"], state[f"{out}.fc1.bias"] = fc1, weights(f"{prefix}/linear_0/bias", (fc1.shape[0],))
    state[f"{out}.fc2.weight"] = weights(f"{prefix}/linear_1/weight", (d, fc1.shape[0]))
    state[f"{out}.fc2.bias"] = weights(f"{prefix}/linear_1/bias", (d,))
    return int(fc1.shape[0])


def whisper_state_from_ct2(checkpoint: CT2Checkpoint) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """transformers state dict (float32 arrays) and the WhisperConfig fields a CTranslate2 Whisper implies.

    Raises `MMSpecError` when a setting differs from Whisper's (activation, pre-norm, ALiBi, embedding
    scaling), a shape does not fit, or a variable is left unused."""
    weights = _Weights(checkpoint)
    embeddings = weights("decoder/embeddings/weight")
    vocab, d = (int(n) for n in embeddings.shape)
    activation = weights.setting("decoder/activation")
    if activation not in ACTIVATIONS:
        raise MMSpecError(f"CTranslate2 activation id {activation} is not one transformers' Whisper supports")
    expected_settings = {"decoder/pre_norm": 1, "decoder/alibi": 0, "decoder/start_from_zero_embedding": 0}
    for name, value in expected_settings.items():
        if weights.setting(name) != value:
            raise MMSpecError(f"CTranslate2 setting {name} = {checkpoint.setting(name)}; Whisper needs {value}")
    # Alignment of the CTranslate2 translation decoder (not Whisper's word-timing heads, which come from config.json).
    weights.setting("decoder/alignment_layer")
    weights.setting("decoder/alignment_heads")
    state: dict[str, np.ndarray] = {}
    conv1 = weights("encoder/conv1/weight")
    if conv1.ndim != 3 or conv1.shape[0] != d or conv1.shape[2] != 3:
        raise MMSpecError(f"CTranslate2 encoder/conv1/weight has shape {conv1.shape}, expected ({d}, mel bins, 3)")
    state["model.encoder.conv1.weight"], state["model.encoder.conv1.bias"] = conv1, weights("encoder/conv1/bias", (d,))
    state["model.encoder.conv2.weight"] = weights("encoder/conv2/weight", (d, d, 3))
    state["model.encoder.conv2.bias"] = weights("encoder/conv2/bias", (d,))
    encoder_positions = weights("encoder/position_encodings/encodings")
    decoder_positions = weights("decoder/position_encodings/encodings")
    state["model.encoder.embed_positions.weight"] = encoder_positions
    state["model.decoder.embed_positions.weight"] = decoder_positions
    state["model.decoder.embed_tokens.weight"] = embeddings
    for stack in ("encoder", "decoder"):
        state[f"model.{stack}.layer_norm.weight"] = weights(f"{stack}/layer_norm/gamma", (d,))
        state[f"model.{stack}.layer_norm.bias"] = weights(f"{stack}/layer_norm/beta", (d,))
    ffn_dims = {}
    for stack in ("encoder", "decoder"):
        for i in range(_count_layers(checkpoint, stack)):
            prefix, out = f"{stack}/layer_{i}", f"model.{stack}.layers.{i}"
            _attention(weights, f"{prefix}/self_attention", f"{out}.self_attn", d, state, cross=False)
            if stack == "decoder":
                _attention(weights, f"{prefix}/attention", f"{out}.encoder_attn", d, state, cross=True)
            ffn_dims[stack] = _ffn(weights, f"{prefix}/ffn", out, d, state)
    tied = checkpoint.aliases.get("decoder/projection/weight") == "decoder/embeddings/weight"
    projection = weights("decoder/projection/weight", (vocab, d))
    if not tied:
        state["proj_out.weight"] = projection
    fields = dict(
        vocab_size=vocab, d_model=d, num_mel_bins=int(conv1.shape[1]),
        encoder_layers=_count_layers(checkpoint, "encoder"), decoder_layers=_count_layers(checkpoint, "decoder"),
        encoder_attention_heads=weights.setting("encoder/num_heads"), decoder_attention_heads=weights.setting("decoder/num_heads"),
        encoder_ffn_dim=ffn_dims["encoder"], decoder_ffn_dim=ffn_dims["decoder"],
        max_source_positions=int(encoder_positions.shape[0]), max_target_positions=int(decoder_positions.shape[0]),
        activation_function=ACTIVATIONS[activation], scale_embedding=bool(weights.setting("decoder/scale_embeddings")),
        tie_word_embeddings=tied,
    )
    unused = weights.unused()
    if unused:
        raise MMSpecError(f"the CTranslate2 checkpoint holds variables this reader does not map: {', '.join(unused[:5])}")
    return state, fields


# --- tokenizer and generation settings ---------------------------------------------------------

def timestamp_tokens() -> list[str]:
    return [f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMP_TOKENS)]


def whisper_tokenizer_from_ct2(folder: Path, vocab_size: int) -> Any:
    """A `WhisperTokenizerFast` from the folder's tokenizer.json, with the timestamp tokens added."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizerFast

    file = folder / "tokenizer.json"
    if not file.is_file():
        raise MMSpecError(f"{str(folder)!r} has no tokenizer.json beside model.bin")
    try:
        tokenizer = WhisperTokenizerFast(tokenizer_file=str(file), unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                         eos_token="<|endoftext|>", pad_token="<|endoftext|>", add_prefix_space=False)
    except Exception as error:  # noqa: BLE001 - any tokenizers failure means an unreadable tokenizer.json
        raise MMSpecError(f"cannot read {str(file)!r}: {error}") from None
    if len(tokenizer) + TIMESTAMP_TOKENS == vocab_size:
        tokenizer.add_tokens([AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=False)
                              for t in timestamp_tokens()])
    if len(tokenizer) != vocab_size:
        raise MMSpecError(f"{str(file)!r} holds {len(tokenizer)} tokens (timestamps included) but the model has {vocab_size}")
    vocabulary = folder / "vocabulary.txt"  # CTranslate2's own token list, when the converter wrote one
    if vocabulary.is_file():
        listed = vocabulary.read_text(encoding="utf-8").split("\n")
        listed = listed[:-1] if listed and listed[-1] == "" else listed
        if listed != tokenizer.convert_ids_to_tokens(list(range(vocab_size))):
            raise MMSpecError(f"{str(file)!r} and {str(vocabulary)!r} disagree on the tokens")
    return tokenizer


def _token_id(tokenizer: Any, token: str) -> int:
    index = tokenizer.convert_tokens_to_ids(token)
    if index is None or index == tokenizer.unk_token_id and token != tokenizer.unk_token:
        raise MMSpecError(f"the tokenizer lacks Whisper's {token} token")
    return int(index)


def whisper_generation_fields(tokenizer: Any, settings: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """Whisper's generation config fields from the tokenizer's special tokens and CTranslate2's config.json."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    multilingual = vocab_size > ENGLISH_ONLY_VOCAB
    fields: dict[str, Any] = dict(
        decoder_start_token_id=_token_id(tokenizer, "<|startoftranscript|>"),
        bos_token_id=_token_id(tokenizer, "<|endoftext|>"),
        eos_token_id=_token_id(tokenizer, "<|endoftext|>"),
        pad_token_id=_token_id(tokenizer, "<|endoftext|>"),
        no_timestamps_token_id=_token_id(tokenizer, "<|notimestamps|>"),
        prev_sot_token_id=_token_id(tokenizer, "<|startofprev|>"),
        suppress_tokens=[int(t) for t in settings.get("suppress_ids", [])],
        begin_suppress_tokens=[int(t) for t in settings.get("suppress_ids_begin", [])],
        alignment_heads=[[int(a), int(b)] for a, b in settings.get("alignment_heads", [])],
        is_multilingual=multilingual,
        max_initial_timestamp_index=50,
        return_timestamps=False,
    )
    if multilingual:
        vocabulary = tokenizer.get_vocab()  # older multilingual models lack the newest language tokens (<|yue|>)
        fields["lang_to_id"] = {f"<|{code}|>": int(vocabulary[f"<|{code}|>"]) for code in LANGUAGES
                                if f"<|{code}|>" in vocabulary}
        if not fields["lang_to_id"]:
            raise MMSpecError("a multilingual Whisper tokenizer without language tokens")
        fields["task_to_id"] = {task: _token_id(tokenizer, f"<|{task}|>") for task in ("transcribe", "translate")}
    return fields


# --- loading ----------------------------------------------------------------------------------

def is_ct2_whisper_folder(path: str | os.PathLike) -> bool:
    """A folder holding a CTranslate2 `model.bin` and a `config.json` that is not a transformers config."""
    folder = Path(path)
    if not (folder / CT2_MODEL_FILE).is_file() or not (folder / "config.json").is_file():
        return False
    try:
        return "model_type" not in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False


def load_ct2_whisper(folder: str | os.PathLike, dtype: Any = None, device: Any = "cpu") -> tuple[Any, Any]:
    """`(WhisperForConditionalGeneration, WhisperProcessor)` from a CTranslate2 Whisper folder (faster-whisper layout)."""
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    folder = Path(folder)
    if not (folder / CT2_MODEL_FILE).is_file():
        raise MMSpecError(f"{str(folder)!r} has no CTranslate2 {CT2_MODEL_FILE}")
    try:
        settings = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    except ValueError as error:
        raise MMSpecError(f"{str(folder / 'config.json')!r} is not valid JSON: {error}") from None
    settings = checked_settings(settings, folder / "config.json")
    checkpoint = read_ct2_checkpoint(folder / CT2_MODEL_FILE)
    state, fields = whisper_state_from_ct2(checkpoint)
    tokenizer = whisper_tokenizer_from_ct2(folder, fields["vocab_size"])
    generation = whisper_generation_fields(tokenizer, settings, fields["vocab_size"])
    try:  # header settings transformers cannot build (0 heads, heads that do not divide the width)
        config = WhisperConfig(
            **fields, decoder_start_token_id=generation["decoder_start_token_id"], bos_token_id=generation["bos_token_id"],
            eos_token_id=generation["eos_token_id"], pad_token_id=generation["pad_token_id"],
        )
        with torch.device("meta"):
            model = WhisperForConditionalGeneration(config)
    except (ValueError, ZeroDivisionError, OverflowError) as error:
        raise MMSpecError(f"{str(folder / CT2_MODEL_FILE)!r}: its settings make no Whisper model ({first_line(error)})") from None
    expected = set(model.state_dict())
    if not config.tie_word_embeddings:
        expected.add("proj_out.weight")
    elif "proj_out.weight" in expected:
        expected.discard("proj_out.weight")
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise MMSpecError(f"CTranslate2 -> transformers mapping incomplete: missing {missing[:5]}, unexpected {extra[:5]}")
    torch_dtype = dtype if dtype is not None else torch.float32
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(torch_dtype) for k, v in state.items()}
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    left = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left:
        raise MMSpecError(f"CTranslate2 -> transformers mapping left parameters unset: {left[:5]}")
    model.generation_config = GenerationConfig(**generation, max_length=config.max_target_positions)
    model.config.name_or_path = str(folder)
    model = model.to(device).eval()
    feature_extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    if feature_extractor.nb_max_frames != 2 * config.max_source_positions:
        raise MMSpecError(f"the encoder reads {2 * config.max_source_positions} frames; Whisper's feature extractor "
                          f"makes {feature_extractor.nb_max_frames}")
    return model, WhisperProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer)
