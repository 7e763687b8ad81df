"""A CTranslate2 Whisper folder with a malformed config.json or absurd settings in its header is one MMSpecError,
never an AttributeError / TypeError / ValueError from inside the reader or transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmspec.errors import MMSpecError
from mmspec.speech.ctranslate2 import load_ct2_whisper

from .ct2_writer import ct2_variables, tiny_ct2_whisper, write_ct2_folder


@pytest.fixture(scope="module")
def tiny():
    return tiny_ct2_whisper()


@pytest.mark.parametrize("settings", [
    [1, 2, 3],
    {"suppress_ids": None},
    {"suppress_ids": ["one", "two"]},
    {"suppress_ids_begin": 5},
    {"alignment_heads": [[[1, 0]], [1, 2]]},
    {"alignment_heads": [1, 2]},
    {"alignment_heads": None},
])
def test_a_malformed_config_json_is_one_error(tiny, tmp_path, settings):
    folder = write_ct2_folder(tiny, tmp_path / "ct2")
    (folder / "config.json").write_text(json.dumps(settings))
    with pytest.raises(MMSpecError, match="config.json"):
        load_ct2_whisper(folder)


@pytest.mark.parametrize("name, value", [
    ("encoder/num_heads", 0),
    ("decoder/num_heads", 7),
    ("encoder/num_heads", 2**31 - 1),
])
def test_absurd_header_settings_are_one_error(tiny, tmp_path, name, value):
    variables = ct2_variables(tiny)
    variables[name] = np.asarray(np.int32(value))
    folder = write_ct2_folder(tiny, tmp_path / "ct2", variables=variables)
    with pytest.raises(MMSpecError):
        load_ct2_whisper(folder)
