"""llama.cpp against Nanoscope on the same shapes, the same machine, in one run, alternated.

A random Llama (width 768, 12 layers, vocabulary 32,768, SwiGLU hidden 2,048) is written by
transformers' own ``save_pretrained``; its GGUF is written with the ``gguf`` package from the same
tensors (F32 and F16; Q/K permuted as llama.cpp's converter permutes them), and quantised to Q8_0
and Q4_0 by llama.cpp's own ``llama_model_quantize``. The pairs:

* F32 against exact mode (the HF folder, fp32, transformers' bits);
* F16 against fast mode (fp16 weights, fp32 activations);
* Q8_0 against int8 mode, on the HF folder, and on a nanochat d12 of the same width, depth and
  vocabulary (``make_checkpoint.write_e7``);
* Q4_0 for reference.

llama.cpp runs in its own Python (``--llama-python``: a venv with llama-cpp-python and gguf from
the registry, built with the CPU's own instructions), in one process that keeps every GGUF
loaded; Nanoscope runs here, every mode loaded. Each round times every contender once, in an
order that rotates; the figures are medians of the rounds. Decoding is greedy, timed from outside:
tokens after the first, over the seconds after the first. Both use every core.

Usage: ``python benchmarks/bench_llamacpp.py --llama-python /path/to/venv/bin/python``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]

from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.backend import LoadOptions  # noqa: E402
from desktop.engine.bench import IdsOnlyTokenizer, stream_triad_gbs  # noqa: E402
from desktop.engine.decode.generation import generate_columns  # noqa: E402
from desktop.engine.hf.backend import HFBackend  # noqa: E402
from desktop.engine.kernels.machine import cpu_name  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402
from desktop.engine.params import SamplingParams  # noqa: E402

WIDTH, DEPTH, VOCAB, HIDDEN, HEADS = 768, 12, 32768, 2048, 6

# The llama.cpp side: one process, every GGUF loaded, told what to time on stdin.
LLAMA_WORKER = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
threads = int(sys.argv[1])
models = {}
for line in sys.stdin:
    ask = json.loads(line)
    if ask["do"] == "load":
        models[ask["name"]] = Llama(ask["path"], n_ctx=ask["ctx"], n_threads=threads,
                                    n_threads_batch=threads, n_batch=512, verbose=False)
        print(json.dumps({"ok": True}), flush=True)
        continue
    llm = models[ask["name"]]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ask["prompt"])
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    first = time.perf_counter()
    ids = [token]
    for _ in range(ask["new"] - 1):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ids.append(token)
    end = time.perf_counter()
    print(json.dumps({"ttft_ms": 1e3 * (first - t0), "tok_s": (len(ids) - 1) / (end - first)}), flush=True)
"""


