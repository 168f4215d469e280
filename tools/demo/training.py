"""The E7 model (the app's own ``desktop.engine.nanochat.model.GPT``) and its training on the CPU."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from desktop.engine.nanochat.classify import classify, expected_shapes
from desktop.engine.nanochat.config import ModelConfig, e7_config
from desktop.engine.nanochat.model import GPT

from .examples import Example, batch_order, collate
from .settings import RunSettings

logger = logging.getLogger(__name__)


def model_config(s: RunSettings) -> ModelConfig:
    return e7_config(s.sequence_len, s.vocab_size, s.n_layer, s.n_head, s.n_embd, s.window_pattern.upper())


def model_config_meta(cfg: ModelConfig) -> dict[str, int | str]:
    """The ``model_config`` block nanochat's chat_sft writes (GPTConfig's fields)."""
    return {
        "sequence_len": cfg.sequence_len,
        "vocab_size": cfg.vocab_size,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_kv_head": cfg.n_kv_head,
        "n_embd": cfg.n_embd,
        "window_pattern": cfg.window_pattern,
    }


@torch.no_grad()
def init_weights(model: GPT) -> None:
    """nanochat-style init: unit embeddings, tiny head, zero output projections, neutral scalars."""
    C = model.config.n_embd
    bound = math.sqrt(3.0 / C)  # uniform with std 1/sqrt(C)
    torch.nn.init.normal_(model.transformer.wte.weight, std=1.0)
    torch.nn.init.normal_(model.lm_head.weight, std=0.001)
    for block in model.transformer.h:
        for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
            torch.nn.init.uniform_(lin.weight, -bound, bound)
        torch.nn.init.zeros_(block.attn.c_proj.weight)
        torch.nn.init.zeros_(block.mlp.c_proj.weight)
        if hasattr(block.attn, "ve_gate"):
            torch.nn.init.zeros_(block.attn.ve_gate.weight)  # gate 3*sigmoid(0): a neutral start
    for emb in model.value_embeds.values():
        torch.nn.init.uniform_(emb.weight, -bound, bound)
    model.resid_lambdas.fill_(1.0)
    model.x0_lambdas.fill_(0.1)
    torch.nn.init.zeros_(model.smear_gate.weight)
    model.smear_lambda.fill_(0.05)
    model.backout_lambda.fill_(0.05)


class ModelMismatchError(RuntimeError):
    """The trained model would not be the one the app's loader builds from its files."""


def build_model(s: RunSettings) -> GPT:
    """An initialised E7 model, checked to be exactly what the app's loader would build."""
    cfg = model_config(s)
    model = GPT(cfg)
    init_weights(model)
    # Not GPT.prepare(): that readies a loaded model for inference (frozen weights, fused kernels).
    model.set_rotary(torch.device("cpu"), torch.float32)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if shapes != expected_shapes(cfg):
        raise ModelMismatchError("the state_dict's keys or shapes differ from what the loader expects")
    inferred = classify({"model_config": model_config_meta(cfg)}, shapes, "demo")
    if inferred != cfg:
        raise ModelMismatchError(f"the loader would build a different model:\n{inferred}\n{cfg}")
    return model


def make_optimizer(model: GPT, lr: float) -> torch.optim.AdamW:
    """AdamW without weight decay; embeddings learn 5x faster (they are touched sparsely)."""
    groups: dict[str, list[torch.nn.Parameter]] = {"embed": [], "rest": []}
    for name, p in model.named_parameters():
        groups["embed" if name.startswith(("transformer.wte", "value_embeds")) else "rest"].append(p)
    scale = {"embed": 5.0, "rest": 1.0}
    return torch.optim.AdamW(
        [{"params": ps, "lr": lr * scale[g], "base_lr": lr * scale[g]} for g, ps in groups.items()],
        betas=(0.9, 0.95),
        eps=1e-10,
        weight_decay=0.0,
    )


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warmup, flat, then a linear decay to 5% over the last 40% of training."""
    if step < warmup:
        return (step + 1) / warmup
    decay_from = int(0.6 * steps)
    if step < decay_from:
        return 1.0
    return 1.0 - 0.95 * (step - decay_from) / max(1, steps - decay_from)


@torch.no_grad()
def evaluate_loss(
    model: GPT, examples: Sequence[Example], pad_id: int, token_bytes: torch.Tensor, batch_size: int = 16
) -> tuple[float, float]:
    """Mean loss per trained token, and bits per byte over trained non-special tokens."""
    was_training = model.training
    model.eval()
    total_loss = total_tokens = nats = n_bytes = 0.0
    ordered = sorted(examples, key=lambda e: len(e.ids))  # similar lengths: little padding
    for start in range(0, len(ordered), batch_size):
        x, y = collate(ordered[start : start + batch_size], pad_id)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1, reduction="none")
        valid = y.flatten() >= 0
        total_loss += float(loss[valid].sum())
        total_tokens += int(valid.sum())
        nb = token_bytes[y.flatten().clamp_min(0)] * valid
        nats += float((loss * (nb > 0)).sum())
        n_bytes += float(nb.sum())
    model.train(was_training)
    return total_loss / max(1.0, total_tokens), nats / math.log(2) / max(1.0, n_bytes)


Losses = dict[str, tuple[float, float]]  # validation set -> (loss, bpb)


@dataclass
class TrainingLog:
    steps: int = 0
    minutes: float = 0.0
    tokens: int = 0  # padded tokens through the model
    train_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, EMA of batch loss)
    evals: list[tuple[int, Losses]] = field(default_factory=list)


class TimeLimitError(RuntimeError):
    """Training ran past its time limit; a model cut short is not shipped."""


def train(
    model: GPT,
    train_set: Sequence[Example],
    evaluate: Callable[[GPT], Losses],
    s: RunSettings,
    pad_id: int,
    on_snapshot: Callable[[GPT, int], Losses],
) -> TrainingLog:
    """Train for ``s.steps``. At every snapshot step ``on_snapshot(model, step)`` saves the model and
    returns the validation losses of what it saved (which the log records for that step)."""
    opt = make_optimizer(model, s.lr)
    rng = random.Random(s.seed + 4)
    order: list[list[int]] = []
    log = TrainingLog()
    ema = float("nan")
    started = time.perf_counter()
    snapshots = set(s.snapshot_steps)
    log.evals.append((0, evaluate(model)))
    model.train()
    for step in range(1, s.steps + 1):
        if not order:
            order = batch_order(train_set, s.batch_size, rng)
        x, y = collate([train_set[i] for i in order.pop()], pad_id)
        factor = lr_factor(step - 1, s.steps, s.warmup)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log.steps, log.tokens = step, log.tokens + x.numel()
        ema = loss.item() if math.isnan(ema) else 0.95 * ema + 0.05 * loss.item()
        log.train_curve.append((step, ema))
        if step in snapshots:
            log.evals.append((step, on_snapshot(model, step)))
        elif step % s.eval_every == 0:
            log.evals.append((step, evaluate(model)))
        elapsed = time.perf_counter() - started
        if step % 50 == 0 or step == s.steps:
            logger.info(
                "step %d/%d loss %.4f lr x%.2f %.0f tok/s %.1f min, %.1f to go",
                step,
                s.steps,
                ema,
                factor,
                log.tokens / elapsed,
                elapsed / 60,
                elapsed / step * (s.steps - step) / 60,
            )
        if elapsed > s.minutes * 60 and step < s.steps:
            raise TimeLimitError(f"training passed its limit of {s.minutes} min at step {step}")
    log.minutes = (time.perf_counter() - started) / 60
    model.eval()
    return log
