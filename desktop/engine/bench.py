"""``nanoscope bench``: load time, prefill, decode, bandwidth utilisation, memory, prefix-cache gain.

Memory is reported twice: after loading, and at the peak of streaming a long reply (``stream_tokens``
positions, 2,048 by default), each against a budget.

Every speed is set against bandwidths measured in the same run on the same device, because
absolute numbers on a shared machine mean little. :func:`run_bench` returns the figures; the
CLI prints them.
"""

from __future__ import annotations

import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch

from desktop.engine.backend import Backend, GenerationStats, Prompt, StreamOptions
from desktop.engine.kernels.gemv import ExactLinear
from desktop.engine.kernels.tuning import tuner_for
from desktop.engine.nanochat.config import ModelConfig, table_bytes
from desktop.engine.params import CHAT_DEFAULTS, SamplingParams


class IdsOnlyTokenizer:
    """Stands in when a checkpoint has no tokenizer: benchmarks feed token ids and need no text."""

    kind = "ids-only"
    path = Path("(no tokenizer)")
    bos_id = 0
    stop_ids: frozenset[int] = frozenset()
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

    def encode(self, _text: str, cancel: threading.Event | None = None) -> list[int]:
        return []


def peak_rss_bytes() -> int:
    """The process's peak resident memory. On Linux VmHWM, because ``ru_maxrss`` survives exec
    and so counts the parent's memory in a process started from a big one (a benchmark)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def current_rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


def reset_peak_rss() -> bool:
    """Start the peak count afresh, so that :func:`peak_rss_bytes` gives the peak of what runs next
    (Linux: writing 5 to ``/proc/self/clear_refs`` resets VmHWM). False where that is not possible:
    the peak then still counts everything since the process started."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _timed(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stream_triad_gbs(device: torch.device, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """GB/s of STREAM's triad, ``a = b + s * c``, over three arrays of ``nbytes`` each (far larger
    than any CPU's caches), on every thread torch uses, counted as STREAM counts it (two arrays
    read, one written). The ceiling a decode step's weights can stream at: the figure each mode
    is reported against (``mbu_stream``)."""
    n = nbytes // 4
    b = torch.rand(n, device=device)
    c = torch.rand(n, device=device)
    a = torch.empty_like(b)
    seconds = _timed(lambda: torch.add(b, c, alpha=3.0, out=a), device, repeats)
    return 3 * nbytes / seconds / 1e9


def measure_bandwidth(device: torch.device, nbytes: int = 256 << 20) -> dict[str, float]:
    """GB/s of streaming ``nbytes``: STREAM's triad (:func:`stream_triad_gbs`), copy (read +
    write), plain read (a sum), and the matrix-vector
    product of a 4096-column fp32 matrix by one row, as torch's ``F.linear`` runs it and as exact
    mode's row-split runs it. ``matvec_gbs`` is the better of the two: the ceiling a decode step's
    products can reach on this machine. On a GPU the matrix is bf16, as fast mode reads it there."""
    triad = stream_triad_gbs(device, nbytes)  # first: its arrays are freed before the others'
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elem = torch.empty((), dtype=dtype).element_size()
    n = nbytes // elem
    src = torch.randn(n, device=device).to(dtype)
    dst = torch.empty_like(src)
    out = {"copy_gbs": 2 * nbytes / _timed(lambda: dst.copy_(src), device)}
    dst.resize_(0)  # free it before the next measurements
    out["read_gbs"] = nbytes / _timed(lambda: src.sum(), device)
    w = src.view(-1, 4096)
    x = torch.randn(1, 4096, device=device).to(dtype)
    with torch.inference_mode():
        out["linear_gbs"] = nbytes / _timed(lambda: torch.nn.functional.linear(x, w), device)
        split = ExactLinear(w)
        out["split_gbs"] = nbytes / _timed(lambda: split(x), device)
    out["matvec_gbs"] = max(out["linear_gbs"], out["split_gbs"])
    return {**{k: v / 1e9 for k, v in out.items()}, "stream_gbs": triad}


def _prompt(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    top = max(2, vocab_size - 16)  # stay clear of the special tokens at the end
    return torch.randint(0, top, (n,), generator=g).tolist()


def _run(backend: Backend, prompt: list[int], params: SamplingParams, reuse: bool) -> GenerationStats:
    stats = GenerationStats()
    ids = Prompt((), tuple(prompt), len(prompt), backend.info().context_length)
    for _ in backend.stream(ids, params, threading.Event(), StreamOptions(reuse_cache=reuse), stats):
        pass
    return stats


def turn_ttft(backend: Backend, vocab_size: int, history_len: int, repeats: int = 3) -> tuple[float, float]:
    """Median ms to the first token of a 20-token follow-up after ``history_len`` tokens of
    conversation: (with the prefix cache, re-prefilling everything)."""
    history = _prompt(vocab_size, history_len, seed=1)
    follow = history + _prompt(vocab_size, 20, seed=2)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    # The previous turn's reply, as in a chat: its cache then has room for the next message.
    reply = SamplingParams(temperature=0.0, max_tokens=21)
    cached, full = [], []
    for _ in range(repeats):
        _run(backend, history, reply, reuse=False)
        cached.append(_run(backend, follow, one, reuse=True).ttft_ms)
        full.append(_run(backend, follow, one, reuse=False).ttft_ms)
    return statistics.median(cached), statistics.median(full)


def kv_cache_bytes(cfg: ModelConfig, positions: int, dtype: torch.dtype) -> int:
    """Bytes of a batch-1 KV cache (with the per-position state some eras keep) for ``positions``."""
    elem = torch.empty((), dtype=dtype).element_size()
    return table_bytes(replace(cfg, sequence_len=positions), elem)["KV cache"]


# What the process holds besides the weights and the KV cache: interpreter, torch, activations.
RSS_OVERHEAD = 300 << 20


def stream_memory(
    backend: Backend, cfg: ModelConfig, dtype: torch.dtype, file_bytes: int, positions: int
) -> dict:
    """Peak RSS while one reply streams until prompt + reply fill ``positions`` (at most the model's
    context; the prompt is the first half), against checkpoint + KV cache + 300 MB. ``backend``
    must not stop early (an ids-only tokenizer has no stop tokens)."""
    n = max(2, min(positions, cfg.sequence_len))
    n_prompt = n // 2
    prompt = _prompt(cfg.vocab_size, n_prompt, seed=3)
    params = CHAT_DEFAULTS.with_values(max_tokens=n - n_prompt, seed=1)
    scoped = reset_peak_rss()
    before = current_rss_bytes()
    stats = _run(backend, prompt, params, reuse=False)
    peak = peak_rss_bytes()
    budget = file_bytes + kv_cache_bytes(cfg, n, dtype) + RSS_OVERHEAD
    return {
        "stream_positions": n_prompt + stats.new_tokens,
        "stream_prompt_tokens": n_prompt,
        "kv_cache_mb": round(kv_cache_bytes(cfg, n, dtype) / 2**20, 1),
        # "stream": the peak of the stream alone; "process": since start (no way to reset it here).
        "stream_peak_scope": "stream" if scoped else "process",
        "stream_start_rss_mb": round(before / 2**20, 1),
        "stream_peak_rss_mb": round(peak / 2**20, 1),
        "stream_rss_budget_mb": round(budget / 2**20, 1),
        "stream_within_budget": peak <= budget,
    }


@dataclass(frozen=True)
class BenchRequest:
    directory: Path
    step: int | None
    device: str = "auto"
    dtype: str = "auto"
    softcap: float | None = None
    tokenizer: Path | None = None
    base_dir: Path | None = None
    prompt_tokens: int = 256
    new_tokens: int = 64
    params: SamplingParams = CHAT_DEFAULTS
    threads: int | None = None
    repeats: int = 3
    stream_tokens: int = 2048
    kernel_cache: Path | None = None  # this machine's kernel timings (see kernel_tuning)
    retime: bool = False  # forget them first


def run_bench(req: BenchRequest, warn: Callable[[str], None]) -> dict:
    """Load, measure, and return every figure (``warn`` gets what the caller should be told)."""
    from desktop.engine.errors import TokenizerError
    from desktop.engine.nanochat.backend import NanochatBackend, tokenizer_dirs
    from desktop.engine.nanochat.loader import load_model
    from desktop.engine.nanochat.tokenizer import select_tokenizer

    if req.threads:
        torch.set_num_threads(req.threads)
    directory, step = req.directory, req.step
    t0 = time.perf_counter()
    tuner = tuner_for(req.kernel_cache)
    if req.retime:
        tuner.forget()
    timed_before = tuner.measured
    loaded = load_model(directory, step, req.device, req.dtype, req.softcap, kernel_cache=req.kernel_cache)
    load_s = time.perf_counter() - t0
    rss_after_load = peak_rss_bytes()
    cfg = loaded.config
    try:
        tok = select_tokenizer(
            tokenizer_dirs(directory, req.base_dir), cfg.vocab_size, cfg.is_fork, explicit=req.tokenizer
        )
    except TokenizerError as exc:  # speed needs no text: measure with token ids alone
        warn(f"{exc}; benchmarking with token ids only")
        tok = IdsOnlyTokenizer(cfg.vocab_size)
    backend = NanochatBackend(loaded, tok)
    dev = loaded.device
    n_prompt = max(1, min(req.prompt_tokens, cfg.sequence_len - req.new_tokens - 1))
    prompt = _prompt(cfg.vocab_size, n_prompt)
    params = req.params.with_values(max_tokens=req.new_tokens, seed=1)

    _run(backend, prompt, params, reuse=False)  # warm-up
    runs = [_run(backend, prompt, params, reuse=False) for _ in range(max(1, req.repeats))]
    ttft_ms = statistics.median(r.ttft_ms for r in runs)
    decode = statistics.median(r.decode_tok_s for r in runs)
    hist_len = max(2, min(1000, cfg.sequence_len - 64))
    cached, full = turn_ttft(backend, cfg.vocab_size, hist_len)

    bw = measure_bandwidth(dev)
    peak_rss = peak_rss_bytes()  # before the stream below starts its own count
    file_bytes = loaded.model_file.stat().st_size
    backend.reset_cache()  # the stream's KV cache is the only one held while it runs
    ids_only = NanochatBackend(loaded, IdsOnlyTokenizer(cfg.vocab_size))
    stream = stream_memory(ids_only, cfg, loaded.model.compute_dtype, file_bytes, req.stream_tokens)
    step_bytes = loaded.model.decode_bytes()
    streamed_gbs = step_bytes * decode / 1e9
    result = {
        "model": str(directory),
        "step": loaded.step,
        "era": cfg.era,
        "device": str(dev),
        "dtype": loaded.precision.name,
        "threads": torch.get_num_threads(),
        "params": loaded.n_params,
        "load_s": round(load_s, 3),
        "prompt_tokens": n_prompt,
        "new_tokens": req.new_tokens,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "ttft_ms": round(ttft_ms, 2),
        "prefill_tok_s": round(n_prompt / (ttft_ms / 1000), 1),
        "decode_tok_s": round(decode, 2),
        "bytes_per_step": step_bytes,
        "streamed_gbs": float(f"{streamed_gbs:.3g}"),
        **{k: round(v, 2) for k, v in bw.items()},
        # Three significant figures: a tiny model on a busy machine is still not reported as 0.
        "mbu_stream": float(f"{streamed_gbs / bw['stream_gbs']:.3g}"),
        "mbu_matvec": float(f"{streamed_gbs / bw['matvec_gbs']:.3g}"),
        "mbu_read": float(f"{streamed_gbs / bw['read_gbs']:.3g}"),
        "mbu_copy": float(f"{streamed_gbs / bw['copy_gbs']:.3g}"),
        "checkpoint_mb": round(file_bytes / 2**20, 1),
        "rss_after_load_mb": round(rss_after_load / 2**20, 1),
        # The load budget: the checkpoint's bytes + 15% + 300 MB (interpreter, torch, Qt-free).
        "rss_budget_mb": round((file_bytes * 1.15 + (300 << 20)) / 2**20, 1),
        "peak_rss_mb": round(peak_rss / 2**20, 1),
        **stream,
        "turn_history_tokens": hist_len,
        "turn_ttft_cached_ms": round(cached, 2),
        "turn_ttft_full_ms": round(full, 2),
        "turn_ttft_ratio": round(cached / full, 3) if full else None,
        # Candidates timed for this model (0: every verdict came from the timings file), and the
        # kernel each matrix shape uses.
        "kernels_timed": tuner.measured - timed_before,
        "kernels": [choice.line() for choice in loaded.model.kernel_choices()],
    }
    if dev.type == "cuda":  # pragma: no cover - GPU only
        result["peak_vram_mb"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
    return result
