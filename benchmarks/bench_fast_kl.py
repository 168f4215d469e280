"""Quality cost of fast mode: mean KL(exact || fast) of next-token distributions on fixed prompts.

    python benchmarks/bench_fast_kl.py [--depths 4,12]

Measured on the bundled (trained) demo model with its own chat prompts, and on random-weight
nanochat checkpoints (which have flat distributions, so their KL is a rough bound only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.loader import load_model  # noqa: E402

DEMO_PROMPTS = (
    "What is 12 times 7?",
    "How many r are in strawberry?",
    "Who are you?",
    "Compute 345 + 12",
    "What is 144 divided by 12?",
    "Tell me about Python's with statement.",
)


@torch.inference_mode()
def mean_kl(ckpt: Path, prompts: list[list[int]]) -> float:
    exact = load_model(ckpt, dtype="float32").model
    fast = load_model(ckpt, dtype="bfloat16").model
    kls = []
    for ids in prompts:
        x = torch.tensor([ids])
        p = F.log_softmax(exact(x)[0], dim=-1)
        q = F.log_softmax(fast(x)[0].float(), dim=-1)
        kls.append(F.kl_div(q, p, log_target=True, reduction="none").sum(-1).mean().item())
    return sum(kls) / len(kls)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="4,12")
    parser.add_argument("--base", type=Path, default=Path("/tmp/nanoscope-bench"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    from desktop.app import demo_checkpoint
    from desktop.engine.chat_format import render_for_completion
    from desktop.engine.messages import Message
    from desktop.engine.tokenizer import load_tokenizer

    rows = []
    demo = demo_checkpoint()
    if demo is not None:
        tok = load_tokenizer(demo.parent.parent / "tokenizer" / "tokenizer.pkl")
        prompts = [render_for_completion(tok, [Message.of_text("user", p)], None).ids for p in DEMO_PROMPTS]
        rows.append(("demo (trained, 1.3M)", mean_kl(demo, prompts)))
    g = torch.Generator().manual_seed(0)
    random_prompts = [torch.randint(0, 32000, (64,), generator=g).tolist() for _ in range(4)]
    for depth in (int(d) for d in args.depths.split(",")):
        rows.append((f"random E7 d{depth}", mean_kl(write_e7(args.base, depth), random_prompts)))
    body = "Mean KL(exact ‖ fast) per next-token distribution, in nats:\n\n| model | mean KL |\n|---|---|\n"
    body += "\n".join(f"| {name} | {kl:.2e} |" for name, kl in rows)
    write_section(args.out, "fast-mode-kl", body)
    print(json.dumps(dict(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
