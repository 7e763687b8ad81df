"""An image-model folder whose config.json is not a config (random bytes, a list, null, text for sizes) is one
clear error from the pipeline and from the CLI, not a UnicodeDecodeError / TypeError traceback."""

import os

import pytest

from mmspec import MMSpecError
from mmspec.cli import main
from mmspec.image_ar.janus_pipeline import is_janus_folder
from mmspec.image_ar.pipeline import SpeculativeImagePipeline, image_family

CONFIGS = {
    "random bytes": b"\x96\xbb" + os.urandom(510),  # not UTF-8 from its first byte
    "a list": b"[1, 2]",
    "null": b"null",
    "text for sizes": b'{"hidden_size": "big", "num_hidden_layers": "x"}',
}


@pytest.fixture(params=sorted(CONFIGS))
def folder(request, tmp_path):
    (tmp_path / "config.json").write_bytes(CONFIGS[request.param])
    (tmp_path / "model.safetensors").write_bytes(os.urandom(4096))
    return tmp_path


def test_the_pipeline_refuses_it_in_one_error(folder):
    assert not is_janus_folder(folder) and image_family(folder) == "llamagen"
    with pytest.raises(MMSpecError, match="cannot load the image model from"):
        SpeculativeImagePipeline.from_pretrained(str(folder))


@pytest.mark.parametrize("argv", [["generate-image", "1"], ["bench", "image"]])
def test_the_cli_refuses_it_in_one_line(folder, argv, capsys, monkeypatch):
    monkeypatch.setenv("MMSPEC_BENCH_RESULTS", "")
    assert main([*argv, "--model", str(folder)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("mmspec: error: cannot load the image model")
