"""The command line's served models: ``nanoscope generate --server URL --model NAME`` and
``nanoscope list --server URL``.

An API key is read from an environment variable (``--api-key-env``, default
``NANOSCOPE_API_KEY``), never from the command line, where every user of the machine could
read it in the process list.
"""

from __future__ import annotations

import argparse
import json
import os

from desktop.cli.say import say
from desktop.engine.backend import Backend, LoadOptions
from desktop.engine.errors import NanoscopeError

KEY_ENV = "NANOSCOPE_API_KEY"
CLI_SERVER_ID = "cli"


def add_server_args(p: argparse.ArgumentParser, with_model: bool) -> None:
    p.add_argument(
        "--server", default=None, help="an OpenAI-compatible server's URL, e.g. http://gpu-box:8000"
    )
    if with_model:
        p.add_argument("--model", dest="served_model", default=None, help="the model's name on --server")
        p.add_argument(
            "--stall-timeout",
            type=float,
            default=None,
            help="seconds a reply may pause before it counts as stalled (default 30)",
        )
    p.add_argument(
        "--api-key-env",
        default=KEY_ENV,
        help=f"the environment variable holding the server's API key (default {KEY_ENV})",
    )


def _key(args: argparse.Namespace) -> str | None:
    return os.environ.get(args.api_key_env) or None


def open_served(args: argparse.Namespace) -> Backend:
    """The backend for ``--server`` / ``--model`` (NanoscopeError with one line when they do not fit)."""
    from desktop.engine.registry import open_backend
    from desktop.engine.remote.servers import remote_target

    if args.model is not None:
        raise NanoscopeError("give either a checkpoint or --server with --model, not both")
    if not args.served_model:
        raise NanoscopeError("--server needs --model NAME (nanoscope list --server URL lists them)")
    if getattr(args, "tokens", None) is not None:
        raise NanoscopeError("--tokens needs a local checkpoint: a server takes text (--chat or --prompt)")
    if args.stall_timeout is not None and args.stall_timeout <= 0:
        raise NanoscopeError(f"--stall-timeout must be positive, got {args.stall_timeout}")
    options = LoadOptions(
        server_url=args.server, api_key=_key(args), server_name="server", stall_timeout=args.stall_timeout
    )
    return open_backend(remote_target(CLI_SERVER_ID, args.served_model), options)


def list_served(args: argparse.Namespace) -> int:
    """Print the server's models (one per line, or one JSON object with ``--json``)."""
    from desktop.engine.remote.http import api_root, list_models

    served = list_models(args.server, _key(args))
    if args.json:
        say(json.dumps({"server": api_root(args.server), "models": [m.to_dict() for m in served]}))
        return 0
    if not served:
        say(f"{api_root(args.server)} lists no models (a server pinned to one model may still serve it)")
    for m in served:
        ctx = f"  context {m.context_length}" if m.context_length else ""
        say(f"{m.name}{ctx}")
    return 0
