"""Long audio: regions, overlapping windows and stitching; subtitles (SRT / VTT validated strictly); folder mode."""

import json
import re

import numpy as np
import pytest

from mmspec.cli import main
from mmspec.speech.long_audio import plan_windows, speech_regions, stitch
from mmspec.speech.subtitles import Segment, timestamp, to_srt, to_vtt, write_atomically

from .test_pipeline import RATE, asr_folder, speechy, write_wav  # noqa: F401 - asr_folder is a fixture

SRT_TIME = re.compile(r"^(\d\d):([0-5]\d):([0-5]\d),(\d\d\d) --> (\d\d):([0-5]\d):([0-5]\d),(\d\d\d)$")
VTT_TIME = re.compile(r"^(\d\d):([0-5]\d):([0-5]\d)\.(\d\d\d) --> (\d\d):([0-5]\d):([0-5]\d)\.(\d\d\d)$")


def _seconds(groups):
    h, m, s, ms = (int(g) for g in groups)
    return h * 3600 + m * 60 + s + ms / 1000


def parse_srt(text):
    """Strict SubRip: blocks of index (1, 2, ...), time line, one or more text lines, separated by one blank line."""
    assert text.endswith("\n") and "\r" not in text
    blocks = text.rstrip("\n").split("\n\n")
    cues = []
    for number, block in enumerate(blocks, 1):
        lines = block.split("\n")
        assert lines[0] == str(number), block
        match = SRT_TIME.match(lines[1])
        assert match, lines[1]
        start, end = _seconds(match.groups()[:4]), _seconds(match.groups()[4:])
        assert len(lines) >= 3 and all(line.strip() for line in lines[2:]), block
        cues.append((start, end, " ".join(lines[2:])))
    return cues


def parse_vtt(text):
    """Strict WebVTT: "WEBVTT" then a blank line, then cues (time line with '.', text lines) separated by blank lines."""
    assert text.startswith("WEBVTT\n\n") and text.endswith("\n")
    cues = []
    for block in text[len("WEBVTT\n\n"):].rstrip("\n").split("\n\n"):
        lines = block.split("\n")
        match = VTT_TIME.match(lines[0])
        assert match, lines[0]
        assert len(lines) >= 2 and all(line.strip() and "-->" not in line for line in lines[1:]), block
        cues.append((_seconds(match.groups()[:4]), _seconds(match.groups()[4:]), " ".join(lines[1:])))
    return cues


def check_times(cues):
    assert cues
    for start, end, _ in cues:
        assert end > start
    assert all(b[0] >= a[1] for a, b in zip(cues, cues[1:]))  # in order, never overlapping


# --- units ---------------------------------------------------------------------------------------

def test_timestamps_and_cue_writers():
    assert timestamp(3725.0456, ",") == "01:02:05,046" and timestamp(0, ".") == "00:00:00.000"
    segments = [Segment(0.5, 2.0, "hello there"), Segment(2.0, 2.0, "  "), Segment(61.25, 63.5, "a --> b\n\nc")]
    srt = parse_srt(to_srt(segments))
    assert [c[2] for c in srt] == ["hello there", "a --> b c"] and srt[1][:2] == (61.25, 63.5)
    vtt = parse_vtt(to_vtt(segments))
    assert [c[2] for c in vtt] == ["hello there", "a -> b c"]
    check_times(srt)
    check_times(vtt)
    with pytest.raises(AssertionError):  # control: the validator rejects a comma in a VTT time
        parse_vtt(to_vtt(segments).replace("00:00:00.500", "00:00:00,500"))


def test_stitch_cuts_in_the_middle_of_the_agreeing_overlap():
    previous, current = [1, 2, 3, 4, 5, 6, 7], [5, 6, 7, 8, 9]
    keep, skip = stitch(previous, current)
    assert previous[:keep] + current[skip:] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    keep, skip = stitch([1, 2, 3], [7, 8, 9])  # nothing agrees: both kept whole
    assert (keep, skip) == (3, 0)
    noisy = [1, 2, 3, 4, 99, 6, 7]  # one garbled edge token in the overlap
    keep, skip = stitch(noisy, [4, 5, 6, 7, 8])
    assert noisy[:keep] + [4, 5, 6, 7, 8][skip:] in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 99, 6, 7, 8])


