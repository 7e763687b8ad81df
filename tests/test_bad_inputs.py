"""Bad input on the command line: one line on stderr, exit status 2, no traceback, and quickly.

One table per verb; a new verb adds its table to `TABLES`. Each row is a command line (`{video}`,
`{tmp}` and the other fields are filled in by the fixtures) and a piece of the one error line expected.
Rows run in-process through `mmspec.cli.main`; a few run as a real `mmspec` process to prove the exit
status and the Ctrl-C handling.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from mmspec.cli import main
from mmspec.zoo import entries

BIG_SEED = str(2**64)
NAN = "nan"

CAPTION = [
    (["caption", "{tmp}/missing.mp4"], "argument path: file not found"),
    (["caption", "{tmp}"], "a folder needs --out FILE.jsonl"),
    (["caption", "{tmp}", "--out", "{tmp}/captions.txt"], "needs the suffix .jsonl"),
    (["caption", "{video}", "--retry-failed"], "--retry-failed needs --out"),
    (["caption", "{video}", "--fps", "inf"], "argument --fps: expected a finite number"),
    (["caption", "{video}", "--fps", "0"], "argument --fps: expected a number > 0"),
    (["caption", "{video}", "--temperature", NAN], "argument --temperature: expected a finite number"),
    (["caption", "{video}", "--temperature", "-1"], "argument --temperature: expected a number >= 0"),
    (["caption", "{video}", "--drafter-dtype", "half-ish"], "argument --drafter-dtype: expected one of float32"),
    (["caption", "{video}", "--seed", BIG_SEED], "argument --seed: expected an integer in 0..18446744073709551615"),
    (["caption", "{video}", "--seed", "-1"], "argument --seed"),
    (["caption", "{video}", "--threads", "-1"], "argument --threads"),
    (["caption", "{video}", "--frames", "0"], "argument --frames: expected an integer >= 1"),
    (["caption", "{video}", "--max-new-tokens", "0"], "argument --max-new-tokens"),
    (["caption", "{video}", "--num-draft-tokens", "0"], "argument --num-draft-tokens"),
    (["caption", "{video}", "--tree", "16,4"], "argument --tree: expected NODES,TOP_K,DEPTH (three integers)"),
    (["bench", "vision", "--confidence-stop", "12"], "argument --confidence-stop: expected K,THRESHOLD"),
    (["bench", "vision", "--confidence-stop", "12,1.5"], "argument --confidence-stop: expected K,THRESHOLD"),
    (["caption", "{video}", "--tree", "16,0,5"], "argument --tree: tree top_k must be an integer >= 1"),
    (["caption", "{video}", "--model", "no-such-model"], "not in the local Hub cache (HF_HUB_OFFLINE is set"),
    (["caption", "{video}", "--model", "/no/such/folder"], "no folder '/no/such/folder' exists"),
    (["caption", "{video}", "--model", "{pickle_only}"], "holds only pickle checkpoints (pytorch_model.bin)"),
    (["caption", "{video}", "--model", "{bad_card}"], "zoo_card.json': not valid JSON"),
    (["caption", "{video}", "--device-map", "nowhere"], "argument --device-map: expected auto, balanced, balanced_low_0, "
                                                        "sequential or a JSON file, got 'nowhere'"),
    (["caption", "{video}", "--device-map", "{tmp}/missing.json"], "argument --device-map: file not found"),
    (["caption", "{video}", "--device-map", "{binary}"], "argument --device-map: '{binary}' is not valid JSON"),
    (["caption", "{video}", "--max-memory", "cpu"], "argument --max-memory: expected DEVICE=SIZE pairs"),
    (["caption", "{video}", "--max-memory", "cpu=lots"], "argument --max-memory: max_memory['cpu']: 'lots' is not a size"),
    (["caption", "{video}", "--offload-folder", "{tmp}/offload"], "offload_folder applies to a dispatched model"),
    (["caption", "{video}", "--device-map", "auto", "--drafter-device", "gpu7"], "argument --drafter-device: 'gpu7' is not a device"),
    (["caption", "{video}", "--drafter-device", "cpu"], "--drafter-device places the drafter of a model spread by"),
    (["caption", "{tmp}", "--out", "{tmp}/c.jsonl", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1"),
    (["caption", "{tmp}", "--out", "{tmp}/c.jsonl", "--batch-size", "two"], "argument --batch-size"),
    (["caption", "{video}", "--batch-size", "4"], "--batch-size applies to a folder run into --out FILE.jsonl"),
]
LONG_PROMPT = "a red circle moves " * 400
CAPTION_WITH_ZOO = [  # these load a toy model (a few seconds each) and fail before decoding
    (["generate", LONG_PROMPT], "tokens, but shapes-caption-lm holds 512 positions: shorten it"),
    (["generate", "hi", "--model", "shapes-video-captioner"], "the target 'shapes-video-captioner' is a "
     "LlavaNextVideoForConditionalGeneration (video-captioning), not a causal language model"),
    (["generate", "hi", "--drafter", "shapes-var"], "the drafter 'shapes-var' is a VARPipeline"),
    (["caption", "{video}", "--frames", "10000"], "10000 frames cannot fit: shapes-video-captioner holds 512 positions"),
    (["caption", "{video}", "--frames", "16"],
     "the input is 586 tokens (576 visual + 10 prompt), but shapes-video-captioner holds 512 positions"),
    (["caption", "{video}", "--method", "std", "--tree"], "SparseToDenseDrafter cannot draft trees"),
    (["caption", "{tmp}", "--out", "{tmp}/c.jsonl", "--tree", "--batch-size", "2"],
     "--tree drafts one sequence at a time; use --batch-size 1"),
]
GENERATE = [
    (["generate", "hi", "--temperature", NAN, "--sample"], "argument --temperature: expected a finite number"),
    (["generate", "hi", "--top-p", "2"], "argument --top-p: expected a number in (0, 1]"),
    (["generate", "hi", "--top-k", "0"], "argument --top-k"),
    (["generate", "hi", "-k", "-3"], "argument --num-draft-tokens/-k"),
    (["generate", "hi", "--threads", "-1"], "argument --threads"),
    (["generate", "hi", "--max-new-tokens", "0"], "argument --max-new-tokens"),
    (["generate", "hi", "--seed", BIG_SEED], "argument --seed"),
    (["generate", "hi", "--model", "{tmp}/missing/model"], "cannot load the target"),
    (["generate", "hi", "--model", "{video}"], "is a file, not a model folder"),
]
GENERATE_IMAGE = [
    (["generate-image", "red circle", "--out", "/proc/x.png"], "--out: cannot write"),
    (["generate-image", "red circle", "--out", "/sys/x.png"], "--out: cannot write"),
    (["generate-image", "red circle", "--out", "{tmp}/folder.png"], "is an existing folder, not a file"),
    (["generate-image", "red circle", "--out", "{tmp}/missing/x.png"], "no existing folder '{tmp}/missing'"),
    (["generate-image", "red circle", "--out", "{tmp}/x.txt"], "needs an image suffix"),
    (["generate-image", "red circle", "--temperature", NAN], "argument --temperature: expected a finite number"),
    (["generate-image", "red circle", "--seed", BIG_SEED], "argument --seed"),
    (["generate-image", "red circle", "--threads", "-1"], "argument --threads"),
    (["generate-image", "red circle", "--device", "gpu7"], "argument --device: 'gpu7' is not a device"),
    (["generate-image", "red circle", "--top-k", "0"], "argument --top-k"),
    (["generate-image", "red circle", "--lantern-delta", NAN], "argument --lantern-delta: expected a finite number"),
]
GENERATE_IMAGE_WITH_ZOO = [
    (["generate-image", "99999999999999999999", "--out", "{tmp}/x.png"], "class id 99999999999999999999 is out of range"),
    (["generate-image", "²", "--out", "{tmp}/x.png"], "unknown class '²'"),
]
BENCH = [
    (["bench", "text", "--repeats", "0"], "argument --repeats: expected an integer >= 1"),
    (["bench", "text", "--max-new-tokens", "0"], "argument --max-new-tokens"),
    (["bench", "text", "--num-prompts", "0"], "argument --num-prompts"),
    (["bench", "text", "--prompts", "{binary}"], "is not a UTF-8 text file"),
    (["bench", "text", "--threads", "-1"], "argument --threads"),
    (["bench", "text", "--batch-size", "0"], "batch sizes are positive integers separated by commas"),
    (["bench", "speech", "--chain", "0"], "chain lengths are positive integers separated by commas"),
    (["bench", "speech", "--chain", "4,4"], "chain lengths repeat"),
    (["bench", "text", "--batch-size", "1,x"], "batch sizes are positive integers separated by commas"),
    (["bench", "text", "--batch-size", "4,4"], "batch sizes repeat"),
    (["bench", "vision", "--batch-size", "0"], "batch sizes are positive integers separated by commas"),
    (["bench", "vision", "--batch-size", "2,2"], "batch sizes repeat"),
    (["bench", "speech", "--batch-size", "1,x"], "batch sizes are positive integers separated by commas"),
    (["bench", "vision", "--num-videos", "0"], "argument --num-videos"),
    (["bench", "vision", "--std", "abc"], "K,GAMMA pairs of positive integers, got 'abc'"),
    (["bench", "vision", "--std", "1"], "K,GAMMA pairs of positive integers, got '1'"),
    (["bench", "vision", "--repeats", "0"], "argument --repeats"),
    (["bench", "vision", "--drafter-dtype", "int8"], "expected one of float32, bfloat16, float16 (or fp32, bf16, fp16), got 'int8'"),
    (["bench", "vision", "--frames", "0"], "argument --frames"),
    (["bench", "vision", "--threads", "-1"], "argument --threads"),
    (["bench", "vision", "--device", "gpu7"], "argument --device: 'gpu7' is not a device"),
    (["bench", "image", "--device", "cuda:x"], "argument --device: 'cuda:x' is not a device"),
    (["bench", "overhead", "--hidden", "7"], "argument --hidden"),
    (["bench", "overhead", "--hidden", "0"], "argument --hidden"),
    (["bench", "overhead", "--hidden", "12"], "a multiple of 8"),
    (["bench", "overhead", "--layers", "100000"], "argument --layers: expected an integer in 1..64"),
    (["bench", "overhead", "--num-prompts", "0"], "argument --num-prompts"),
    (["bench", "overhead", "--max-new-tokens", "480", "-k", "20"], "do not fit the model's 512 positions"),
    (["bench", "overhead", "--repeats", "0"], "argument --repeats"),
    (["bench", "image", "--n", "0"], "argument --n"),
    (["bench", "image", "--num-samples", "0"], "argument --num-samples"),
    (["bench", "text", "--num-samples", "-2"], "argument --num-samples"),
    (["bench", "image", "--repeats", "0"], "argument --repeats"),
    (["bench", "image", "--window", "0"], "argument --window"),
    (["bench", "image", "--temperature", NAN], "argument --temperature"),
    (["bench", "image", "--grid-out", "{tmp}/missing/grid.png"], "no existing folder '{tmp}/missing'"),
    (["bench", "image", "--threads", "-1"], "argument --threads"),
    (["bench", "speech", "--repeats", "0"], "argument --repeats"),
    (["bench", "speech", "--threads", "-1"], "argument --threads"),
]
TRAIN_DRAFTER = ["train-drafter", "--target", "x", "--data", "{data}", "--out", "{tmp}/d"]  # what the train-drafter rows extend
TRAIN = [
    ([*TRAIN_DRAFTER, "--lr", NAN], "argument --lr"),
    ([*TRAIN_DRAFTER, "--lr", "-1"], "argument --lr"),
    ([*TRAIN_DRAFTER, "--noise-std", NAN], "argument --noise-std"),
    ([*TRAIN_DRAFTER, "--noise-std", "-0.1"], "argument --noise-std"),
    ([*TRAIN_DRAFTER, "--warmup", "-1"], "argument --warmup"),
    ([*TRAIN_DRAFTER, "--checkpoint-every", "-5"], "argument --checkpoint-every"),
    ([*TRAIN_DRAFTER, "--text-fraction", "2"], "argument --text-fraction"),
    ([*TRAIN_DRAFTER, "--threads", "-1"], "argument --threads"),
    (["train-drafter", "--target", "x", "--data", "{data}", "--out", "{video}"], "exists and is not a folder"),
    (["train-drafter", "--target", "x", "--data", "{data}", "--out", "/sys/drafter"], "argument --out: cannot write"),
    (["train-drafter", "--target", "x", "--data", "{tmp}/missing", "--out", "{tmp}/d"], "argument --data: folder not found"),
    ([*TRAIN_DRAFTER, "--kind", "eagle"], "argument --kind"),
    (TRAIN_DRAFTER, "metadata.json must hold a JSON object, got a list"),
    (["train-fast-decoder", "--target", "x", "--data", "{data}", "--out", "{tmp}/d", "--steps", "0"], "argument --steps"),
    (["train-fast-decoder", "--target", "x", "--data", "{data}", "--out", "{tmp}/d", "--lr", NAN], "argument --lr"),
    (["train-fast-decoder", "--target", "x", "--data", "{data}", "--out", "{video}"], "exists and is not a folder"),
]
TRANSCRIBE = [
    (["transcribe", "{tmp}/missing.wav"], "does not exist"),
    (["transcribe", "{video}", "--max-new-tokens", "0"], "argument --max-new-tokens"),
    (["transcribe", "{video}", "--max-memory", "disk=1GB"], "the disk takes what is left"),
    (["transcribe", "{video}", "--offload-folder", "/proc/offload"], "argument --offload-folder: cannot write to '/proc'"),
    (["transcribe", "{video}", "--batch-size", "-2"], "argument --batch-size: expected an integer >= 1"),
    (["transcribe", "{video}", "--batch-size", "2"], "--batch-size applies to a folder run into --out FILE.jsonl"),
]
DEMO = [
    (["demo", "--port", "-1"], "--port must be in 1..65535"),
    (["demo", "--port", "99999"], "--port must be in 1..65535"),
]
ZOO = [
    (["zoo", "list", "--format", "x"], "unrecognized arguments"),
]
TABLES = {"caption": CAPTION, "generate": GENERATE, "generate-image": GENERATE_IMAGE, "transcribe": TRANSCRIBE,
          "bench": BENCH, "train": TRAIN, "demo": DEMO, "zoo": ZOO}
ROWS = [pytest.param(argv, expected, id=f"{verb}:{' '.join(argv[1:])[:60]}")
        for verb, table in TABLES.items() for argv, expected in table]
needs_zoo = pytest.mark.skipif(not entries(), reason="needs the zoo")
ZOO_ROWS = [pytest.param(argv, expected, id=f"zoo:{' '.join(argv)[:60]}", marks=needs_zoo)
            for argv, expected in CAPTION_WITH_ZOO + GENERATE_IMAGE_WITH_ZOO]


NO_GPU = [  # a device this machine lacks
    (["bench", "image", "--device", "cuda"], "--device cuda: this machine has no CUDA GPU that torch can use"),
    (["bench", "vision", "--device", "0"], "--device 0: this machine has no CUDA GPU that torch can use"),
    (["generate-image", "red circle", "--device", "cuda:1"], "--device cuda:1: this machine has no CUDA GPU"),
]


@pytest.fixture
def fields(tmp_path: Path) -> dict[str, str]:
    video = tmp_path / "clip.mp4"  # a readable video: the rows that reach the model's checks pass the input's probe
    video.write_bytes((Path(__file__).parents[1] / "demos" / "assets" / "shapes.mp4").read_bytes())
    (tmp_path / "folder.png").mkdir()
    pickle_only = tmp_path / "pickle-model"
    pickle_only.mkdir()
    (pickle_only / "config.json").write_text("{}")
    (pickle_only / "pytorch_model.bin").write_bytes(b"\x80\x04crafted")
    bad_card = tmp_path / "bad-card"
    bad_card.mkdir()
    (bad_card / "zoo_card.json").write_text("{not json")
    binary = tmp_path / "prompts.bin"
    binary.write_bytes(bytes(range(256)))
    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.json").write_text("[1, 2]")
    return {"tmp": str(tmp_path), "video": str(video), "pickle_only": str(pickle_only), "bad_card": str(bad_card),
            "binary": str(binary), "data": str(data)}


def run_in_process(argv: list[str], fields: dict[str, str], capsys) -> tuple[int, str]:
    code = main([arg.format(**fields) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.err


def check(code: int, err: str, expected: str, fields: dict[str, str]) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("mmspec: using ")
             and not line.startswith("mmspec: method ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("mmspec: error: ") and expected.format(**fields) in lines[0], lines[0]


@pytest.mark.parametrize("argv, expected", ROWS)
def test_bad_input_is_one_line_and_exit_2(argv, expected, fields, capsys):
    code, err = run_in_process(argv, fields, capsys)
    check(code, err, expected, fields)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")
@pytest.mark.parametrize("argv, expected", NO_GPU)
def test_a_device_the_machine_lacks_is_one_line_and_exit_2(argv, expected, fields, capsys):
    code, err = run_in_process(argv, fields, capsys)
    check(code, err, expected, fields)


@pytest.mark.timeout(300)  # these inputs once ran without bound: a hang fails the test instead of the run
@pytest.mark.parametrize("argv, expected", ZOO_ROWS)
def test_too_long_for_the_model_fails_before_running(argv, expected, fields, capsys):
    if argv[0] == "caption":
        fields = {**fields, "video": str(Path(__file__).parents[1] / "demos" / "assets" / "shapes.mp4")}
    code, err = run_in_process(argv, fields, capsys)
    check(code, err, expected, fields)


def test_malformed_zoo_card_in_the_zoo(monkeypatch, tmp_path, capsys):
    from mmspec import zoo

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "zoo_card.json").write_text('{"name": ')
    monkeypatch.setattr(zoo, "MODELS_DIR", tmp_path)
    code = main(["zoo", "list"])
    check(code, capsys.readouterr().err, "cannot read the model card", {})


def test_checks_accept_good_values(fields):
    from mmspec.cli import build_parser

    args = build_parser().parse_args(["caption", fields["video"], "--seed", str(2**64 - 1), "--fps", "2.5",
                                      "--temperature", "0", "--frames", "4"])
    assert (args.seed, args.fps, args.temperature, args.frames) == (2**64 - 1, 2.5, 0.0, 4)
    args = build_parser().parse_args(["bench", "vision", "--std", "16,3", "40,7"])
    assert args.std == [(16, 3), (40, 7)]


def test_one_size_flag_for_every_bench():
    from mmspec.cli import build_parser

    parser = build_parser()
    for bench, old in (("text", "--num-prompts"), ("vision", "--num-videos"), ("overhead", "--num-prompts"), ("image", "--n")):
        assert parser.parse_args(["bench", bench, "--num-samples", "3"]).num_samples == 3
        assert parser.parse_args(["bench", bench, old, "4"]).num_samples == 4  # the old name still works


def test_version_and_verbose_flags(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("mmspec ")
    assert main(["zoo", "list", "--json", "--verbose"]) == 0


# --- a real process: the exit status, and Ctrl-C while torch imports ---------------------------------

def mmspec_process(*argv: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "mmspec", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kwargs)


def test_exit_status_of_a_real_process(fields):
    process = mmspec_process("caption", fields["video"], "--fps", "inf")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "Traceback" not in err
    expected = "mmspec: error: argument --fps: expected a finite number, got 'inf' (see mmspec caption --help)"
    assert err.strip().splitlines() == [expected]


@pytest.mark.slow
def test_ctrl_c_while_importing_is_one_line():
    process = mmspec_process("generate", "a small red circle", "--max-new-tokens", "4")
    time.sleep(1.0)  # inside main(), importing torch (several seconds on a cold start)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    if process.returncode == 0:
        pytest.skip("the command finished before the signal arrived")
    assert process.returncode in (130, -signal.SIGINT), err  # the shell reports either as 130
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "mmspec: interrupted"



def test_ctrl_c_inside_an_import_waits_for_the_import_to_finish(tmp_path, monkeypatch):
    """A Ctrl-C landing inside an import is delivered again once the import is over: raised inside it, it could
    unwind through C++ extension code (torch's initialisation), which aborts the process. The module finishes,
    then KeyboardInterrupt comes, noted once."""
    from mmspec.cli import noted_interrupts

    (tmp_path / "module_interrupted_while_importing.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\nfor _ in range(30):\n    time.sleep(0.01)\n"
        "FINISHED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job inherits SIGINT ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            with noted_interrupts() as noted:
                try:
                    import module_interrupted_while_importing  # noqa: F401
                    for _ in range(500):  # the interrupt comes back within 0.1 s of the import's end
                        time.sleep(0.01)
                finally:
                    seen.extend(noted)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sys.modules["module_interrupted_while_importing"].FINISHED
    assert seen == [signal.SIGINT]


def test_ctrl_c_turned_into_an_import_error_is_still_an_interrupt(monkeypatch, capsys):
    """transformers' lazy importer re-raises a KeyboardInterrupt that lands mid-import as ModuleNotFoundError;
    after a Ctrl-C that is the user's interrupt (one line, 130). Control: the same error without a Ctrl-C is a bug
    and keeps its traceback."""
    import mmspec.cli as cli

    def import_interrupted(args, argv):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt as interrupt:
            raise ModuleNotFoundError("Could not import module 'PreTrainedModel'") from interrupt

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(cli, "run_verb", import_interrupted)
    # A job started in the background (`cmd &`) inherits SIGINT ignored: raise_signal would then do nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["zoo", "list"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.strip().splitlines() == ["mmspec: interrupted"]

    def import_broken(args, argv):
        raise ModuleNotFoundError("Could not import module 'PreTrainedModel'")

    monkeypatch.setattr(cli, "run_verb", import_broken)
    with pytest.raises(ModuleNotFoundError):
        main(["zoo", "list"])
    assert signal.getsignal(signal.SIGINT) is before  # the handler in place before the call is put back


@pytest.mark.slow
def test_zoo_names_never_ask_the_hub_and_hub_questions_are_bounded(monkeypatch):
    import huggingface_hub

    from mmspec import MMSpecError
    from mmspec.zoo import hub, resolve

    asked, answered, release = [], [], threading.Event()

    def stalling_hub(repo_id, timeout=None):  # a network that accepts the connection and never answers
        asked.append(repo_id)
        release.wait(60)
        answered.append(repo_id)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "model_info", stalling_hub)
    monkeypatch.setattr(hub, "HUB_ANSWER_TIMEOUT_S", 0.5)
    for entry in entries():
        if "weights_package" in entry.card:
            continue  # weights installed by a pip package and read by its own loader, not through resolve
        resolved = resolve(entry.name)  # a model that is a part of another resolves to that part, offline too
        assert resolved == str(entry.path) or "derived_from" in entry.card
    assert asked == []
    try:
        with pytest.raises(MMSpecError, match=r"did not answer within 2 s \(offline\? set HF_HUB_OFFLINE=1"):
            resolve("someone/not-cached-model", "target")
        # The refusal came while the Hub call was still stalled: the wait is bounded, not the network's.
        assert asked == ["someone/not-cached-model"] and answered == []
    finally:
        release.set()


def test_an_interrupted_write_leaves_no_partial_file(tmp_path):
    from mmspec.cli.atomic import atomic_write

    out = tmp_path / "x.png"

    def killed_half_way(path):
        path.write_bytes(b"\x89PNG half an image")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(out, killed_half_way)
    assert list(tmp_path.iterdir()) == []  # neither x.png nor the temporary file
    atomic_write(out, lambda path: path.write_bytes(b"whole"))  # the control: a finished write lands
    assert out.read_bytes() == b"whole" and list(tmp_path.iterdir()) == [out]
