"""Command line: ``nanoscope`` (the app), ``nanoscope list``, ``generate`` and ``bench``.

This interface is kept stable for scripting and checks. Errors print one line to stderr and
exit non-zero; no tracebacks for problems we can explain.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from desktop import __version__
from desktop.cli.evals import add_eval_parser, cmd_eval
from desktop.cli.export import add_export_parser, cmd_export
from desktop.cli.inspect import add_inspect_parser, cmd_inspect
from desktop.cli.remote import add_server_args, list_served, open_served
from desktop.cli.say import error, say, warn
from desktop.cli.serve import add_serve_parser, cmd_serve
from desktop.cli.timeline import add_timeline_parser, cmd_timeline
from desktop.config import paths
from desktop.config.logfile import SHOWN, cli_logging
from desktop.engine.backend import Backend, GenerationStats, LoadOptions, Prompt, StreamOptions
from desktop.engine.errors import NanoscopeError, is_out_of_memory
from desktop.engine.files.bounded import PathRefused, named_path, shown_path
from desktop.engine.kempnerforge.config import ConfigMemory
from desktop.engine.kernels.device import DEVICES, PRECISIONS
from desktop.engine.messages import TokenEvent
from desktop.engine.params import CHAT_DEFAULTS, KNOB, MAX_TOKENS_MAX, SamplingParams
from desktop.engine.text_lines import error_text

logger = logging.getLogger(__name__)

EXIT_ERROR = 2
# More intra-op threads than this only slows torch down, and far more crashes its thread pool.
MAX_THREADS = 1024
MAX_REPEATS = 1000
MAX_DRAFT_K = 16
# generate --compiled: the longest a load waits for the decode step's compile (a cold one on two
# busy cores takes minutes).
COMPILE_WAIT_S = 1800.0


def _add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "model",
        nargs=None if required else "?",
        help="checkpoint directory, or SOURCE[/TAG[/STEP]] with SOURCE in base|mid|sft|rl",
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument(
        "--tokenizer", type=Path, default=None, help="tokenizer.pkl / tokenizer.json or its folder"
    )
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument(
        "--dtype",
        choices=PRECISIONS,
        default="auto",
        help="float32 is exact; fast picks the quickest 16-bit form for the device; int8: x86 CPUs",
    )
    p.add_argument("--softcap", type=float, default=None, help="override the logit softcap (20 for E5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanoscope", description="Chat with and compare nanochat checkpoints."
    )
    parser.add_argument("--version", action="version", version=f"nanoscope {__version__}")
    parser.add_argument("--home", type=Path, default=None, help="keep settings and history under this folder")
    parser.add_argument(
        "--install-desktop-entry",
        action="store_true",
        help="add Nanoscope to the Linux application launcher and exit",
    )
    parser.add_argument(
        "--smoke-test",
        action="store_true",
        help="load the bundled demo, answer one question, print SMOKE OK/FAIL and exit",
    )
    parser.add_argument(
        "--open", dest="open_path", type=Path, default=None, help="open this checkpoint folder"
    )
    sub = parser.add_subparsers(dest="command")

    p_list = sub.add_parser("list", help="list the checkpoints under $NANOCHAT_BASE_DIR")
    p_list.add_argument("--json", action="store_true")
    p_list.add_argument("--base-dir", type=Path, default=None)
    add_server_args(p_list, with_model=False)

    p_gen = sub.add_parser("generate", help="generate from a checkpoint or a served model (--server)")
    _add_model_args(p_gen, required=False)
    add_server_args(p_gen, with_model=True)
    src = p_gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="completion: BOS + this text")
    src.add_argument("--chat", help="a single user turn in nanochat's chat format")
    src.add_argument("--tokens", help="exact prompt token ids, comma separated")
    p_gen.add_argument("--max-tokens", type=int, default=256)
    # The model's own distribution by default: nanochat's Engine.generate defaults (engine/params.py).
    raw = SamplingParams()
    p_gen.add_argument("--temperature", type=float, default=raw.temperature, help=KNOB["temperature"].tip)
    p_gen.add_argument("--top-k", type=int, default=raw.top_k, help="0 = off")
    p_gen.add_argument("--top-p", type=float, default=raw.top_p, help="1 = off")
    p_gen.add_argument("--min-p", type=float, default=raw.min_p, help="0 = off")
    p_gen.add_argument("--repetition-penalty", type=float, default=raw.repetition_penalty, help="1 = off")
    p_gen.add_argument("--seed", type=int, default=raw.seed)
    p_gen.add_argument(
        "--config", type=Path, default=None, help="a KempnerForge run's training TOML (remembered per run)"
    )
    p_gen.add_argument(
        "--draft",
        default="",
        help="speculative decoding (the model's own distribution, not nanochat's seeded stream): "
        "auto, int8 or fp16 (the model's own copy), mtp (the nanochat fork's multi-token-prediction "
        "head, where the checkpoint has one), or [PRECISION:]CHECKPOINT[@STEP] with the same "
        "tokenizer (a directory or SOURCE/TAG/STEP)",
    )
    p_gen.add_argument(
        "--draft-k", type=int, default=0, help=f"tokens drafted per step, 1-{MAX_DRAFT_K} (0: adaptive)"
    )
    p_gen.add_argument(
        "--compiled",
        action="store_true",
        help="fast and int8 mode: compile the decode step before generating (minutes the first time "
        "on a machine; needs a C++ compiler), as the app does in the background",
    )

    p_bench = sub.add_parser("bench", help="measure load, prefill and decode speed")
    _add_model_args(p_bench)
    p_bench.add_argument("--prompt-tokens", type=int, default=256)
    p_bench.add_argument("--new-tokens", type=int, default=64)
    p_bench.add_argument("--temperature", type=float, default=CHAT_DEFAULTS.temperature)
    p_bench.add_argument("--top-k", type=int, default=CHAT_DEFAULTS.top_k)
    p_bench.add_argument("--threads", type=int, default=None)
    p_bench.add_argument("--repeats", type=int, default=3)
    p_bench.add_argument(
        "--stream-tokens",
        type=int,
        default=2048,
        help="peak memory is measured while prompt + reply fill this many positions (capped at the context)",
    )
    p_bench.add_argument(
        "--retime",
        action="store_true",
        help="forget this machine's kernel timings and time every candidate again (e.g. after they "
        "were taken on a busy machine)",
    )
    add_export_parser(sub)
    add_timeline_parser(sub)
    add_eval_parser(sub)
    add_serve_parser(sub, _add_model_args)
    add_inspect_parser(sub, _add_model_args)
    return parser


def _summary_line(entry: Any) -> str:
    """One checkpoint's line; a checkpoint that cannot be read says why instead of its figures."""
    from desktop.engine.discovery import summarize

    try:
        s = summarize(entry.path, entry.steps[-1])
        desc = s.error or f"{s.era}, {s.params / 1e6:.1f}M params, seq {s.sequence_len}, {s.stored_dtype}"
    except Exception as exc:  # one unreadable entry must not hide the others
        logger.error("summary of %s failed", entry.path, exc_info=True, extra=SHOWN)
        desc = f"{entry.path}: cannot be read ({type(exc).__name__}: {exc})"
    steps = ", ".join(map(str, entry.steps[-5:]))
    return f"{entry.source:5} {entry.tag:12} steps [{steps}]  {desc}  ({entry.path})"


