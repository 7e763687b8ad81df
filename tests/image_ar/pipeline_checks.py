"""What the class-conditional and the Janus pipeline tests check alike: seeded generators, method options
that fit the tiny VQ, `mmspec generate-image` runs, and what the VAR and MAR pipeline tests assert alike
(outputs, saved folders, bad settings, dtype moves)."""

import json
import re

import numpy as np
import pytest
import torch
from diffusers.utils import BaseOutput
from PIL import Image

from mmspec.cli import main
from mmspec.errors import MMSpecError

# LANTERN's default k (the authors' 1000, for a 16384-code codebook) does not fit the tiny 12-code VQ.
OPTIONS = {"lantern": {"lantern_k": 4}}
# Stats every image method reports in `generate-image --json`.
STATS = {"new_tokens", "target_forwards", "step_compression", "mean_accepted_length", "wall_time_s"}


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


def generate_image_json(folder, prompt, method, seed, out, capsys, size):
    """`generate-image ... --json` at guidance 2: exit 0, the method, the out path, the stats of 16 tokens and an
    image of `size`; returns the JSON."""
    code = main(["generate-image", prompt, "--model", str(folder), "--method", method, "--seed", str(seed),
                 "--guidance-scale", "2", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert data["method"] == method and data["out"] == str(out)
    stats = data["stats"]
    assert STATS <= set(stats)
    assert stats["new_tokens"] == 16 and stats["step_compression"] == pytest.approx(16 / stats["target_forwards"])
    assert Image.open(out).size == size
    return data


def generate_image_default_out(folder, prompt, file_name, tmp_path, capsys, monkeypatch):
    """Greedy `generate-image` without --out in `tmp_path`: prints and writes `file_name`, reports on stderr."""
    monkeypatch.chdir(tmp_path)
    assert main(["generate-image", prompt, "--model", str(folder), "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == file_name and (tmp_path / file_name).is_file()
    assert "method 'sjd'" in captured.err and "step compression" in captured.err


def generate_image_fails(folder, capsys, argv, message):
    """`generate-image *argv`: exit 2 and one error line matching `message`, no traceback."""
    code = main(["generate-image", *argv, "--model", str(folder)])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after transformers' weight-loading bars, if the model was loaded
    assert code == 2 and last.startswith("mmspec: error:") and "Traceback" not in err
    assert re.search(message, last)


# ---- the class-conditional pipelines (VAR, MAR) alike ------------------------------------------------

def assert_same_components(pipe, loaded, names):
    """Every named component of `loaded` has `pipe`'s weights, to the bit."""
    for name in names:
        ours, theirs = getattr(pipe, name).state_dict(), getattr(loaded, name).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def assert_images_output(out, count, size):
    """A diffusers `BaseOutput` whose images (`out.images`, `out["images"]`, `out[0]`) are `count` PIL images of `size`."""
    assert isinstance(out, BaseOutput)
    assert out[0] is out.images and out["images"] is out.images and len(out.images) == count
    assert out.images[0].size == size


def assert_np_images(pipe, side):
    """output_type="np": one float array [1, side, side, 3] in [0, 1]."""
    arrays = pipe(class_labels=0, method="ar", seed=0, output_type="np", progress_bar=False).images
    assert isinstance(arrays, np.ndarray) and arrays.shape == (1, side, side, 3) and 0 <= arrays.min() <= arrays.max() <= 1


def assert_one_clear_error(pipe, kwargs, message):
    """A call with bad settings raises one `MMSpecError` line that says `message`."""
    with pytest.raises(MMSpecError) as error:
        pipe(class_labels=0, seed=0, progress_bar=False, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def assert_bad_conditions_refused(pipe, num_classes):
    """An unknown class name and a label out of range are one error each."""
    with pytest.raises(MMSpecError, match="unknown class 'pink circle'"):
        pipe(prompt="pink circle", progress_bar=False)
    with pytest.raises(MMSpecError, match=rf"class labels must be integers in \[0, {num_classes}\)"):
        pipe(class_labels=[num_classes], progress_bar=False)


def assert_not_a_saved_folder_is_refused(cls, folder, message, other_class):
    """An empty folder, and one saved by `other_class`, are one error each from `cls.from_pretrained`."""
    with pytest.raises(MMSpecError, match=message):
        cls.from_pretrained(folder)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": other_class}))
    with pytest.raises(MMSpecError, match=f"not a {cls.__name__}"):
        cls.from_pretrained(folder)


def assert_moves_to_bfloat16_and_back(pipe, names, method):
    """`pipe.to(dtype)` moves every named component and the pipeline still generates; `.to(device, dtype)` back."""
    pipe.to(torch.bfloat16)
    assert pipe.dtype == torch.bfloat16 and {getattr(pipe, name).dtype for name in names} == {torch.bfloat16}
    assert len(pipe(class_labels=1, method=method, seed=0, progress_bar=False).images) == 1
    pipe.to("cpu", torch.float32)
    assert pipe.device == torch.device("cpu") and getattr(pipe, names[-1]).dtype == torch.float32
