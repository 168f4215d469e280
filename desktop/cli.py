"""Command line: ``nanoscope`` (the app), ``nanoscope list``, ``generate`` and ``bench``.

This interface is kept stable for scripting and checks. Errors print one line to stderr and
exit non-zero; no tracebacks for problems we can explain.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import __version__
from .engine.device import DEVICES, PRECISIONS
from .engine.errors import NanoscopeError, is_out_of_memory
from .logfile import SHOWN, cli_logging

logger = logging.getLogger(__name__)

EXIT_ERROR = 2


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", help="checkpoint directory, or SOURCE[/TAG[/STEP]] with SOURCE in base|mid|sft|rl"
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

    p_gen = sub.add_parser("generate", help="generate from a checkpoint")
    _add_model_args(p_gen)
    src = p_gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="completion: BOS + this text")
    src.add_argument("--chat", help="a single user turn in nanochat's chat format")
    src.add_argument("--tokens", help="exact prompt token ids, comma separated")
    p_gen.add_argument("--max-tokens", type=int, default=256)
    p_gen.add_argument("--temperature", type=float, default=1.0)
    p_gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    p_gen.add_argument("--top-p", type=float, default=1.0)
    p_gen.add_argument("--min-p", type=float, default=0.0)
    p_gen.add_argument("--repetition-penalty", type=float, default=1.0)
    p_gen.add_argument("--seed", type=int, default=42)

    p_bench = sub.add_parser("bench", help="measure load, prefill and decode speed")
    _add_model_args(p_bench)
    p_bench.add_argument("--prompt-tokens", type=int, default=256)
    p_bench.add_argument("--new-tokens", type=int, default=64)
    p_bench.add_argument("--temperature", type=float, default=0.8)
    p_bench.add_argument("--top-k", type=int, default=50)
    p_bench.add_argument("--threads", type=int, default=None)
    p_bench.add_argument("--repeats", type=int, default=3)
    return parser


def cmd_list(args: argparse.Namespace) -> int:
    from .engine.discovery import discover, nanochat_base_dir, summarize

    base = args.base_dir or nanochat_base_dir()
    entries = discover(base)
    if args.json:
        out = []
        for e in entries:
            d = e.to_dict()
            d["latest"] = summarize(e.path, e.steps[-1]).to_dict()
            out.append(d)
        print(json.dumps({"base_dir": str(base), "checkpoints": out}))
        return 0
    if not entries:
        print(f"no checkpoints under {base} (set NANOCHAT_BASE_DIR to look elsewhere)")
        return 0
    for e in entries:
        s = summarize(e.path, e.steps[-1])
        desc = s.error or f"{s.era}, {s.params / 1e6:.1f}M params, seq {s.sequence_len}, {s.stored_dtype}"
        steps = ", ".join(map(str, e.steps[-5:]))
        print(f"{e.source:5} {e.tag:12} steps [{steps}]  {desc}  ({e.path})")
    return 0


def _open_session(args: argparse.Namespace):
    from .engine.discovery import resolve_spec
    from .engine.session import ChatSession, SessionOptions

    directory, step = resolve_spec(args.model)
    opts = SessionOptions(
        step=args.step if args.step is not None else step,
        device=args.device,
        dtype=args.dtype,
        tokenizer=args.tokenizer,
        softcap=args.softcap,
    )
    return ChatSession.open(directory, opts)


def _prompt_ids(args: argparse.Namespace, session) -> list[int]:
    from .engine.chat_format import render_completion_prompt, render_for_completion
    from .engine.errors import TokenizerError
    from .engine.messages import Message

    tok = session.tok
    if args.tokens is not None:
        try:
            ids = [int(t) for t in args.tokens.replace(" ", "").split(",") if t]
        except ValueError:
            raise NanoscopeError("--tokens must be comma-separated integers") from None
        bad = [i for i in ids if not 0 <= i < session.loaded.config.vocab_size]
        if bad:
            raise NanoscopeError(
                f"--tokens: ids out of range for vocab {session.loaded.config.vocab_size}: {bad[:5]}"
            )
        return ids
    if args.chat is not None:
        if not tok.has_chat_tokens:
            raise TokenizerError(f"{tok.path}: this tokenizer has no chat tokens; use --prompt")
        return render_for_completion(tok, [Message.of_text("user", args.chat)], None).ids
    return render_completion_prompt(tok, args.prompt, None).ids


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine.generation import GenerationStats
    from .engine.sampling import SamplingParams

    session = _open_session(args)
    ids = _prompt_ids(args, session)
    seq = session.loaded.config.sequence_len
    if len(ids) + args.max_tokens > seq:
        print(
            f"nanoscope: warning: context of {len(ids) + args.max_tokens} tokens exceeds the model's "
            f"sequence_len {seq}; quality degrades and even L layers become windowed",
            file=sys.stderr,
        )
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
    for w in session.loaded.warnings:
        print(f"nanoscope: warning: {w}", file=sys.stderr)
    stats = GenerationStats()
    produced: list[int] = []
    for ev in session.generate(ids, params, stats=stats):
        if ev.id >= 0:
            produced.append(ev.id)
        if args.json:
            if ev.id >= 0:
                print(json.dumps({"id": ev.id, "text": ev.text, "forced": ev.forced}), flush=True)
        else:
            sys.stdout.write(ev.text if ev.special is None else _special_text(ev))
            sys.stdout.flush()
    info = session.info()
    if args.json:
        print(
            json.dumps(
                {
                    "done": True,
                    "ids": produced,
                    "prompt_tokens": stats.prompt_tokens,
                    "ttft_ms": round(stats.ttft_ms, 3),
                    "decode_tok_s": round(stats.decode_tok_s, 3),
                    "device": info["device"],
                    "dtype": info["dtype"],
                    "era": info["era"],
                }
            )
        )
    else:
        print()
    return 0


def _special_text(ev) -> str:
    """Show tool-call delimiters in plain-text output so calculator use is visible."""
    return {
        "<|python_start|>": "[calc: ",
        "<|python_end|>": "]",
        "<|output_start|>": " = ",
        "<|output_end|>": " ",
    }.get(ev.special or "", "") + ev.text


def cmd_bench(args: argparse.Namespace) -> int:
    from .engine.bench import run_bench

    return run_bench(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.home is not None:
        from . import paths

        paths.set_home(args.home)
    handlers = {"list": cmd_list, "generate": cmd_generate, "bench": cmd_bench}
    with cli_logging():  # errors (and the GUI's whole run) also go to the log file
        try:
            if args.command is None:  # the GUI: `nanoscope`, `nanoscope-gui`, the frozen app
                from .app import run_app

                return run_app(args)
            return handlers[args.command](args)
        except NanoscopeError as exc:
            logger.error("%s", exc, extra=SHOWN)
            print(f"nanoscope: error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            logger.error("out of memory: %s", exc, extra=SHOWN)
            print(
                "nanoscope: error: out of memory; "
                "try --dtype bfloat16, another --device or a smaller checkpoint",
                file=sys.stderr,
            )
            return EXIT_ERROR
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