def _summary_dict(entry: Any) -> dict[str, Any]:
    from desktop.engine.discovery import summarize

    d = entry.to_dict()
    try:
        d["latest"] = summarize(entry.path, entry.steps[-1]).to_dict()
    except Exception as exc:  # as in _summary_line
        logger.error("summary of %s failed", entry.path, exc_info=True, extra=SHOWN)
        d["latest"] = {"error": f"{entry.path}: cannot be read ({type(exc).__name__}: {exc})"}
    return d


def cmd_list(args: argparse.Namespace) -> int:
    from desktop.engine.discovery import discover

    if args.server:
        return list_served(args)
    base = args.base_dir or paths.nanochat_base_dir()
    try:
        entries = discover(base)
    except OSError as exc:
        raise NanoscopeError(f"{base}: cannot list checkpoints ({exc.strerror or exc})") from None
    if args.json:
        out = [_summary_dict(e) for e in entries]
        say(json.dumps({"base_dir": str(base), "checkpoints": out}, default=str))
        return 0
    if not entries:
        say(f"no checkpoints under {base} (set NANOCHAT_BASE_DIR to look elsewhere)")
        return 0
    for e in entries:
        say(_summary_line(e))
    return 0


def open_model(args: argparse.Namespace) -> Backend:
    """The backend for ``args.model`` (a directory or SOURCE[/TAG[/STEP]]) and the load flags."""
    from desktop.engine.discovery import resolve_spec
    from desktop.engine.registry import open_backend

    if getattr(args, "server", None):
        return open_served(args)
    if args.model is None:
        raise NanoscopeError("name a checkpoint, or a served model with --server URL --model NAME")
    base = paths.nanochat_base_dir()
    directory, step = resolve_spec(args.model, base)
    config = getattr(args, "config", None)
    remembered = ConfigMemory(paths.kempnerforge_configs_file())
    options = LoadOptions(
        step=args.step if args.step is not None else step,
        device=args.device,
        dtype=args.dtype,
        tokenizer=args.tokenizer,
        softcap=args.softcap,
        base_dir=base,
        config=config or remembered.get(directory),
        kernel_cache=paths.kernel_timings_file(),
        compile_drafts=getattr(args, "compiled", False),
        compile_wait_s=COMPILE_WAIT_S if getattr(args, "compiled", False) else 0.0,
    )
    backend = open_backend(directory, options)
    if config is not None and backend.info().family == "kempnerforge":
        remembered.remember(Path(backend.info().path), config)
    return backend


