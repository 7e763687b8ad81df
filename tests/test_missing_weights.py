"""A model folder whose config asks for more weights than it holds is an error, never randomly initialised layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmspec.errors import MMSpecError
from mmspec.speech.pipeline import load_whisper
from mmspec.zoo import load_causal_lm

from .speech.test_pipeline import tiny_processor
from .speech.tiny_whisper import tiny_whisper


def grow_layers(folder: Path, key: str, layers: int) -> None:
    config = json.loads((folder / "config.json").read_text())
    config[key] = layers
    (folder / "config.json").write_text(json.dumps(config))


def test_a_whisper_folder_with_layers_missing_from_its_weights_is_refused(tmp_path):
    tiny_whisper().save_pretrained(tmp_path)
    tiny_processor().save_pretrained(tmp_path)
    load_whisper("tiny", str(tmp_path))  # whole: loads
    grow_layers(tmp_path, "decoder_layers", 6)
    with pytest.raises(MMSpecError, match="weights for") as error:
        load_whisper("tiny", str(tmp_path))
    assert "decoder.layers.2" in str(error.value)


def test_a_causal_lm_folder_with_layers_missing_from_its_weights_is_refused(tmp_path, target):
    target.save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    grow_layers(tmp_path, "num_hidden_layers", 5)
    with pytest.raises(MMSpecError, match="weights for"):
        load_causal_lm(str(tmp_path))


def test_a_device_map_naming_a_module_the_model_lacks_is_refused(tmp_path):
    tiny_whisper().save_pretrained(tmp_path)
    tiny_processor().save_pretrained(tmp_path)
    whole = {"model.encoder": "cpu", "model.decoder": "cpu", "proj_out": "cpu"}
    load_whisper("tiny", str(tmp_path), device=None, device_map=whole)  # every module named: loads
    with pytest.raises(MMSpecError, match="model.decoder.layers.9"):
        load_whisper("tiny", str(tmp_path), device=None, device_map={**whole, "model.decoder.layers.9": "cpu"})


@pytest.mark.parametrize("damage", ["truncated", "lying header"])
def test_a_damaged_safetensors_file_is_one_error(tmp_path, target, damage):
    target.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    else:  # an 8-byte header length that points past a tiny "{}" header
        weights.write_bytes((8).to_bytes(8, "little") + b"{}      " + data[-64:])
    with pytest.raises(MMSpecError, match="cannot be read"):
        load_causal_lm(str(tmp_path))
