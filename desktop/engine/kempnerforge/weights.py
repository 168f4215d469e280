"""The state-dict keys and shapes a KempnerForge config implies, checked strictly (torch-free).

Keys are KempnerForge's module paths as ``get_model_state_dict`` writes them (the DCP keys
without their ``model.`` prefix; checkpoint-formats spec §3.1). Nothing is patched: missing or
unexpected keys and wrong shapes are listed in one line.
"""

from __future__ import annotations

from desktop.engine.errors import CheckpointError, UnsupportedFormatError
from desktop.engine.kempnerforge.config import KFModelConfig
from desktop.engine.kempnerforge.dcp_metadata import DcpMetadata

MODEL_PREFIX = "model."
EMBEDDING = "token_embedding.embedding.weight"
OUTPUT = "output_head.proj.weight"
# Keys that only a MoE layer has: named in the refusal when a TOML says dense but the weights are not.
_MOE_MARKERS = (".mlp.router.", ".mlp.experts.", ".mlp.shared_expert.", ".mlp.up_w", ".mlp.gate_w")


def expected_shapes(cfg: KFModelConfig) -> dict[str, tuple[int, ...]]:
    """Every key of the dense Transformer for ``cfg`` with its shape (the output head included)."""
    d, hd, f, v = cfg.dim, cfg.head_dim, cfg.ffn_hidden_dim, cfg.vocab_size
    q_rows, kv_rows = cfg.n_heads * hd, cfg.n_kv_heads * hd
    layernorm = cfg.norm_type == "layernorm"
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (v, d)}

    def norm(name: str) -> None:
        shapes[f"{name}.weight"] = (d,)
        if layernorm:
            shapes[f"{name}.bias"] = (d,)

    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        norm(f"{p}.attention_norm")
        shapes[f"{p}.attention.q_proj.weight"] = (q_rows, d)
        shapes[f"{p}.attention.k_proj.weight"] = (kv_rows, d)
        shapes[f"{p}.attention.v_proj.weight"] = (kv_rows, d)
        shapes[f"{p}.attention.o_proj.weight"] = (d, q_rows)
        if cfg.qk_norm:
            shapes[f"{p}.attention.q_norm.weight"] = (hd,)
            shapes[f"{p}.attention.k_norm.weight"] = (hd,)
        norm(f"{p}.mlp_norm")
        if cfg.activation == "silu":
            shapes[f"{p}.mlp.gate_proj.weight"] = (f, d)
        shapes[f"{p}.mlp.up_proj.weight"] = (f, d)
        shapes[f"{p}.mlp.down_proj.weight"] = (d, f)
    norm("norm")
    shapes[OUTPUT] = (v, d)
    return shapes


def model_entries(metas: list[DcpMetadata]) -> dict[str, tuple[DcpMetadata, str]]:
    """``{key without "model.": (metadata, stored key)}`` over every stage; optimizer keys are skipped."""
    found: dict[str, tuple[DcpMetadata, str]] = {}
    for meta in metas:
        for key in meta.tensors:
            if not key.startswith(MODEL_PREFIX):
                continue
            name = key[len(MODEL_PREFIX) :]
            if name in found:
                raise CheckpointError(
                    f"{meta.path.parent}: {name} is stored by two stages "
                    f"({found[name][0].path.parent.name} too)"
                )
            found[name] = (meta, key)
        stray = sorted(k for k in meta.byte_keys if k.startswith(MODEL_PREFIX))
        if stray:
            raise CheckpointError(
                f"{meta.path.parent}: model entries that are not tensors: {', '.join(stray[:5])}"
            )
    if not found:
        raise CheckpointError(f"{metas[0].path.parent}: no model.* tensors in this DCP checkpoint")
    return found


def check_weights(cfg: KFModelConfig, shapes: dict[str, tuple[int, ...]], where: str, toml_name: str) -> None:
    """Keys and shapes of the checkpoint against the config; one line naming every difference."""
    want = expected_shapes(cfg)
    if cfg.tie_embeddings and OUTPUT not in shapes:
        del want[OUTPUT]
    missing = sorted(set(want) - set(shapes))
    unexpected = sorted(set(shapes) - set(want))
    moe = [k for k in unexpected if any(m in k for m in _MOE_MARKERS)]
    if moe:
        raise UnsupportedFormatError(
            f"{where}: the weights are a KempnerForge MoE model ({moe[0]}, ...) but {toml_name} "
            "describes a dense one; MoE models are not supported"
        )
    if missing or unexpected:
        bits = []
        if missing:
            bits.append(
                f"missing {', '.join(missing[:6])}"
                + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            )
        if unexpected:
            bits.append(
                f"unexpected {', '.join(unexpected[:6])}"
                + (f" and {len(unexpected) - 6} more" if len(unexpected) > 6 else "")
            )
        raise CheckpointError(f"{where}: the weights do not match {toml_name}: {'; '.join(bits)}")
    wrong = [
        f"{k} {list(shapes[k])} (expected {list(want[k])})" for k in sorted(want) if shapes[k] != want[k]
    ]
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise CheckpointError(f"{where}: shapes do not match {toml_name}: {'; '.join(wrong[:3])}{more}")