def _prompt(args: argparse.Namespace, backend: Backend) -> Prompt:
    from desktop.engine.messages import Message

    if args.tokens is not None:
        try:
            ids = [int(t) for t in args.tokens.replace(" ", "").split(",") if t]
        except ValueError:
            raise NanoscopeError("--tokens must be comma-separated integers") from None
        vocab = backend.info().vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise NanoscopeError(f"--tokens: ids out of range for vocab {vocab}: {bad[:5]}")
        return Prompt((), tuple(ids), len(ids), backend.info().context_length)
    if args.chat is not None:
        return backend.render([Message.of_text("user", args.chat)], None, chat=True)
    return backend.render(args.prompt, None)


def cmd_generate(args: argparse.Namespace) -> int:
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
    except ValueError as exc:
        raise NanoscopeError(str(exc)) from None
    if not 0 <= args.draft_k <= MAX_DRAFT_K:
        raise NanoscopeError(f"--draft-k must be between 0 and {MAX_DRAFT_K}, got {args.draft_k}")
    if args.draft_k and not args.draft:
        raise NanoscopeError("--draft-k needs --draft")
    draft = _draft(args.draft, paths.nanochat_base_dir()) if args.draft else ""
    backend = open_model(args)
    info = backend.info()
    if draft and info.capabilities.why_not("draft"):
        backend.close()
        raise NanoscopeError(f"--draft: {info.capabilities.why_not('draft')}")
    prompt = _prompt(args, backend)
    if info.context_length and prompt.tokens + args.max_tokens > info.context_length:
        warn(
            f"context of {prompt.tokens + args.max_tokens} tokens exceeds the model's "
            f"sequence_len {info.context_length}; "
            + (
                "the reply stops there"
                if info.family == "kempnerforge"
                else "quality degrades and even L layers become windowed"
            )
        )
    for w in info.warnings:
        warn(w)
    stats = GenerationStats()
    produced: list[int] = []
    options = StreamOptions(draft=draft, draft_k=args.draft_k)
    for ev in _closing(backend, backend.stream(prompt, params, threading.Event(), options, stats)):
        if ev.continues:
            if not args.json:
                sys.stdout.write(ev.text)
            continue
        produced.append(ev.id)
        if args.json:
            record = {"id": ev.id, "text": ev.text, "forced": ev.forced}
            if ev.draft:
                record["draft"] = ev.draft
            say(json.dumps(record), flush=True)
        else:
            sys.stdout.write(ev.text if ev.special is None else _special_text(ev))
            sys.stdout.flush()
    if args.compiled and not stats.step_compiled:
        # Asked for and not given: say why (only fast and int8 mode of a nanochat checkpoint on a
        # CPU compile their steps).
        why = (
            stats.step_eager
            or "only fast and int8 mode of a nanochat checkpoint on a CPU compile their steps"
        )
        warn(f"--compiled: {why}")
    if stats.stopped == "context":
        warn(f"the reply stopped at the model's context of {info.context_length} tokens")
    if args.json:
        say(
            json.dumps(
                {
                    "done": True,
                    "ids": produced,
                    "prompt_ids": list(prompt.ids or ()),
                    "prompt_tokens": stats.prompt_tokens,
                    "ttft_ms": round(stats.ttft_ms, 3),
                    "decode_tok_s": round(stats.decode_tok_s, 3),
                    "drafted": stats.drafted,
                    "step_compiled": stats.step_compiled,
                    "step_eager": stats.step_eager,
                    "accepted": stats.accepted,
                    "device": info.device,
                    "dtype": info.precision,
                    "era": info.era,
                }
            )
        )
    else:
        say()
    return 0


def _draft(text: str, base: Path) -> str:
    """``--draft`` as the backends take it: a checkpoint named SOURCE/TAG[/STEP] becomes its
    directory and step; a name that is neither a precision nor a checkpoint is one line."""
    from desktop.engine.decode.drafts import AUTO, parse_draft
    from desktop.engine.discovery import resolve_spec

    try:
        spec = parse_draft(text)
        if spec.is_self or spec.checkpoint is None or spec.checkpoint.exists():
            return text
        directory, step = resolve_spec(str(spec.checkpoint), base)
    except PathRefused as exc:  # it names the path already
        raise NanoscopeError(f"--draft: {exc}") from None
    except NanoscopeError as exc:
        raise NanoscopeError(f"--draft {shown_path(text)}: {exc}") from None
    step = spec.step if spec.step is not None else step
    prefix = f"{spec.precision}:" if spec.precision != AUTO else ""
    return f"{prefix}{directory}" + (f"@{step}" if step is not None else "")


