"""Folder mode of `mmspec caption`: one fsync'd JSON line per file, resumable, robust to a kill and to bad files,
and split over processes by accelerate with a merged result equal to a one-process run.

The toy captioner captions short videos rendered here (8 frames of 64x64); 8 new tokens each, one thread.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmspec import batch_files
from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.world import detailed_examples, render_video, write_video

FLAGS = ["--max-new-tokens", "8", "--threads", "1"]
TIMING_KEYS = {"prefill_time_s", "draft_time_s", "verify_time_s", "wall_time_s", "tokens_per_s"}


def make_videos(folder: Path, count: int, seed: int = 3) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for index, (scene, _) in enumerate(detailed_examples(count, seed=seed)):  # 1-4 shapes: captions differ early
        names.append(f"clip{index:02d}.mp4")
        write_video(folder / names[-1], render_video(scene, num_frames=8, size=64))
    return names


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def comparable(path: Path) -> list[dict]:
    """The records without their timings (wall-clock numbers differ from run to run; everything else must not)."""
    records = [json.loads(line) for line in lines(path)]
    for record in records:
        if record.get("stats"):
            record["stats"] = {k: v for k, v in record["stats"].items() if k not in TIMING_KEYS}
    return records


def caption(folder: Path, out: Path, *extra: str) -> int:
    return main(["caption", str(folder), "--out", str(out), *FLAGS, *extra])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Five videos, a corrupt one sorted among them, and a file that is no media (ignored)."""
    folder = tmp_path_factory.mktemp("videos")
    make_videos(folder, 5)
    (folder / "clip02b.mp4").write_bytes(os.urandom(3000))
    (folder / "notes.txt").write_text("not a video")
    return folder


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> Path:
    """An uninterrupted one-process run of `folder`."""
    out = tmp_path_factory.mktemp("reference") / "captions.jsonl"
    assert caption(folder, out) == 2  # the corrupt file fails; the run goes on and says so in its status
    return out


def test_one_line_per_file_sorted_and_a_corrupt_file_is_an_error_line(reference, capsys):
    records = [json.loads(line) for line in lines(reference)]
    assert [r["file"] for r in records] == ["clip00.mp4", "clip01.mp4", "clip02.mp4", "clip02b.mp4", "clip03.mp4", "clip04.mp4"]
    broken = records[3]
    assert broken["error"] and "cannot read video" in broken["error"] and "text" not in broken
    for record in records[:3] + records[4:]:
        assert record["error"] is None
        assert record["text"].strip()
        assert record["stats"]["new_tokens"] == 8 and record["method"] == "flash"


