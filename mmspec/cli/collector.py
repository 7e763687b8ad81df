"""Python's garbage collector around a command's start-up and exit.

Why: importing torch, transformers and diffusers makes millions of objects that live until the process
ends. Python's cyclic collector walks the older ones again each time enough new objects have been made
(during the imports and the model's loading) and again, several times, while the interpreter shuts
down: on the 2-core machine a quarter of `import mmspec.speech.pipeline`'s CPU time, and over a second
of a one-off `mmspec transcribe`'s exit. None of those objects is garbage, so nothing is lost by not
walking them:

- `collector_paused()`: no collections while a verb imports its libraries and loads its model;
- `skip_walks_at_exit()`: at exit, what was made is frozen (`gc.freeze`), so the shutdown's collections
  skip it; the objects are still freed as usual when nothing refers to them.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_registered = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collections inside the block (they resume after it, as they were)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _freeze_for_exit() -> None:
    gc.collect(1)  # the young garbage (the last command's own) is still collected, its finalizers run
    gc.freeze()


def skip_walks_at_exit() -> None:
    """At interpreter exit (an exit handler), freeze every object left so the shutdown's collections skip them.
    Registered once; in a process that goes on (a test calling `main`), nothing changes until that process ends."""
    global _registered
    if not _registered:
        atexit.register(_freeze_for_exit)
        _registered = True
