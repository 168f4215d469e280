"""What the third hardening round's guards cost a load or a reply that succeeds.

Each guard is timed next to the unguarded call it wraps, in the same run, on files like the ones
users load (the golden corpus, and a tokenizer the size of the fork's, 32,768 ids):

* bounded JSON (a linear depth and digit scan, then ``json.loads`` with hooks) vs ``json.loads``;
* bounded TOML (size, tables, dotted keys, depth scanned first) vs ``tomllib.loads``;
* ``tokenizer.json`` checks (normalizers, pre-tokenizers, decoders, ids) vs ``Tokenizer.from_str``;
* a chat template under its budget vs the same template in jinja2's plain sandbox;
* the bounded event-stream reader vs httpx-sse (when installed) on a 2,000-token reply;
* and, for scale, a whole load of the golden KempnerForge run and nanochat E7 SFT checkpoint.

Prints medians and ratios, and writes the section ``guards`` of docs/PERFORMANCE.md.

    python benchmarks/bench_guards.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_report import write_section  # noqa: E402

from desktop.engine.backend import LoadOptions  # noqa: E402
from desktop.engine.chat_template import ChatTemplate  # noqa: E402
from desktop.engine.export.hf_export import CHAT_TEMPLATE  # noqa: E402
from desktop.engine.files.bounded import parse_json, read_toml, tomllib  # noqa: E402
from desktop.engine.files.tokenizer_checks import checked_tokenizer_json  # noqa: E402
from desktop.engine.kernels.machine import machine_id  # noqa: E402
from desktop.engine.registry import open_backend  # noqa: E402
from desktop.engine.remote.sse import event_data  # noqa: E402

GOLDEN = REPO / "tests" / "golden"


def median_s(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fork_sized_tokenizer(folder: Path) -> Path:
    """A byte-level BPE of 32,768 ids saved by ``tokenizers`` (the fork's tokenizer's size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = [f"w{i:05d}x{i * 7919 % 100003}" for i in range(40_000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32_768, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([" ".join(words)] * 4, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def sse_body(tokens: int) -> bytes:
    chunk = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}],
    }
    event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return event * tokens + b"data: [DONE]\n\n"


def ours(body: bytes) -> int:
    async def chunks():
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    async def count() -> int:
        return sum([1 async for _ in event_data(chunks())])

    return asyncio.run(count())


def httpx_sse_reader(body: bytes) -> int | None:
    try:
        import httpx
        from httpx_sse import EventSource
    except ImportError:
        return None

    async def chunks():
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    async def count() -> int:
        response = httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})
        return sum([1 async for _ in EventSource(response).aiter_sse()])

    return asyncio.run(count())


def plain_sandbox(source: str) -> Callable[[list[dict[str, str]]], str]:
    """The template compiled once in jinja2's plain sandbox, as the budgeted one is."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment().from_string(source)
    return lambda messages: template.render(messages=messages, add_generation_prompt=True)


def load_s(target: Path, step: int | None = None) -> float:
    t0 = time.perf_counter()
    backend = open_backend(target, LoadOptions(step=step, device="cpu", dtype="float32"))
    took = time.perf_counter() - t0
    backend.close()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rows: list[tuple[str, float, float]] = []  # (what, guarded s, unguarded s)
    with tempfile.TemporaryDirectory() as tmp:
        big = fork_sized_tokenizer(Path(tmp))
        text = big.read_text(encoding="utf-8")
        rows.append(
            (
                f"JSON: a {len(text) >> 10} KB tokenizer.json",
                median_s(lambda: parse_json(text, big), args.repeat),
                median_s(lambda: json.loads(text), args.repeat),
            )
        )
        from tokenizers import Tokenizer

        rows.append(
            (
                "tokenizer.json: the checks (read, parse, every part) vs Tokenizer.from_str after them",
                median_s(lambda: checked_tokenizer_json(big), args.repeat),
                median_s(lambda: Tokenizer.from_str(text), args.repeat),
            )
        )
    toml = next((GOLDEN / "kempnerforge").glob("*/train.toml"))
    toml_text = toml.read_text(encoding="utf-8")
    rows.append(
        (
            "TOML: a KempnerForge training config",
            median_s(lambda: read_toml(toml), args.repeat),
            median_s(lambda: tomllib.loads(toml_text), args.repeat),
        )
    )
    conversation = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 40} for i in range(20)
    ]
    template = ChatTemplate(CHAT_TEMPLATE, Path("chat_template.jinja"), {})
    plain = plain_sandbox(CHAT_TEMPLATE)
    rows.append(
        (
            "chat template: 20 messages, budgeted vs plain sandbox",
            median_s(lambda: template.render(conversation, True), args.repeat),
            median_s(lambda: plain(conversation), args.repeat),
        )
    )
    body = sse_body(2000)
    if httpx_sse_reader(body) is not None:
        assert ours(body) == httpx_sse_reader(body)
        rows.append(
            (
                f"event stream: a 2,000-token reply ({len(body) >> 10} KB), ours vs httpx-sse",
                median_s(lambda: ours(body), args.repeat),
                median_s(lambda: httpx_sse_reader(body), args.repeat),
            )
        )
    loads = {
        "KempnerForge golden run, latest step": median_s(
            lambda: load_s(next((GOLDEN / "kempnerforge").glob("*/run"))), 5
        ),
        "nanochat E7 golden SFT checkpoint": median_s(
            lambda: load_s(next((GOLDEN / "nanochat" / "E7" / "chatsft_checkpoints").iterdir())), 5
        ),
    }

    lines = [
        f"Machine: {machine_id()} ({platform.machine()}), one thread; "
        f"medians of {args.repeat} runs in one process, each next to its baseline in the same run.",
        "",
        "| what | guarded | unguarded | ratio |",
        "|---|---|---|---|",
    ]
    for what, guarded, plain in rows:
        lines.append(f"| {what} | {guarded * 1e3:.2f} ms | {plain * 1e3:.2f} ms | {guarded / plain:.2f}x |")
    lines += ["", "Whole loads, for scale (medians of 5, guards included):", ""]
    lines += [f"- {what}: {took * 1e3:.0f} ms" for what, took in loads.items()]
    report = "\n".join(lines)
    print(report)
    write_section(REPO / "docs" / "PERFORMANCE.md", "guards", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
