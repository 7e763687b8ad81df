"""Run a pipeline call in a worker thread and hand its rounds to the page as they come."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

RoundsSoFar = list  # of RoundInfo


def stream_rounds(call: Callable[..., Any], *, interval_s: float = 0.1, **kwargs: Any) -> Iterator[tuple[RoundsSoFar, Any]]:
    """Yield `(rounds so far, None)` at most every `interval_s` while `call(**kwargs, callback_on_round=...)`
    runs, then `(all rounds, its output)` once. An exception in the call is raised here."""
    events: queue.Queue = queue.Queue()

    def on_round(_index: int, info: Any) -> None:
        events.put(("round", info))

    def work() -> None:
        try:
            events.put(("done", call(**kwargs, callback_on_round=on_round)))
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread, raised there
            events.put(("error", error))

    threading.Thread(target=work, daemon=True, name="mmspec-demo-call").start()
    rounds: RoundsSoFar = []
    last = 0.0
    while True:
        kind, value = events.get()
        if kind == "round":
            rounds.append(value)
            if time.monotonic() - last >= interval_s:
                last = time.monotonic()
                yield list(rounds), None
        elif kind == "done":
            yield list(rounds), value
            return
        else:
            raise value
