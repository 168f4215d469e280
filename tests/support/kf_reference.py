"""KempnerForge's dense model and generate(), restated for tests, and runs written with DCP itself.

KempnerForge is not on PyPI. Its ``Transformer`` (``kempnerforge/model/{transformer,attention,
norm,mlp,embedding,position}.py``) and ``generate()`` / ``sample()``
(``kempnerforge/model/generate.py``, described in ``shared/seeds/001_kempnerforge_generation_docs``)
are short; they are restated here as ``nn.Module`` s with the same module paths, so their
``state_dict`` has KempnerForge's key names, and the runs are saved the way its checkpoint
manager saves them: ``dcp.save({"model": get_model_state_dict(m), "optimizer":
get_optimizer_state_dict(m, opt)}, checkpoint_id=<run>/step_N[/pp<k>])``, plus ``metadata.json``,
``train_state.pt`` and the ``latest`` symlink.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

# --- the model (kempnerforge/config/model.py, kempnerforge/model/*.py) ---------------------------


@dataclass
class RefConfig:
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    vocab_size: int = 320
    ffn_dim_multiplier: float = 1.0
    ffn_hidden_dim: int | None = None
    norm_type: str = "rmsnorm"
    norm_eps: float = 1e-5
    activation: str = "silu"
    max_seq_len: int = 64
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    qk_norm: bool = False

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def computed_ffn_hidden_dim(self) -> int:
        if self.ffn_hidden_dim is not None:
            return self.ffn_hidden_dim
        raw = int(4 * self.dim * (2 / 3) * self.ffn_dim_multiplier)
        return 256 * math.ceil(raw / 256)

    def toml_table(self) -> dict:
        d = dict(self.__dict__)
        return {k: v for k, v in d.items() if v is not None}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (norm * self.weight).to(dtype)


def build_norm(norm_type: str, dim: int, eps: float) -> nn.Module:
    return RMSNorm(dim, eps) if norm_type == "rmsnorm" else nn.LayerNorm(dim, eps=eps)


def precompute_rope_frequencies(
    head_dim: int, max_seq_len: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    positions = torch.arange(max_seq_len)
    freqs_table = torch.outer(positions, freqs)
    return freqs_table.cos(), freqs_table.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    shape = [1] * (x.ndim - 2) + list(cos.shape)
    cos = cos.view(*shape).to(x.dtype)
    sin = sin.view(*shape).to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class KVCache:
    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype, device) -> None:
        self.k = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, dtype=dtype, device=device)
        self.seq_len = 0

    def update(self, k_new, v_new):
        end = self.seq_len + k_new.shape[2]
        self.k[:, :, self.seq_len : end] = k_new
        self.v[:, :, self.seq_len : end] = v_new
        self.seq_len = end
        return self.k[:, :, :end], self.v[:, :, :end]


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, qk_norm: bool) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.n_rep = n_heads // n_kv_heads
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None

    def forward(self, x, rope_cos, rope_sin, *, kv_cache=None):
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, -1, self.head_dim)
        k = self.k_proj(x).view(batch, seq_len, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq_len, -1, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = apply_rope(q, rope_cos, rope_sin)
        k = apply_rope(k, rope_cos, rope_sin)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
        is_causal = kv_cache is None or seq_len > 1
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        out = out.transpose(1, 2).contiguous().view(batch, seq_len, -1)
        return self.o_proj(out)


class SwiGLUMLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class StandardMLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, activation: str) -> None:
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)
        self._activation = {"gelu": F.gelu, "relu": F.relu}[activation]

    def forward(self, x):
        return self.down_proj(self._activation(self.up_proj(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config: RefConfig) -> None:
        super().__init__()
        self.attention_norm = build_norm(config.norm_type, config.dim, config.norm_eps)
        self.attention = Attention(
            config.dim, config.n_heads, config.n_kv_heads, config.head_dim, config.qk_norm
        )
        self.mlp_norm = build_norm(config.norm_type, config.dim, config.norm_eps)
        hidden = config.computed_ffn_hidden_dim
        if config.activation == "silu":
            self.mlp = SwiGLUMLP(config.dim, hidden)
        else:
            self.mlp = StandardMLP(config.dim, hidden, config.activation)

    def forward(self, x, rope_cos, rope_sin, *, kv_cache=None):
        x = x + self.attention(self.attention_norm(x), rope_cos, rope_sin, kv_cache=kv_cache)
        x = x + self.mlp(self.mlp_norm(x))
        return x


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)

    def forward(self, tokens):
        return self.embedding(tokens)


class OutputHead(nn.Module):
    def __init__(self, dim: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, x):
        return self.proj(x)


class Transformer(nn.Module):
    def __init__(self, config: RefConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = TokenEmbedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(config) for i in range(config.n_layers)})
        self.norm = build_norm(config.norm_type, config.dim, config.norm_eps)
        self.output_head = OutputHead(config.dim, config.vocab_size)
        if config.tie_embeddings:
            self.output_head.proj.weight = self.token_embedding.embedding.weight
        self._rope_cos, self._rope_sin = precompute_rope_frequencies(
            config.head_dim, config.max_seq_len, config.rope_theta
        )

    def forward(self, tokens, *, kv_caches=None):
        h = self.token_embedding(tokens)
        seq_len = h.shape[1]
        start_pos = kv_caches[0].seq_len if kv_caches is not None else 0
        if self._rope_cos.device != h.device:
            self._rope_cos, self._rope_sin = self._rope_cos.to(h.device), self._rope_sin.to(h.device)
        cos = self._rope_cos[start_pos : start_pos + seq_len]
        sin = self._rope_sin[start_pos : start_pos + seq_len]
        for i, layer in enumerate(self.layers.values()):
            h = layer(h, cos, sin, kv_cache=kv_caches[i] if kv_caches is not None else None)
        h = self.norm(h)
        return self.output_head(h)


# --- generation (kempnerforge/model/generate.py, per the seed doc) --------------------------------


def sample(logits, temperature=1.0, top_k=0, top_p=1.0):
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k > 0:
        top_k = min(top_k, logits.shape[-1])
        threshold = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.where(logits >= threshold, torch.full_like(logits, float("-inf")))
    if top_p < 1.0:
        sorted_logits, sorted_indices = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        cumulative_probs = probs.cumsum(dim=-1)
        mask = (cumulative_probs - probs) >= top_p
        sorted_logits[mask] = float("-inf")
        logits = torch.zeros_like(logits).scatter_(1, sorted_indices, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(-1)


@torch.no_grad()
def generate(model, prompt_tokens, max_new_tokens, *, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None):
    was_training = model.training
    model.eval()
    device = prompt_tokens.device
    batch_size, prompt_len = prompt_tokens.shape
    total_len = prompt_len + max_new_tokens
    config = model.config
    if total_len > config.max_seq_len:
        raise ValueError("exceeds model max_seq_len")
    dtype = next(model.parameters()).dtype
    kv_caches = [
        KVCache(batch_size, total_len, config.n_kv_heads, config.head_dim, dtype, device)
        for _ in range(config.n_layers)
    ]
    logits = model(prompt_tokens, kv_caches=kv_caches)
    next_logits = logits[:, -1, :]
    generated = []
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        next_token = sample(next_logits, temperature, top_k, top_p)
        generated.append(next_token)
        if eos_token_id is not None:
            done = done | (next_token == eos_token_id)
            if done.all():
                break
        next_logits = model(next_token.unsqueeze(1), kv_caches=kv_caches)[:, -1, :]
    if was_training:
        model.train()
    if generated:
        return torch.cat([prompt_tokens, torch.stack(generated, dim=1)], dim=1)
    return prompt_tokens


# --- fixtures -------------------------------------------------------------------------------------

CORPUS = [
    "Once upon a time there was a tiny model that wanted to write stories. ",
    "The quick brown fox jumps over the lazy dog, and the dog does not mind. ",
    "Training runs save checkpoints; every step has its own folder and a latest link. ",
]
EOS = "<|endoftext|>"


def write_tokenizer(directory: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer.json with a GPT-2 style config (eos <|endoftext|>)."""
    from tokenizers import ByteLevelBPETokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS * 10, vocab_size=vocab_size, special_tokens=[EOS], show_progress=False)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "model_max_length": 1024}))
    return directory


