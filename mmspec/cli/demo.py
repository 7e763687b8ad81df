"""`mmspec demo`: the Gradio app that shows speculation at work (needs the `demo` extra)."""

from __future__ import annotations

import argparse
import os

from ..errors import MMSpecError
from ..optional import ensure
from .common import SharedFlags, set_threads


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("demo", parents=[flags.threads],
                                 help="start the Gradio demo (caption, transcribe, image, bench tabs) in the browser")
    parser.add_argument("--port", type=int, default=7860, help="port to serve on (default 7860)")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise MMSpecError(f"--port must be in 1..65535, got {args.port}")
    ensure("gradio", "demo", "the demo")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # a local demo does not report usage
    from ..demo import launch

    set_threads(args)
    try:
        launch(host=args.host, port=args.port)
    except OSError as error:  # the port is taken, or the address is not this machine's
        reason = str(error).strip().splitlines()[0].split(". ")[0]
        raise MMSpecError(f"cannot serve on {args.host}:{args.port}: {reason} (pick another --port)") from None
    return 0
