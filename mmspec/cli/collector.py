"""Python's garbage collector around a command's start-up and exit.

Why: importing torch, transformers and diffusers makes about a million objects that live until the process
ends. Python's cyclic collector walks them again each time enough new objects have been made (during the
imports and the model's loading, and on the first transcription after them) and again, several times,
while the interpreter shuts down: a fifth of `import mmspec.speech.pipeline`'s CPU time, and most of a
one-off command's exit. None of those objects is garbage, so nothing is lost by not walking them:

- `collector_paused()`: no collections while a verb (transcribe, caption, generate-image) imports its
  libraries and loads its model; in a one-off process (`mmspec ...` itself, `mark_one_off()`) what was made
  is then frozen (`gc.freeze`): it lives until exit, so later collections (a transcription's) need not walk
  it either. A process that goes on (a test or a script calling `main([...])`) only pauses: a frozen object
  is never collected, and what the verb loaded becomes garbage there when the verb returns;
- `skip_walks_at_exit()`: at exit, what is left is frozen, so the shutdown's collections skip it.

Frozen objects are still freed as usual when nothing refers to them.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_registered = False
_one_off = False


def mark_one_off() -> None:
    """This process runs one command, then exits (the `mmspec` program itself)."""
    global _one_off
    _one_off = True


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collections inside the block (they resume after it, as they were); in a one-off process what was
    made by then is frozen when the block ends without an error."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if _one_off:
            gc.freeze()
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