def write_llama_folder(out: Path) -> Path:
    """A random Llama written by transformers' own save_pretrained (fp32 safetensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").exists():
        return out
    config = LlamaConfig(
        hidden_size=WIDTH,
        intermediate_size=HIDDEN,
        num_hidden_layers=DEPTH,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(out)
    return out


def write_tokenizer(out: Path) -> None:
    """A tokenizer.json of VOCAB byte-level tokens: the benchmark feeds ids, never text, but the
    folder must open as a model does."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<s>": VOCAB - 2, "</s>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def write_gguf_f32_f16(folder: Path, llama_python: str) -> dict[str, Path]:
    """F32 and F16 GGUFs of ``folder``'s tensors, written by the gguf package (in llama.cpp's
    Python: the gguf package is its own)."""
    script = r"""
import json, sys
import numpy as np
import gguf
from safetensors.numpy import load_file
folder, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(folder + "/config.json"))
t = load_file(folder + "/model.safetensors")
H, C, L = cfg["num_attention_heads"], cfg["hidden_size"], cfg["num_hidden_layers"]
w = gguf.GGUFWriter(out, "llama")
w.add_context_length(cfg["max_position_embeddings"]); w.add_embedding_length(C)
w.add_block_count(L); w.add_feed_forward_length(cfg["intermediate_size"])
w.add_head_count(H); w.add_head_count_kv(cfg["num_key_value_heads"])
w.add_rope_dimension_count(C // H); w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
w.add_layer_norm_rms_eps(cfg["rms_norm_eps"]); w.add_file_type(0 if kind == "f32" else 1)
V = cfg["vocab_size"]
w.add_tokenizer_model("llama")
w.add_token_list([f"t{i}".encode() for i in range(V)])
w.add_token_scores([0.0] * V); w.add_token_types([1] * V)
w.add_bos_token_id(V - 2); w.add_eos_token_id(V - 1)
def permute(x, heads):  # as convert_hf_to_gguf.py: HF's rotate-half to llama.cpp's pairs
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
def put(name, x, matrix):
    x = x.astype(np.float16 if (kind == "f16" and matrix) else np.float32)
    w.add_tensor(name, x)
put("token_embd.weight", t["model.embed_tokens.weight"], True)
for i in range(L):
    p = f"model.layers.{i}."
    put(f"blk.{i}.attn_norm.weight", t[p + "input_layernorm.weight"], False)
    put(f"blk.{i}.attn_q.weight", permute(t[p + "self_attn.q_proj.weight"], H), True)
    put(f"blk.{i}.attn_k.weight", permute(t[p + "self_attn.k_proj.weight"], cfg["num_key_value_heads"]), True)
    put(f"blk.{i}.attn_v.weight", t[p + "self_attn.v_proj.weight"], True)
    put(f"blk.{i}.attn_output.weight", t[p + "self_attn.o_proj.weight"], True)
    put(f"blk.{i}.ffn_norm.weight", t[p + "post_attention_layernorm.weight"], False)
    put(f"blk.{i}.ffn_gate.weight", t[p + "mlp.gate_proj.weight"], True)
    put(f"blk.{i}.ffn_up.weight", t[p + "mlp.up_proj.weight"], True)
    put(f"blk.{i}.ffn_down.weight", t[p + "mlp.down_proj.weight"], True)
put("output_norm.weight", t["model.norm.weight"], False)
put("output.weight", t["lm_head.weight"], True)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"""
    out: dict[str, Path] = {}
    for kind in ("f32", "f16"):
        path = folder / f"model-{kind}.gguf"
        if not path.exists():
            subprocess.run([llama_python, "-c", script, str(folder), str(path), kind], check=True)
        out[kind.upper()] = path
    return out


def quantise(source: Path, llama_python: str) -> dict[str, Path]:
    """Q8_0 and Q4_0 by llama.cpp's own llama_model_quantize, from the F32 GGUF."""
    script = r"""
import sys, llama_cpp
src, dst, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = ftype
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
sys.exit(rc)
"""
    out: dict[str, Path] = {}
    for name, ftype in (("Q8_0", 7), ("Q4_0", 2)):  # llama.h: LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_0
        path = source.with_name(f"model-{name.lower()}.gguf")
        if not path.exists():
            subprocess.run([llama_python, "-c", script, str(source), str(path), str(ftype)], check=True)
        out[name] = path
    return out


