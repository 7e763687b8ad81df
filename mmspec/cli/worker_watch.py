"""Bounded waits between the processes of a distributed folder run.

Each process of `torchrun ... -m mmspec caption DIR --out r.jsonl` touches a small heartbeat file beside
the results file every few seconds, from a thread, from the moment its run is planned (before its model
loads) to its end. A process waiting for the others (the rendezvous, a barrier) watches their heartbeats;
one that stays silent for `timeout()` seconds (stopped, killed, its machine gone) ends the wait with one
line naming it, instead of a wait without end. A slow process is not a silent one: its thread keeps
beating while it loads a model or decodes a long file.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

TIMEOUT_ENV = "MMSPEC_WORKER_TIMEOUT"
DEFAULT_TIMEOUT = 60.0  # seconds a process may stay silent before the others give up on it

Result = TypeVar("Result")


def timeout() -> float:
    """`$MMSPEC_WORKER_TIMEOUT` seconds (a positive number), else `DEFAULT_TIMEOUT`."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if 0 < value < float("inf") else DEFAULT_TIMEOUT


def heartbeat_path(out: Path, rank: int) -> Path:
    return out.parent / f".{out.name}.alive-{rank}"


class Heartbeat:
    """A daemon thread touching `path` every `interval` seconds until `stop()` (which removes the file)."""

    def __init__(self, path: Path, interval: float) -> None:
        self.path, self.interval = path, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"mmspec heartbeat {path.name}", daemon=True)

    def start(self) -> Heartbeat:
        self._beat_once()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval):
            self._beat_once()

    def _beat_once(self) -> None:
        try:
            self.path.touch()
        except OSError:  # a full or read-only disk: the others will call this process silent, which it then is
            pass


def silent_peers(peers: dict[int, Path], since: float, limit: float, now: float | None = None) -> list[int]:
    """The ranks whose heartbeat is older than `limit` seconds, counting from `since` at the earliest (a file
    left by an earlier run, or none yet, gives a peer the whole `limit` from the start of the wait)."""
    now = time.time() if now is None else now
    silent = []
    for rank, path in sorted(peers.items()):
        try:
            beat = path.stat().st_mtime
        except OSError:
            beat = 0.0
        if now - max(beat, since) > limit:
            silent.append(rank)
    return silent


def missing_message(ranks: list[int], size: int, limit: float, what: str) -> str:
    names = ", ".join(str(rank) for rank in ranks)
    who = f"process {names}" if len(ranks) == 1 else f"processes {names}"
    return (f"{who} of {size} gave no sign of life for {limit:.0f} s while the others waited {what} (stopped or "
            f"killed?): giving up; the files it finished stay in its part file and a re-run merges them and does the "
            f"rest (${TIMEOUT_ENV} sets the wait)")


def give_up(message: str) -> None:
    """End this process with the one-line error: the wait is inside a collective call that cannot be interrupted."""
    print(f"mmspec: error: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def watched(wait: Callable[[], Result], peers: dict[int, Path], size: int, what: str, limit: float | None = None,
            on_silence: Callable[[str], None] = give_up) -> Result:
    """`wait()` (a rendezvous or barrier), while a watchdog calls `on_silence(message)` once if a peer stays silent."""
    limit = timeout() if limit is None else limit
    since = time.time()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(min(1.0, limit / 4)):
            silent = silent_peers(peers, since, limit)
            if silent:
                on_silence(missing_message(silent, size, limit, what))
                return

    watchdog = threading.Thread(target=watch, name="mmspec worker watchdog", daemon=True)
    watchdog.start()
    try:
        return wait()
    finally:
        done.set()
        watchdog.join()