def make_model(cfg: RefConfig, seed: int = 0) -> Transformer:
    """A Transformer with random weights (norm weights too, so a skipped norm weight shows)."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("norm.bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


class MarkerOnLoad:
    """Unpickling this creates ``path``: the stand-in for a hostile pickle."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _optimizer_state(model: nn.Module) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero grads: the moments exist, the weights do not move
    for p in model.parameters():
        p.grad = None
    return get_optimizer_state_dict(model, opt)


def _save(state: dict, directory: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=directory)


def write_step(run: Path, model: Transformer, step: int, stages: int = 0, marker: Path | None = None) -> Path:
    """``run/step_<step>`` as KempnerForge's CheckpointManager writes it (``stages`` > 0: ``pp<k>``)."""
    step_dir = run / f"step_{step}"
    step_dir.mkdir(parents=True)
    sd = get_model_state_dict(model)
    optim = _optimizer_state(model)
    if stages:
        n = model.config.n_layers
        bounds = [round(k * n / stages) for k in range(stages + 1)]
        for k in range(stages):
            layers = {str(i) for i in range(bounds[k], bounds[k + 1])}
            part = {}
            for key, t in sd.items():
                first = key.startswith("token_embedding.") and k == 0
                last = (key.startswith("norm.") or key.startswith("output_head.")) and k == stages - 1
                in_stage = key.startswith("layers.") and key.split(".")[1] in layers
                if first or last or in_stage:
                    part[key] = t
            _save({"model": part}, step_dir / f"pp{k}")
    else:
        _save({"model": sd, "optimizer": optim}, step_dir)
    (step_dir / "metadata.json").write_text(json.dumps({"step": step, "tokens_seen": 1000 * step}))
    with open(step_dir / "train_state.pt", "wb") as f:
        pickle.dump({"step": step, "rng": MarkerOnLoad(marker or run / "TRAIN_STATE_WAS_UNPICKLED")}, f)
    latest = run / "latest"
    if latest.is_symlink():
        latest.unlink()
    os.symlink(step_dir.name, latest)
    return step_dir