@pytest.mark.slow
def test_failures_are_counted_at_the_end(folder, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    assert caption(folder, out, "--json") == 2
    captured = capsys.readouterr()
    assert "mmspec: error: clip02b.mp4: cannot read video" in captured.err
    assert "captioned 5 of 6 file(s)" in captured.err and "1 failed (clip02b.mp4)" in captured.err
    assert json.loads(captured.out) == {"out": str(out), "files": 6, "failed": ["clip02b.mp4"]}


@pytest.mark.slow
def test_rerun_skips_recorded_files_and_leaves_their_lines_alone(folder, reference, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    kept = lines(reference)[:2]
    out.write_text("\n".join(kept) + "\n")
    assert caption(folder, out) == 2
    assert "2 of 6 file(s) already in" in capsys.readouterr().err
    assert lines(out)[:2] == kept  # byte for byte: recorded lines are never redone
    assert comparable(out) == comparable(reference)
    before = out.read_bytes()
    assert caption(folder, out) == 2  # everything recorded: nothing runs, nothing changes; the earlier failure still counts
    assert "6 of 6 file(s) already in" in capsys.readouterr().err
    assert out.read_bytes() == before


def test_retry_failed_reruns_only_error_lines(folder, reference, tmp_path, capsys):
    fixed = tmp_path / "videos"
    make_videos(fixed, 5)
    (fixed / "clip02b.mp4").write_bytes((folder / "clip02b.mp4").read_bytes())  # the same corrupt file
    out = tmp_path / "captions.jsonl"
    assert caption(fixed, out) == 2
    first = lines(out)
    capsys.readouterr()
    assert caption(fixed, out) == 2 and lines(out) == first  # without --retry-failed the recorded error stands
    assert "6 of 6 file(s) already in" in capsys.readouterr().err
    assert caption(fixed, out, "--retry-failed") == 2
    assert "5 of 6 file(s) already in" in capsys.readouterr().err  # only the error line ran again
    (fixed / "clip02b.mp4").write_bytes((folder / "clip00.mp4").read_bytes())  # repaired: a changed file runs again
    assert caption(fixed, out) == 0
    records = comparable(out)
    assert [r["file"] for r in records] == [r["file"] for r in comparable(reference)]  # replaced in place, in order
    assert records[3]["error"] is None and records[3]["text"] == records[0]["text"]
    assert lines(out)[:3] == first[:3]


@pytest.mark.slow
def test_a_torn_last_line_is_dropped_and_redone(folder, reference, tmp_path):
    out = tmp_path / "captions.jsonl"
    whole = lines(reference)
    out.write_text("\n".join(whole[:2]) + "\n" + whole[2][: len(whole[2]) // 2])  # killed while writing line 3
    assert [r["file"] for r in batch_files.read_records(out)] == ["clip00.mp4", "clip01.mp4"]
    assert caption(folder, out) == 2
    assert lines(out)[:2] == whole[:2]
    assert comparable(out) == comparable(reference)


def test_a_foreign_line_fails_before_any_model_loads(folder, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    out.write_text('{"file": "clip00.mp4", "text": "x", "error": null}\nnot json\n{"file": "clip01.mp4"}\n')
    assert caption(folder, out) == 2
    assert "line 2 of" in capsys.readouterr().err
    with pytest.raises(MMSpecError, match="line 2 of"):
        batch_files.read_records(out)


def test_ordered_keeps_the_latest_record_per_file_in_input_order():
    records = [{"file": "b", "v": 1}, {"file": "x", "v": 0}, {"file": "a", "v": 1}, {"file": "b", "v": 2}]
    assert batch_files.ordered(records, ["a", "b", "c"]) == [{"file": "a", "v": 1}, {"file": "b", "v": 2}, {"file": "x", "v": 0}]


@pytest.mark.slow
def test_killed_half_way_then_rerun_finishes_the_rest(tmp_path):
    folder = tmp_path / "videos"
    names = make_videos(folder, 8, seed=11)
    out = tmp_path / "captions.jsonl"
    command = [sys.executable, "-m", "mmspec", "caption", str(folder), "--out", str(out), "--max-new-tokens", "32",
               "--threads", "1"]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        assert run.poll() is None and time.monotonic() < deadline, run.stderr.read().decode()[-2000:]
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.wait()
    run.stderr.close()
    written = out.read_text(encoding="utf-8").split("\n")[:-1]  # the complete lines (a torn last one is redone)
    assert 1 <= len(written) < len(names)  # killed half way: some lines, not all
    assert main(["caption", str(folder), "--out", str(out), "--max-new-tokens", "32", "--threads", "1"]) == 0
    assert lines(out)[: len(written)] == written  # nothing already written was lost or changed
    assert [r["file"] for r in comparable(out)] == names

    fresh = tmp_path / "fresh.jsonl"
    assert main(["caption", str(folder), "--out", str(fresh), "--max-new-tokens", "32", "--threads", "1"]) == 0
    assert comparable(out) == comparable(fresh)  # the killed-and-resumed result equals an uninterrupted run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_accelerate_two_processes_merge_to_the_one_process_result(folder, reference, tmp_path):
    out = tmp_path / "captions.jsonl"
    # accelerate's torchrun launcher (--multi_gpu) starts the processes; on a machine without GPUs they meet over gloo.
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
               "-m", "mmspec", "caption", str(folder), "--out", str(out), *FLAGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0, done.stderr[-3000:]  # the corrupt file fails in either process: non-zero status
    assert "process 0 of 2 captioned 3 file(s)" in done.stderr, done.stderr[-3000:]
    assert "process 1 of 2 captioned 3 file(s)" in done.stderr  # both processes did half of the work
    assert not batch_files.part_files(out)  # merged, part files gone
    assert comparable(out) == comparable(reference)
    # Failing control: the same records in another order are told apart (the merge order is what is checked).
    swapped = comparable(out)
    swapped[0], swapped[-1] = swapped[-1], swapped[0]
    assert swapped != comparable(reference)


def audio_folder(tmp_path: Path) -> Path:
    """Two speech recordings from the demo's assets and one file that is not audio."""
    folder = tmp_path / "audio"
    folder.mkdir()
    assets = Path(__file__).parents[1] / "demos" / "assets"
    for name in ("speech-everyday.flac", "speech-shapes.flac"):
        (folder / name).write_bytes((assets / name).read_bytes())
    (folder / "bad.wav").write_bytes(os.urandom(2000))
    return folder


@pytest.mark.slow
def test_transcribe_a_folder_into_json_lines(tmp_path, capsys):
    folder = audio_folder(tmp_path)
    out = tmp_path / "transcripts.jsonl"
    argv = ["transcribe", str(folder), "--model", "whisper-tiny.en", "--out", str(out), "--threads", "1"]
    assert main(argv) == 2
    records = [json.loads(line) for line in lines(out)]
    assert [r["file"] for r in records] == ["bad.wav", "speech-everyday.flac", "speech-shapes.flac"]
    assert "cannot read audio" in records[0]["error"]
    capsys.readouterr()
    assert main(["transcribe", str(folder / "speech-shapes.flac"), "--model", "whisper-tiny.en", "--format", "json",
                 "--threads", "1"]) == 0
    alone = json.loads(capsys.readouterr().out)  # the line holds what --format json prints for the file alone
    assert records[2]["text"] == alone["text"] and records[2]["segments"] == alone["segments"]
    assert records[2]["error"] is None and records[2]["stats"]["new_tokens"] == alone["stats"]["new_tokens"]
    before = out.read_bytes()
    assert main(argv) == 2 and out.read_bytes() == before  # resumable: nothing left to do
    assert main([*argv, "--format", "srt"]) == 2
    assert "--format srt does not apply" in capsys.readouterr().err
