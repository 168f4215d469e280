"""``nanoscope bench``: load time, prefill, decode, bandwidth utilisation, memory, prefix-cache gain.

Every speed is set against a baseline measured in the same run (the machine's copy and
matrix-vector bandwidth), because absolute numbers on a shared machine mean little.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import torch

from .generation import GenerationStats
from .sampling import SamplingParams


class IdsOnlyTokenizer:
    """Stands in when a checkpoint has no tokenizer: benchmarks feed token ids and need no text."""

    kind = "ids-only"
    path = None
    bos_id = 0
    stop_ids = frozenset()
    has_chat_tokens = False

    def __init__(self, vocab_size: int = 0) -> None:
        self.vocab_size = vocab_size
        self.warnings: list[str] = []

    def special_id(self, _name: str) -> None:
        return None

    def special_name(self, _id: int) -> None:
        return None

    def decode(self, _ids) -> str:
        return ""

    def encode(self, _text: str) -> list[int]:
        return []


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _timed(fn, device: torch.device, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(device: torch.device, dtype: torch.dtype, nbytes: int = 256 << 20) -> dict[str, float]:
    """Copy bandwidth (read + write) and matrix-vector bandwidth (weight bytes read per second)."""
    elem = torch.empty((), dtype=dtype).element_size()
    n = nbytes // elem
    src = torch.randn(n, device=device).to(dtype)
    dst = torch.empty_like(src)
    copy_s = _timed(lambda: dst.copy_(src), device)
    cols = 4096
    w = src[: (n // cols) * cols].view(-1, cols)
    x = torch.randn(1, cols, device=device).to(dtype)
    mv_s = _timed(lambda: torch.nn.functional.linear(x, w), device)
    return {"copy_gbs": 2 * n * elem / copy_s / 1e9, "matvec_gbs": w.numel() * elem / mv_s / 1e9}


def decode_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes one decode step must stream: every Linear weight plus one row of each embedding."""
    total = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            total += mod.weight.numel() * mod.weight.element_size()
        elif isinstance(mod, torch.nn.Embedding):
            total += mod.weight.shape[1] * mod.weight.element_size()
    return total


def _prompt(session, n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    top = max(2, session.loaded.config.vocab_size - 16)  # stay clear of the special tokens at the end
    return torch.randint(0, top, (n,), generator=g).tolist()


def _run(session, prompt: list[int], params: SamplingParams, reuse: bool) -> GenerationStats:
    stats = GenerationStats()
    for _ in session.generate(prompt, params, stats=stats, reuse_cache=reuse):
        pass
    return stats


def run_bench(args: argparse.Namespace) -> int:
    from .discovery import resolve_spec
    from .errors import TokenizerError
    from .loader import load_model
    from .session import ChatSession, tokenizer_dirs
    from .tokenizer import select_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    directory, step = resolve_spec(args.model)
    t0 = time.perf_counter()
    loaded = load_model(
        directory, args.step if args.step is not None else step, args.device, args.dtype, args.softcap
    )
    load_s = time.perf_counter() - t0
    try:
        tok = select_tokenizer(
            tokenizer_dirs(directory, None),
            loaded.config.vocab_size,
            loaded.config.is_fork,
            explicit=args.tokenizer,
        )
    except TokenizerError as exc:  # speed needs no text: measure with token ids alone
        print(f"nanoscope: warning: {exc}; benchmarking with token ids only", file=sys.stderr)
        tok = IdsOnlyTokenizer(loaded.config.vocab_size)
    session = ChatSession(loaded, tok)
    rss_after_load = peak_rss_bytes()
    model, cfg = session.model, session.loaded.config
    dev = session.loaded.device
    n_prompt = max(1, min(args.prompt_tokens, cfg.sequence_len - args.new_tokens - 1))
    prompt = _prompt(session, n_prompt)
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, max_tokens=args.new_tokens, seed=1
    )

    _run(session, prompt, params, reuse=False)  # warm-up
    runs = [_run(session, prompt, params, reuse=False) for _ in range(max(1, args.repeats))]
    ttft_ms = statistics.median(r.ttft_ms for r in runs)
    decode = statistics.median(r.decode_tok_s for r in runs)

    # Turn-N: a follow-up message on top of ~1000 tokens of history, with and without the prefix cache.
    hist_len = max(2, min(1000, cfg.sequence_len - 64))
    history = _prompt(session, hist_len, seed=1)
    follow = history + _prompt(session, 20, seed=2)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    _run(session, history, one, reuse=False)
    cached = _run(session, follow, one, reuse=True).ttft_ms
    full = statistics.median(_run(session, follow, one, reuse=False).ttft_ms for _ in range(3))

    bw = measure_bandwidth(dev, session.loaded.dtype)
    step_bytes = decode_bytes_per_step(model)
    bytes_per_s = step_bytes * decode
    result = {
        "model": str(directory),
        "era": cfg.era,
        "device": str(dev),
        "dtype": session.info()["dtype"],
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "load_s": round(load_s, 3),
        "prompt_tokens": n_prompt,
        "new_tokens": args.new_tokens,
        "ttft_ms": round(ttft_ms, 2),
        "prefill_tok_s": round(n_prompt / (ttft_ms / 1000), 1),
        "decode_tok_s": round(decode, 2),
        "bytes_per_step": step_bytes,
        "copy_gbs": round(bw["copy_gbs"], 2),
        "matvec_gbs": round(bw["matvec_gbs"], 2),
        "mbu_copy": round(bytes_per_s / 1e9 / bw["copy_gbs"], 3),
        "mbu_matvec": round(bytes_per_s / 1e9 / bw["matvec_gbs"], 3),
        "rss_after_load_mb": round(rss_after_load / 2**20, 1),
        "peak_rss_mb": round(peak_rss_bytes() / 2**20, 1),
        "turn_history_tokens": hist_len,
        "turn_ttft_cached_ms": round(cached, 2),
        "turn_ttft_full_ms": round(full, 2),
        "turn_ttft_ratio": round(cached / full, 3) if full else None,
    }
    if dev.type == "cuda":  # pragma: no cover - GPU only
        result["peak_vram_mb"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
    if not args.json:
        for k, v in result.items():
            print(f"{k:22} {v}")
    print(json.dumps(result))
    return 0
