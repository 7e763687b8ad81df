"""`mmspec demo`: the Gradio app that shows speculation at work (needs the `demo` extra)."""

from __future__ import annotations

import argparse
import os
import socket

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
    check_address(args.host, args.port)  # before gradio is imported (seconds): a bad address fails at once
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


def check_address(host: str, port: int) -> None:
    """`host` resolves, and a server socket can bind `host:port` here (the address is this machine's, the port free)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, OSError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise MMSpecError(f"cannot serve on {host}:{port}: {host!r} is not an address or host name this machine "
                          f"resolves ({reason})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: a closed earlier run's port is free
        try:
            probe.bind(address)
        except OSError as error:
            raise MMSpecError(f"cannot serve on {host}:{port}: {error.strerror or error} (pick another --host or "
                              "--port)") from None
