"""`mmspec transcribe` never overwrites its input or one output with another, checks every output before any
model loads, and writes outputs with the permissions a plain `open()` gives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mmspec.cli import main

from .test_pipeline import asr_folder, speechy, write_wav  # noqa: F401 - asr_folder is a fixture

FLAGS = ["--method", "ar", "--max-new-tokens", "4", "--threads", "1"]


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("spelling", ["same", "dotted", "hardlink"])
def test_output_equal_to_the_input_is_refused_before_the_model_loads(tmp_path, capsys, spelling):
    clip = write_wav(tmp_path / "v.wav", speechy(0.8))
    before = clip.read_bytes()
    out = {"same": clip, "dotted": tmp_path / "sub" / ".." / "v.wav", "hardlink": tmp_path / "v-link.wav"}[spelling]
    (tmp_path / "sub").mkdir()
    if spelling == "hardlink":
        os.link(clip, out)
    code = main(["transcribe", str(clip), "--out", str(out), "--model", str(tmp_path / "no-model")])
    line = error_line(capsys)
    assert code == 2 and "is the input" in line, line
    assert clip.read_bytes() == before


def test_unwritable_outputs_fail_before_the_model_loads(tmp_path, capsys):
    clip = write_wav(tmp_path / "v.wav", speechy(0.8))
    for out in ("/proc/x.srt", "/proc/subs"):
        source = clip if out.endswith(".srt") else tmp_path
        code = main(["transcribe", str(source), "--out", out, "--model", str(tmp_path / "no-model")])
        line = error_line(capsys)
        assert code == 2 and "cannot" in line and "/proc" in line and "no-model" not in line, line


def test_folder_outputs_with_the_same_stem_stay_distinct(asr_folder, tmp_path, capsys):  # noqa: F811
    audio = tmp_path / "audio"
    audio.mkdir()
    for index, name in enumerate(["talk.wav", "talk.flac", "talk.mp3", "other.wav"]):
        write_wav(audio / name, speechy(0.8, seed=index))  # PyAV reads the content, whatever the suffix
    out = tmp_path / "subs"
    assert main(["transcribe", str(audio), "--model", str(asr_folder), *FLAGS, "--format", "json", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["other.json", "talk.flac.json", "talk.mp3.json", "talk.wav.json"]
    for name in ("talk.flac", "talk.mp3", "talk.wav"):
        assert Path(json.loads((out / f"{name}.json").read_text())["file"]).name == name
    assert "transcribed 4 of 4" in capsys.readouterr().err


def test_a_results_file_of_another_folder_does_not_skip_files(asr_folder, tmp_path, capsys):  # noqa: F811
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, seed in ((first, 1), (second, 2)):
        folder.mkdir()
        write_wav(folder / "clip.wav", speechy(0.8 + 0.1 * seed, seed=seed))
    results = tmp_path / "r.jsonl"
    for folder in (first, second):
        assert main(["transcribe", str(folder), "--model", str(asr_folder), *FLAGS, "--out", str(results)]) == 0
    err = capsys.readouterr().err
    assert "already in" not in err
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 1 and records[0]["source"]["path"] == str((second / "clip.wav").resolve())
    # the same folder again: its file is recognised and skipped
    assert main(["transcribe", str(second), "--model", str(asr_folder), *FLAGS, "--out", str(results)]) == 0
    assert "1 of 1 file(s) already in" in capsys.readouterr().err


def test_outputs_get_the_mode_of_a_plain_open(asr_folder, tmp_path, capsys):  # noqa: F811
    clip = write_wav(tmp_path / "v.wav", speechy(0.8))
    previous = os.umask(0o022)
    try:
        srt = tmp_path / "v.srt"
        assert main(["transcribe", str(clip), "--model", str(asr_folder), *FLAGS, "--out", str(srt)]) == 0
        folder = tmp_path / "subs"
        assert main(["transcribe", str(tmp_path), "--model", str(asr_folder), *FLAGS, "--out", str(folder)]) == 0
    finally:
        os.umask(previous)
    assert srt.stat().st_mode & 0o777 == 0o644
    assert (folder / "v.txt").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("into", ["r.jsonl", "subs"])
def test_a_file_name_that_is_not_utf8_does_not_stop_the_folder(asr_folder, tmp_path, capsys, into):  # noqa: F811
    audio = tmp_path / "audio"
    audio.mkdir()
    odd = os.fsdecode(b"b_\xff\xfe.wav")
    for index, name in enumerate(["a.wav", odd, "c.wav"]):
        write_wav(audio / name, speechy(0.8, seed=index))
    out = tmp_path / into
    assert main(["transcribe", str(audio), "--model", str(asr_folder), *FLAGS, "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "3 of 3" in captured.err
    if into == "r.jsonl":
        records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert [r["file"] for r in records] == ["a.wav", odd, "c.wav"] and all(r["error"] is None for r in records)
        assert main(["transcribe", str(audio), "--model", str(asr_folder), *FLAGS, "--out", str(out)]) == 0
        assert "3 of 3 file(s) already in" in capsys.readouterr().err
    else:
        assert sorted(os.listdir(out)) == sorted(["a.json", os.fsdecode(b"b_\xff\xfe.json"), "c.json"])


def test_retry_failed_runs_the_error_lines_again(asr_folder, tmp_path, capsys):  # noqa: F811
    audio = tmp_path / "audio"
    audio.mkdir()
    write_wav(audio / "a.wav", speechy(0.8))
    (audio / "b.wav").write_bytes(b"RIFF not audio")
    results = tmp_path / "r.jsonl"
    assert main(["transcribe", str(audio), "--model", str(asr_folder), *FLAGS, "--out", str(results)]) == 2
    capsys.readouterr()
    assert main(["transcribe", str(audio), "--model", str(asr_folder), *FLAGS, "--out", str(results),
                 "--retry-failed"]) == 2
    assert "1 of 2 file(s) already in" in capsys.readouterr().err  # b.wav ran again
    code = main(["transcribe", str(audio), "--model", str(asr_folder), *FLAGS, "--out", str(tmp_path / "subs"),
                 "--retry-failed"])
    assert code == 2 and "--retry-failed applies to --out FILE.jsonl" in capsys.readouterr().err
