"""``nanoscope serve MODEL``: a local checkpoint behind an OpenAI-compatible server
(desktop/engine/serve/).

It binds 127.0.0.1 unless told otherwise. Any other address needs an API key: the one in the
environment variable ``--api-key-env`` names, else the server key kept in the OS keyring (made and
stored there the first time, and shown once then). The key never goes on the command line, where
every user of the machine could read it in the process list, nor into a log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from desktop.cli.remote import KEY_ENV
from desktop.cli.say import say, warn
from desktop.config.keystore import SERVE_KEY_ID, serve_key
from desktop.engine.backend import Backend
from desktop.engine.errors import NanoscopeError
from desktop.engine.serve.defaults import DEADLINE_S, MAX_WAITING, is_loopback

LOAD_TIMEOUT_S = 3600.0


def add_serve_parser(
    sub: argparse._SubParsersAction, add_model_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    p = sub.add_parser(
        "serve", help="serve a checkpoint over the OpenAI API (openai clients, lm-evaluation-harness)"
    )
    add_model_args(p)
    p.add_argument("--precision", dest="dtype_alias", default=None, help="the same as --dtype")
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--name", default=None, help="the model's id in the API (default: SOURCE/TAG@STEP)")
    p.add_argument("--config", type=Path, default=None, help="a KempnerForge run's training TOML")
    p.add_argument("--max-waiting", type=int, default=MAX_WAITING, help="requests queued before 429")
    p.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds a request may take in all")
    p.add_argument(
        "--api-key-env",
        default=KEY_ENV,
        help=f"the environment variable holding the key clients must give (default {KEY_ENV})",
    )


def server_key(args: argparse.Namespace) -> str | None:
    """The key clients must give: from the environment, else the keyring (made once); None on the
    loopback interface without one."""
    key = os.environ.get(args.api_key_env) or None
    if key or is_loopback(args.host):
        return key
    key, made, problem = serve_key()
    if problem:
        warn(problem)
    if made:
        say(f"a new API key for clients (kept in the OS keyring as {SERVE_KEY_ID!r}): {key}")
    else:
        say(f"clients must give the API key kept in the OS keyring ({SERVE_KEY_ID!r})")
    return key


def cmd_serve(args: argparse.Namespace, open_model: Callable[[argparse.Namespace], Backend]) -> int:
    if args.dtype_alias is not None:
        args.dtype = args.dtype_alias
    if not 1 <= args.max_waiting <= 4096:
        raise NanoscopeError(f"--max-waiting must be between 1 and 4096, got {args.max_waiting}")
    if not 0 < args.deadline <= 86400:
        raise NanoscopeError(f"--deadline must be between 0 and 86400 seconds, got {args.deadline}")
    # Here, not at the top: every command (and the window) would pay for loading the server's libraries.
    from desktop.engine.serve.app import ServeSettings, served_id
    from desktop.engine.serve.host import ModelHost
    from desktop.engine.serve.server import Server

    key = server_key(args)
    host = ModelHost(lambda: open_model(args), args.max_waiting)
    host.start()
    info = host.wait_opened(LOAD_TIMEOUT_S)
    for w in info.warnings:
        warn(w)
    settings = ServeSettings(args.name or served_id(info), key, args.deadline)
    try:
        server = Server(host, settings, args.host, args.port)
    except NanoscopeError:
        host.stop()
        raise
    say(
        f"serving {settings.model_id} ({info.family} {info.era}, {info.precision}) at {server.url} "
        "(Ctrl-C stops)",
        flush=True,
    )
    # uvicorn raises the Ctrl-C again once it has shut down: that is how serving ends.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    say("stopped serving")
    return 0
