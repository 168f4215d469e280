"""Quality cost of the fast precisions: mean KL(exact ‖ mode) of next-token distributions.

    python benchmarks/bench_fast_kl.py [--depths 4,12] [--modes bfloat16,float16,int8]

Measured on the bundled (trained) demo model with its own chat prompts, and on random-weight
nanochat checkpoints (whose flatter distributions make their KL a rough guide only). Besides the
mean KL it reports how often the most likely token changes (top-1 agreement).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from support import REPO

ROOT = REPO
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from make_checkpoint import write_e7  # noqa: E402
from perf_report import write_section  # noqa: E402

from desktop.engine.kernels.device import pick_precision  # noqa: E402
from desktop.engine.nanochat.loader import load_model  # noqa: E402

DEMO_PROMPTS = (
    "What is 12 times 7?",
    "How many r are in strawberry?",
    "Who are you?",
    "Compute 345 + 12",
    "What is 144 divided by 12?",
    "Tell me about Python's with statement.",
)


@torch.inference_mode()
def compare(ckpt: Path, prompts: list[list[int]], mode: str) -> tuple[float, float]:
    """(mean KL in nats, fraction of positions with the same argmax) of ``mode`` against exact."""
    exact = load_model(ckpt, dtype="float32").model
    other = load_model(ckpt, dtype=mode).model
    kls, same = [], []
    for ids in prompts:
        x = torch.tensor([ids])
        p = F.log_softmax(exact(x)[0], dim=-1)
        q = F.log_softmax(other(x)[0].float(), dim=-1)
        kls.append(F.kl_div(q, p, log_target=True, reduction="none").sum(-1).mean().item())
        same.append((p.argmax(-1) == q.argmax(-1)).float().mean().item())
    return sum(kls) / len(kls), sum(same) / len(same)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="4,12")
    parser.add_argument("--modes", default="bfloat16,float16,int8")
    parser.add_argument("--base", type=Path, default=Path("/tmp/nanoscope-bench"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    from desktop.config.paths import demo_checkpoint
    from desktop.engine.messages import Message
    from desktop.engine.nanochat.chat_format import render_for_completion
    from desktop.engine.nanochat.tokenizer import load_tokenizer

    cpu = torch.device("cpu")
    modes = [m for m in args.modes.split(",") if m]
    models: list[tuple[str, Path, list[list[int]]]] = []
    demo = demo_checkpoint()
    if demo is not None:
        tok = load_tokenizer(demo.parent.parent / "tokenizer" / "tokenizer.pkl")
        prompts = [render_for_completion(tok, [Message.of_text("user", p)], None).ids for p in DEMO_PROMPTS]
        models.append(("demo (trained, 1.3M)", demo, prompts))
    g = torch.Generator().manual_seed(0)
    random_prompts = [torch.randint(0, 32000, (64,), generator=g).tolist() for _ in range(4)]
    for depth in (int(d) for d in args.depths.split(",")):
        models.append((f"random E7 d{depth}", write_e7(args.base, depth), random_prompts))

    results: dict[str, dict[str, list[float]]] = {}
    for name, ckpt, prompts in models:
        results[name] = {m: list(compare(ckpt, prompts, m)) for m in modes}
        print(json.dumps({name: results[name]}), flush=True)
    labels = [pick_precision(cpu, m).name for m in modes]
    body = (
        "Mean KL(exact ‖ mode) per next-token distribution in nats, and the share of positions whose\n"
        "most likely token is unchanged, on this CPU:\n\n"
        f"| model | {' | '.join(labels)} |\n|---|{'---|' * len(modes)}\n"
    )
    body += "\n".join(
        f"| {name} | " + " | ".join(f"{kl:.2e} ({top1:.1%})" for kl, top1 in row.values()) + " |"
        for name, row in results.items()
    )
    write_section(args.out, "fast-mode-kl", body)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
