"""The garbage collector around the CLI's start-up and exit (`mmspec.cli.collector`): paused while `transcribe`
imports and loads, what that made frozen in the `mmspec` program itself (not in a process that goes on), and the
shutdown's collections skipping what is left."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmspec.cli import collector, main
from mmspec.errors import MMSpecError

CLIP = Path(__file__).resolve().parents[1] / "mmspec/zoo/models/whisper-tiny.en/heldout/clip_00000.flac"


@pytest.fixture
def one_off_reset(monkeypatch):
    monkeypatch.setattr(collector, "_one_off", False)
    yield
    gc.unfreeze()  # a test must not leave this process's objects frozen


def test_paused_block_has_no_collections_and_restores_the_collector(one_off_reset):
    assert gc.isenabled()
    with collector.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0  # a process that goes on: nothing frozen
    gc.disable()
    try:
        with collector.collector_paused():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()


def test_one_off_process_freezes_what_the_block_made(one_off_reset):
    collector.mark_one_off()
    with collector.collector_paused():
        made = [object() for _ in range(10)]  # noqa: F841 - objects alive when the block ends
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_an_error_in_the_block_freezes_nothing(one_off_reset):
    collector.mark_one_off()
    with pytest.raises(MMSpecError), collector.collector_paused():
        raise MMSpecError("cannot load")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_transcribe_loads_with_the_collector_paused(one_off_reset, monkeypatch, capsys):
    from mmspec.speech.pipeline import TranscriptionPipeline

    seen = []

    def load(*args, **kwargs):
        seen.append(gc.isenabled())
        raise MMSpecError("stopped after the load began")

    monkeypatch.setattr(TranscriptionPipeline, "from_pretrained", load)
    assert main(["transcribe", str(CLIP)]) == 2
    assert "stopped after the load began" in capsys.readouterr().err
    assert seen == [False]
    assert gc.isenabled() and gc.get_freeze_count() == 0  # main([...]) is not the program itself: nothing frozen


def test_the_exit_collections_skip_what_is_left():
    # An exit handler registered before main() runs after the CLI's own (they run last in, first out).
    script = textwrap.dedent("""
        import atexit, gc
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, "collector on:", gc.isenabled()))
        from mmspec.cli import main
        main(["--version"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "frozen at exit: True collector on: True" in done.stdout