class LlamaWorker:
    def __init__(self, llama_python: str, threads: int) -> None:
        self.proc = subprocess.Popen(
            [llama_python, "-c", LLAMA_WORKER, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **ask: object) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def nanoscope_run(model: object, prompt: list[int], new: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=new, seed=1)
    t0 = time.perf_counter()
    first = 0.0
    count = 0
    for column in generate_columns(model, IdsOnlyTokenizer(), prompt, params):
        count += len(column.tokens[0:1])
        if count == 1:
            first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft_ms": 1e3 * (first - t0), "tok_s": (count - 1) / max(end - first, 1e-9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python and gguf")
    ap.add_argument("--work", type=Path, default=Path("/tmp/nanoscope-bench-llamacpp"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--kernel-cache", type=Path, default=None, help="kernel timings (default: a fresh file)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    args.work.mkdir(parents=True, exist_ok=True)
    folder = write_llama_folder(args.work / "llama-d12")
    ggufs = write_gguf_f32_f16(folder, args.llama_python)
    ggufs |= quantise(ggufs["F32"], args.llama_python)
    nanochat = write_e7(args.work / "nanochat", DEPTH)
    kernel_cache = args.kernel_cache or args.work / f"kernels-{os.getpid()}.json"

    ours: dict[str, object] = {}
    for mode in ("float32", "fast", "int8"):
        backend = HFBackend.open(folder, LoadOptions(device="cpu", dtype=mode, kernel_cache=kernel_cache))
        ours[f"HF {mode}"] = backend.model
    ours["nanochat int8"] = load_model(nanochat, None, "cpu", "int8", kernel_cache=kernel_cache).model
    ours["nanochat fast"] = load_model(nanochat, None, "cpu", "fast", kernel_cache=kernel_cache).model
    worker = LlamaWorker(args.llama_python, threads)
    for name, path in ggufs.items():
        worker.ask(do="load", name=name, path=str(path), ctx=args.prompt + args.new + 8)
    prompt = [
        int(i)
        for i in torch.randint(0, VOCAB - 2, (args.prompt,), generator=torch.Generator().manual_seed(0))
    ]

    contenders = [*(f"llama.cpp {name}" for name in ggufs), *ours]
    results: dict[str, list[float]] = {name: [] for name in contenders}
    bandwidth: list[float] = []
    for r in range(args.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for name in order:
            if name.startswith("llama.cpp "):
                got = worker.ask(do="run", name=name.split(" ", 1)[1], prompt=prompt, new=args.new)
            else:
                with torch.inference_mode():
                    got = nanoscope_run(ours[name], prompt, args.new)
            results[name].append(got["tok_s"])
            print(f"round {r + 1} {name}: {got['tok_s']:.1f} tok/s", flush=True)
        bandwidth.append(stream_triad_gbs(torch.device("cpu")))
    worker.close()
    median = {name: statistics.median(values) for name, values in results.items()}
    triad = statistics.median(bandwidth)
    pairs = [
        ("F32", "HF float32", "exact (fp32)"),
        ("F16", "HF fast", "fast (fp16 weights)"),
        ("Q8_0", "HF int8", "int8"),
        ("Q8_0", "nanochat int8", "int8, nanochat d12 (same width, depth, vocabulary)"),
        ("F16", "nanochat fast", "fast, nanochat d12"),
    ]
    lines = [
        f"CPU: {cpu_name()}, {threads} threads, torch {torch.__version__}; llama-cpp-python from the "
        f"registry, built here with the CPU's own instructions. A random Llama of width {WIDTH}, "
        f"{DEPTH} layers, vocabulary {VOCAB:,}; greedy, {args.prompt}-token prompt, {args.new} new tokens, "
        f"medians of {args.rounds} alternated rounds (tok/s, timed from outside). STREAM triad over "
        f"the rounds: {triad:.1f} GB/s (median).",
        "",
        "| llama.cpp | tok/s | Nanoscope | tok/s | Nanoscope ÷ llama.cpp |",
        "|---|---|---|---|---|",
    ]
    for theirs, mine, label in pairs:
        a, b = median[f"llama.cpp {theirs}"], median[mine]
        lines.append(f"| {theirs} | {a:.1f} | {label} | {b:.1f} | {b / a:.2f} |")
    lines.append(f"| Q4_0 | {median['llama.cpp Q4_0']:.1f} | (no 4-bit mode) | | |")
    body = "\n".join(lines)
    print(body)
    write_section(args.out, "llamacpp", body)


if __name__ == "__main__":
    main()
