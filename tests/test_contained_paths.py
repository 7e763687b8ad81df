"""Paths a model card or distillation metadata names must resolve inside the folder that holds it: an absolute
path or a `..` out of it is refused in one line, and nothing outside is opened."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.vision.distill_data import DISTILL_FORMAT, DistillDataset
from mmspec.zoo import entries, resolve

needs_zoo = pytest.mark.skipif(not any(e.name == "shapes-video-captioner" for e in entries()), reason="needs the zoo")


def card_folder(tmp_path: Path, spec: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "overlay.safetensors").write_bytes(b"")
    (folder / "zoo_card.json").write_text(json.dumps({"name": "evil", "derived_from": spec}))
    return folder


@needs_zoo
@pytest.mark.parametrize("spec", [
    {"overlay": "/etc/passwd"},
    {"overlay": "../../../../../../etc/passwd"},
    {"folder": "../../.."},
    {"folder": "/etc"},
    {"overlay": "overlay.safetensors", "parent_sha256": "0" * 64, "folders": ["../../.."]},
])
def test_a_card_naming_a_path_outside_its_folders_is_refused(tmp_path, spec):
    folder = card_folder(tmp_path, {"model": "shapes-video-captioner", **spec})
    with pytest.raises(MMSpecError, match="outside"):
        resolve(str(folder))


def data_folder(tmp_path: Path, shards: list) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "metadata.json").write_text(json.dumps({"format": DISTILL_FORMAT, "shards": shards}))
    return folder


@pytest.mark.parametrize("name", ["../../../../../../etc/passwd", "/etc/passwd", "../outside.pt"])
def test_distillation_shards_outside_the_data_folder_are_refused(tmp_path, name):
    torch.save([{"modality": "video", "features": torch.zeros(2, 4)}], tmp_path / "outside.pt")
    with pytest.raises(MMSpecError, match="outside"):
        DistillDataset(data_folder(tmp_path, [{"file": name, "num_traces": 1}]))


@pytest.mark.parametrize("shards", [[{"file": "shard.pt"}], ["shard.pt"], [{"file": 3}], {"file": "shard.pt"}])
def test_a_pickle_or_malformed_shard_is_one_error(tmp_path, shards):
    folder = data_folder(tmp_path, shards)
    (folder / "shard.pt").write_bytes(pickle.dumps({"not": "tensors"}))
    with pytest.raises(MMSpecError):
        DistillDataset(folder)
