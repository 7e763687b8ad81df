"""Bad arguments to the speech verbs `mmspec bench speech` and `mmspec train-fast-decoder`: one error line,
exit status 2, no traceback, nothing written. Each row changes one option of a command line that would
otherwise run on a tiny random Whisper (with both fast decoders) and a folder of 4 clips."""

import pytest

from mmspec.cli import main

from .tiny_asr import make_asr_folder, make_clip_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech-cli")
    return make_asr_folder(root / "asr"), make_clip_folder(root / "clips", count=4)


def good_options(verb: str, asr, clips, tmp_path) -> dict[str, str]:
    """The options of a command line of `verb` that runs."""
    if verb == "bench speech":
        return {"--model": str(asr), "--data": str(clips), "--repeats": "1"}
    return {"--target": str(asr), "--data": str(clips), "--out": str(tmp_path / "out"), "--steps": "1"}


@pytest.mark.parametrize("verb, changed, message", [
    ("bench speech", ["--data", "{tmp}/nowhere"], "data folder '{tmp}/nowhere' does not exist"),
    ("bench speech", ["--data", "{tmp}"], "has no metadata.jsonl"),
    ("bench speech", ["--n", "0"], "argument --n: expected an integer >= 1"),
    ("bench speech", ["--num-samples", "0"], "argument --num-samples: expected an integer >= 1"),
    ("bench speech", ["--fast-decoder", "{asr}/ar_fast_decoder"], "--fast-decoder holds an AR fast decoder"),
    ("bench speech", ["--model", "{tmp}/no-model"], "cannot load the"),
    ("bench speech", ["--feature-drafter", "{tmp}"], "no Whisper feature drafter in '{tmp}' (config.json not found)"),
    ("bench speech", ["--feature-drafter", "{asr}/ar_fast_decoder"], "holds no Whisper feature drafter"),
    ("bench speech", ["--batch-size", "1,2", "--feature-drafter", "{tmp}"], "do not combine with --batch-size"),
    ("bench speech", ["--batch-size", "1,2", "--chain", "2"], "do not combine with --batch-size"),
    ("train-fast-decoder", ["--data", "{tmp}/missing"], "argument --data: folder not found: '{tmp}/missing'"),
    ("train-fast-decoder", ["--data", "{tmp}/empty"], "has no metadata.jsonl"),
    ("train-fast-decoder", ["--target", "{tmp}/no-model"], "cannot load the"),
    ("train-fast-decoder", ["--out", "{asr}"], "holds a Whisper model; write the fast decoder to a subfolder"),
    ("train-fast-decoder", ["--steps", "0"], "argument --steps: expected an integer >= 1"),
])
def test_bad_arguments_are_one_line_and_exit_2(folders, tmp_path, capsys, verb, changed, message):
    asr, clips = folders
    (tmp_path / "empty").mkdir()
    fill = {"tmp": str(tmp_path), "asr": str(asr)}
    options = good_options(verb, asr, clips, tmp_path)
    options.update({key: value.format(**fill) for key, value in zip(changed[::2], changed[1::2])})
    code = main([*verb.split(), *[x for pair in options.items() for x in pair]])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mmspec: error: ") and message.format(**fill) in last
    assert not (tmp_path / "out").exists()
