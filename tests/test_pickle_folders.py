"""A model folder whose weights (the ones transformers / diffusers would load) are a pickle is refused in one
line before torch.load is reached, even beside unrelated safetensors files or in a sub-folder."""

from __future__ import annotations

import pickle
import shutil

import pytest

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.zoo import entries, load_causal_lm

needs_zoo = pytest.mark.skipif(not any(e.name == "shapes-image-ar" for e in entries()), reason="needs the zoo")
PICKLE = pickle.dumps({"weight": "crafted"}, protocol=4)


def test_a_pickle_checkpoint_beside_an_unrelated_safetensors_file_is_refused(tmp_path, target):
    target.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "notes.safetensors")  # unrelated to the model's weights
    (tmp_path / "pytorch_model.bin").write_bytes(PICKLE)
    with pytest.raises(MMSpecError, match="pickle"):
        load_causal_lm(str(tmp_path))


@needs_zoo
@pytest.mark.parametrize("part", ["model.safetensors", "vq/model.safetensors"])
def test_an_image_folder_with_pickle_weights_is_refused_in_one_line(tmp_path, capsys, part):
    source = next(e.path for e in entries() if e.name == "shapes-image-ar")
    folder = tmp_path / "image-model"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("zoo_card.json"))
    weights = folder / part
    weights.unlink()
    weights.with_name("pytorch_model.bin").write_bytes(PICKLE)
    code = main(["generate-image", "red circle", "--model", str(folder), "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "pickle" in err.strip().splitlines()[-1], err