def _closing(backend: Backend, events: Iterator[TokenEvent]) -> Iterator[TokenEvent]:
    """``events``, then the backend closed (a served model's connections and loop)."""
    try:
        yield from events
    finally:
        backend.close()


def _special_text(ev) -> str:
    """Show tool-call delimiters in plain-text output so calculator use is visible."""
    return {
        "<|python_start|>": "[calc: ",
        "<|python_end|>": "]",
        "<|output_start|>": " = ",
        "<|output_end|>": " ",
    }.get(ev.special or "", "") + ev.text


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure one checkpoint; a table (unless --json) and, last, one JSON line."""
    from desktop.engine.bench import BenchRequest, run_bench
    from desktop.engine.discovery import resolve_spec

    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise NanoscopeError(f"--threads must be between 1 and {MAX_THREADS}, got {args.threads}")
    for flag, value, most in (
        ("--new-tokens", args.new_tokens, MAX_TOKENS_MAX),
        ("--prompt-tokens", args.prompt_tokens, MAX_TOKENS_MAX),
        ("--repeats", args.repeats, MAX_REPEATS),
        ("--stream-tokens", args.stream_tokens, MAX_TOKENS_MAX),
    ):
        if not 1 <= value <= most:
            raise NanoscopeError(f"{flag} must be between 1 and {most}, got {value}")
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k)
    except ValueError as exc:
        raise NanoscopeError(str(exc)) from None
    base = paths.nanochat_base_dir()
    directory, step = resolve_spec(args.model, base)
    request = BenchRequest(
        directory=directory,
        step=args.step if args.step is not None else step,
        device=args.device,
        dtype=args.dtype,
        softcap=args.softcap,
        tokenizer=args.tokenizer,
        base_dir=base,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        params=params,
        threads=args.threads,
        repeats=args.repeats,
        stream_tokens=args.stream_tokens,
        kernel_cache=paths.kernel_timings_file(),
        retime=args.retime,
    )
    result = run_bench(request, warn=warn)
    if not args.json:
        for k, v in result.items():
            values = v if isinstance(v, list) else [v]  # the kernels: one line each
            for i, value in enumerate(values or [""]):
                say(f"{k if i == 0 else '':22} {value}")
    say(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every path flag (--home, --base-dir, --tokenizer, --config, --hf, --open), before any is used
        for value in vars(args).values():
            if isinstance(value, Path):
                named_path(value)
    except PathRefused as exc:
        error(exc)
        return EXIT_ERROR
    if args.home is not None:
        if args.home.exists() and not args.home.is_dir():
            error(f"--home {args.home} is a file, not a folder")
            return EXIT_ERROR
        paths.set_home(args.home)
    # --home or NANOSCOPE_HOME alike, before logging, threads or Qt start.
    problem = paths.unusable_home()
    if problem is not None:
        error(problem)
        return EXIT_ERROR
    handlers = {
        "list": cmd_list,
        "generate": cmd_generate,
        "bench": cmd_bench,
        "export": cmd_export,
        "timeline": cmd_timeline,
        "eval": cmd_eval,
        "serve": lambda a: cmd_serve(a, open_model),
        "inspect": lambda a: cmd_inspect(a, open_model),
    }
    with cli_logging():  # errors (and the GUI's whole run) also go to the log file
        try:
            if args.command is None:  # the GUI: `nanoscope`, `nanoscope-gui`, the frozen app
                from desktop.qt.app.app import run_app

                return run_app(args)
            return handlers[args.command](args)
        except NanoscopeError as exc:
            logger.error("%s", exc, extra=SHOWN)
            error(exc)
            return EXIT_ERROR
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # `nanoscope ... | head`: the reader left; say nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except BaseException as exc:
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise  # SystemExit and the like; a Rust panic is an error like any other here
            if isinstance(exc, (MemoryError, RuntimeError)) and is_out_of_memory(exc):
                logger.error("out of memory: %s", exc, extra=SHOWN)
                error("out of memory; try --dtype bfloat16, another --device or a smaller checkpoint")
                return EXIT_ERROR
            # Not an error we know how to explain: one line here, the traceback in the log file.
            logger.critical("Uncaught exception", exc_info=True, extra=SHOWN)
            error(f"unexpected {error_text(exc, named=True)} (details in the log file)")
            return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