def test_regions_and_windows():
    rate = 1000
    audio = np.zeros(20 * rate, np.float32)
    audio[2 * rate:3 * rate] = 0.3
    audio[3 * rate + 200:4 * rate] = 0.3  # a 0.2 s pause: same region
    audio[8 * rate:19 * rate] = 0.3
    regions = speech_regions(audio, rate, 1e-3)
    assert regions == [(1800, 4200), (7800, 19200)]
    windows = plan_windows(regions, window=5 * rate, stride=rate)
    assert [(w.start, w.end, w.region) for w in windows] == [(1800, 4200, 0), (7800, 12800, 1), (10800, 15800, 1),
                                                             (13800, 18800, 1), (16800, 19200, 1)]
    assert [(w.owned_start, w.owned_end) for w in windows[1:]] == [(7800, 11800), (11800, 14800), (14800, 17800),
                                                                   (17800, 19200)]
    assert speech_regions(np.zeros(rate, np.float32), rate, 1e-3) == []
    assert speech_regions(np.full(3 * rate, 0.2, np.float32), rate, 1e-3) == [(0, 3 * rate)]  # steady sound is kept
    dipped = np.full(12 * rate, 0.3, np.float32)
    dipped[7 * rate:7 * rate + 300] = 0.01  # a 0.3 s pause, too short to end a region, deep enough to cut at
    assert speech_regions(dipped, rate, 1e-3) == [(0, 12 * rate)]
    parts = speech_regions(dipped, rate, 1e-3, max_region_s=5.0)
    assert len(parts) == 2 and parts[0][0] == 0 and parts[1][1] == 12 * rate and parts[0][1] == parts[1][0]
    assert 7 * rate <= parts[0][1] <= 7 * rate + 300
    assert speech_regions(np.full(12 * rate, 0.3, np.float32), rate, 1e-3, max_region_s=5.0) == [(0, 12 * rate)]  # no dip


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = write_atomically(tmp_path / "a.srt", "1\n")
    assert target.read_text() == "1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.srt"]
    with pytest.raises(Exception, match="does not exist"):
        write_atomically(tmp_path / "missing" / "a.srt", "x")


# --- a 10-minute file through the CLI --------------------------------------------------------------

@pytest.fixture(scope="module")
def ten_minutes(tmp_path_factory):
    """Ten minutes of silence with a burst of sound every 50 s and one 2.5 s stretch longer than the toy's 1 s window."""
    audio = np.zeros(600 * RATE, np.float32)
    bursts = [(50.0 * k + 3.0, 0.8 + 0.1 * (k % 3)) for k in range(12)]
    bursts[5] = (bursts[5][0], 2.5)
    for k, (start, seconds) in enumerate(bursts):
        piece = speechy(seconds, seed=k)
        audio[int(start * RATE):int(start * RATE) + piece.shape[0]] = piece
    return write_wav(tmp_path_factory.mktemp("long") / "ten-minutes.wav", audio), bursts


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_ten_minute_file_gives_valid_subtitles(asr_folder, ten_minutes, tmp_path, capsys, fmt):
    path, bursts = ten_minutes
    out = tmp_path / f"subs.{fmt}"
    assert main(["transcribe", str(path), "--model", str(asr_folder), "--method", "ar", "--max-new-tokens", "6",
                 "--out", str(out)]) == 0
    cues = (parse_srt if fmt == "srt" else parse_vtt)(out.read_text())
    check_times(cues)
    assert cues[-1][1] > 500  # reaches the end of the file
    for start, end, _ in cues:  # every cue lies on a burst (0.2 s padding), none in the silence
        assert any(b - 0.25 <= start and end <= b + s + 0.25 for b, s in bursts), (start, end)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temporary file left


def test_json_format_holds_segments(asr_folder, ten_minutes, capsys):
    path, _ = ten_minutes
    assert main(["transcribe", str(path), "--model", str(asr_folder), "--method", "ar", "--max-new-tokens", "6",
                 "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["method"] == "ar" and report["segments"] and report["stats"]["chunks"] >= 14
    assert report["text"] == " ".join(s["text"] for s in report["segments"] if s["text"])


def test_folder_mode_records_bad_files_and_runs_the_rest(asr_folder, tmp_path, capsys):
    audio = tmp_path / "audio"
    audio.mkdir()
    write_wav(audio / "a-good.wav", speechy(0.8, seed=1))
    write_wav(audio / "d-good.wav", speechy(0.9, seed=2))
    (audio / "b-corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt garbage that is not audio")
    (audio / "c-empty.flac").write_bytes(b"")
    (audio / "c-text.mp3").write_text("this is not audio at all\n")
    write_wav(audio / "c-short.wav", speechy(0.1, seed=3))
    (audio / "notes.txt").write_text("skipped: not an audio suffix")
    out = tmp_path / "out"
    code = main(["transcribe", str(audio), "--model", str(asr_folder), "--method", "ar", "--max-new-tokens", "6",
                 "--format", "srt", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["a-good.srt", "d-good.srt"]
    for name, reason in [("b-corrupt.wav", "cannot read audio"), ("c-empty.flac", "empty"),
                         ("c-text.mp3", "cannot read audio"), ("c-short.wav", "too short")]:
        lines = [line for line in err.splitlines() if line.startswith(f"mmspec: error: {name}: ")]
        assert len(lines) == 1 and reason in lines[0], (name, err)
    assert "transcribed 2 of 6 file(s)" in err
    for name in ("a-good.srt", "d-good.srt"):
        check_times(parse_srt((out / name).read_text()))


def test_folder_mode_needs_an_output_folder(asr_folder, tmp_path, capsys):
    (tmp_path / "a.wav").write_bytes(b"")
    assert main(["transcribe", str(tmp_path), "--model", str(asr_folder)]) == 2
    assert "needs --out DIR" in capsys.readouterr().err
