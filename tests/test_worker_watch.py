"""A distributed folder run whose other process stops (SIGSTOP, a kill, a lost machine) ends with one line naming
it, within the worker timeout, instead of waiting without end at the next barrier."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mmspec.cli import worker_watch


def test_a_silent_peer_ends_the_wait_with_its_rank(tmp_path):
    released, messages = threading.Event(), []

    def silence(message):
        messages.append(message)
        released.set()

    start = time.monotonic()
    worker_watch.watched(lambda: released.wait(30), {1: tmp_path / "alive-1"}, 2, "for its files", limit=0.5,
                         on_silence=silence)
    assert time.monotonic() - start < 10
    assert len(messages) == 1 and messages[0].startswith("process 1 of 2 gave no sign of life for 0 s")
    assert "\n" not in messages[0]


def test_a_slow_peer_that_keeps_beating_is_waited_for(tmp_path):
    beat = worker_watch.Heartbeat(tmp_path / "alive-1", interval=0.1).start()
    try:
        messages = []
        result = worker_watch.watched(lambda: time.sleep(1.5) or "done", {1: beat.path}, 2, "for its files", limit=0.5,
                                      on_silence=messages.append)
    finally:
        beat.stop()
    assert result == "done" and messages == [] and not beat.path.exists()


def test_a_heartbeat_left_by_an_earlier_run_counts_from_the_start_of_the_wait(tmp_path):
    old = tmp_path / "alive-1"
    old.touch()
    os.utime(old, (0, 0))
    now = time.time()
    assert worker_watch.silent_peers({1: old}, since=now, limit=5, now=now + 1) == []
    assert worker_watch.silent_peers({1: old, 2: tmp_path / "none"}, since=now, limit=5, now=now + 6) == [1, 2]


def test_a_bad_timeout_setting_falls_back_to_the_default(monkeypatch):
    for text in ("", "soon", "-3", "0", "inf", "nan"):
        monkeypatch.setenv(worker_watch.TIMEOUT_ENV, text)
        assert worker_watch.timeout() == worker_watch.DEFAULT_TIMEOUT
    monkeypatch.setenv(worker_watch.TIMEOUT_ENV, "2.5")
    assert worker_watch.timeout() == 2.5


WORKER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from mmspec.cli.folder_runs import plan

    folder, out = sys.argv[1], sys.argv[2]

    def record_for(path):
        if os.environ["RANK"] == "1":  # this process stops for good halfway through its share
            Path(out + ".stopped-pid").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        return {"text": path.name}

    sys.exit(plan(folder, out, {".txt"}).run(record_for))
""")


@pytest.mark.slow
def test_torchrun_with_a_stopped_worker_ends_naming_it(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text("x")
    script, out = tmp_path / "worker.py", tmp_path / "r.jsonl"
    script.write_text(WORKER)
    env = {**os.environ, worker_watch.TIMEOUT_ENV: "3", "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               str(script), str(folder), str(out)]
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        _, err = launcher.communicate(timeout=120)
    finally:
        stopped = out.with_name(out.name + ".stopped-pid")
        if stopped.exists():  # the stopped worker, if the launcher left it
            try:
                os.kill(int(stopped.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode != 0
    assert "mmspec: error: process 1 of 2 gave no sign of life for 3 s" in err, err[-3000:]
    assert "Traceback" not in err.split("mmspec: error:")[0][-2000:]