def write_toml(path: Path, cfg: RefConfig, tokenizer_path: str, extra: str = "", run_name: str = "") -> Path:
    lines = ["[model]"]
    for k, v in cfg.toml_table().items():
        lines.append(f"{k} = {json.dumps(v)}")
    lines += ["", "[data]", f"tokenizer_path = {json.dumps(tokenizer_path)}", ""]
    if run_name:
        lines += ["[checkpoint]", f'dir = "checkpoints/{run_name}"', ""]
    path.write_text("\n".join(lines) + extra, encoding="utf-8")
    return path


def write_run(
    root: Path,
    cfg: RefConfig,
    steps: tuple[int, ...] = (10,),
    stages: int = 0,
    tokenizer: Path | None = None,
    toml: bool = True,
    name: str = "tiny",
) -> tuple[Path, Transformer]:
    """A run folder ``root/checkpoints/<name>`` with each step's model (the last one's weights
    are returned) and, by default, ``root/checkpoints/train.toml`` naming ``tokenizer``."""
    run = root / "checkpoints" / name
    run.mkdir(parents=True)
    model = None
    for i, step in enumerate(steps):
        model = make_model(cfg, seed=i)
        write_step(run, model, step, stages)
    if toml:
        tok = tokenizer if tokenizer is not None else write_tokenizer(root / "tokenizer")
        write_toml(run.parent / "train.toml", cfg, str(tok), run_name=name)
    assert model is not None
    return run, model
