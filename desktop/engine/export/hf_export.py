"""Export a nanochat checkpoint as a transformers NanoChat directory (the road to vLLM or SGLang).

What is written (checkpoint-formats spec §4.1): ``model.safetensors`` (float32, the port's key
names, the embedding and head cut to the real vocabulary), ``config.json`` (``NanoChatForCausalLM``,
``rms_norm_eps`` = float32's machine epsilon, which is what nanochat's ``F.rms_norm(eps=None)``
uses), ``generation_config.json`` (stop on ``<|assistant_end|>`` or ``<|bos|>``, as nanochat's
Engine), ``tokenizer.json`` converted from ``tokenizer.pkl`` (:mod:`.hf_tokenizer_convert`) and
``tokenizer_config.json`` with a chat template that renders nanochat's chat format, calculator
parts included.

Only checkpoints the port represents exactly are exported: E0, and E1/E2 when their residual
lambdas are still the identity and every layer attends fully. Sliding windows, residual lambdas,
value embeddings, bigram, smear/backout, the q/k gain and the fork's extras are refused with the
reason (the reference converter drops unknown keys and writes a different model).

Every export is loaded back and checked before it is kept: the tokenizer must encode a text
sample as tiktoken does, the chat template must give nanochat's own chat ids, and the logits of
the HF backend (and of transformers, when installed) must match the source's.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from desktop.engine.backend import LoadOptions, Progress, stoppable
from desktop.engine.chat_template import message_dicts
from desktop.engine.errors import CheckpointError, NanoscopeError, UnsupportedFormatError
from desktop.engine.files.safe_pickle import load_tiktoken_pickle
from desktop.engine.hf.backend import HFBackend
from desktop.engine.hf.tokenizer_convert import SAMPLE_TEXTS, build_tokenizer, check_same_encoding
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.nanochat.backend import tokenizer_dirs
from desktop.engine.nanochat.chat_format import render_for_completion
from desktop.engine.nanochat.config import ModelConfig
from desktop.engine.nanochat.loader import load_model
from desktop.engine.nanochat.model import rotary_tables
from desktop.engine.nanochat.special_tokens import ASSISTANT_END, BOS, SPECIAL_TOKENS
from desktop.engine.nanochat.tokenizer import select_tokenizer

logger = logging.getLogger(__name__)

FLOAT32_EPS = float(torch.finfo(torch.float32).eps)
# Logits of the export and of the source with the port's float32 rotary tables agree to this
# (they differ only in the order of float32 operations); a larger gap means a broken export.
EXACT_TOLERANCE = 1e-4
COMPARE_TOKENS = 256

# nanochat's chat format (engine/nanochat/chat_format.py) as a Jinja template, in the shape the port's
# template has: bos; a system message merged into the first user turn; alternating roles; parts.
CHAT_TEMPLATE = """\
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set system = '' -%}
{%- set turns = messages -%}
{%- endif -%}
{{- bos_token -}}
{%- for message in turns -%}
{%- set expected = 'user' if loop.index0 % 2 == 0 else 'assistant' -%}
{%- if message['role'] != expected -%}
{{- raise_exception('roles must alternate user/assistant (message ' ~ loop.index0 ~ ')') -}}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{%- if message['content'] is not string -%}
{{- raise_exception('user messages must have string content') -}}
{%- endif -%}
{{- '<|user_start|>' -}}
{%- if loop.first and system -%}{{- system ~ '\\n\\n' -}}{%- endif -%}
{{- message['content'] ~ '<|user_end|>' -}}
{%- else -%}
{{- '<|assistant_start|>' -}}
{%- if message['content'] is string -%}
{{- message['content'] -}}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'text' -%}
{{- part['text'] -}}
{%- elif part['type'] == 'python' -%}
{{- '<|python_start|>' ~ part['text'] ~ '<|python_end|>' -}}
{%- elif part['type'] == 'python_output' -%}
{{- '<|output_start|>' ~ part['text'] ~ '<|output_end|>' -}}
{%- else -%}
{{- raise_exception('unknown assistant part type ' ~ part['type']) -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|assistant_end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant_start|>' -}}{%- endif -%}
"""

# A conversation exercising every part of the template, for the chat-ids check.
SAMPLE_CONVERSATION = (
    Message.of_text("system", "You are a helpful assistant."),
    Message.of_text("user", "What is 12 times 7?"),
    Message(
        "assistant",
        [
            Part(TEXT, "Let me compute: "),
            Part(PYTHON, "12*7"),
            Part(PYTHON_OUTPUT, "84"),
            Part(TEXT, " It is 84."),
        ],
    ),
    Message.of_text("user", "And how many r's are in strawberry?"),
)


@dataclass(frozen=True)
class ExportReport:
    out: Path
    era: str
    parameters: int
    tokens_compared: int  # tokens of the sample the two tokenizers agreed on
    max_diff_exact: float  # HF backend vs the source with the port's float32 rotary tables
    max_diff_source: float  # HF backend vs the source exactly as nanochat runs it
    max_diff_transformers: float | None  # transformers vs the source (float32 tables); None: not installed

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "out": str(self.out)}

    def summary(self) -> str:
        hf = "not checked (transformers is not installed)"
        if self.max_diff_transformers is not None:
            hf = f"{self.max_diff_transformers:.2e}"
        return (
            f"Exported {self.era} checkpoint ({self.parameters:,} parameters) to {self.out}. "
            f"Max logit difference: {self.max_diff_exact:.2e} against the source with float32 rotary tables, "
            f"{self.max_diff_source:.2e} against nanochat's own numbers (bf16 rotary tables), "
            f"transformers {hf}."
        )


def export_blockers(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> list[str]:
    """Why the port cannot represent this checkpoint exactly (empty: it can)."""
    reasons = []
    if cfg.is_fork:
        reasons.append("it is a fork checkpoint (its tokenizer and extras have no NanoChat equivalent)")
    if cfg.era not in ("E0", "E1", "E2") and not cfg.is_fork:
        reasons.append(f"era {cfg.era} has features the NanoChat port lacks")
    if cfg.ve_layers:
        reasons.append("value embeddings (value_embeds, ve_gate)")
    if cfg.has_bigram:
        reasons.append("bigram embeddings")
    if cfg.has_smear:
        reasons.append("smear and backout")
    if cfg.qk_scale != 1.0:
        reasons.append(f"a q/k gain of {cfg.qk_scale}")
    if cfg.swiglu or cfg.engram_layers or cfg.mhc:
        reasons.append("fork layers (SwiGLU, Engram or mHC)")
    if cfg.has_lambdas:
        resid, x0 = sd.get("resid_lambdas"), sd.get("x0_lambdas")
        if resid is None or x0 is None or not bool((resid == 1).all()) or not bool((x0 == 0).all()):
            reasons.append("trained residual lambdas (resid_lambdas / x0_lambdas are not 1 / 0)")
    if any(w < cfg.sequence_len for w in cfg.window_sizes()) and not cfg.is_fork:
        reasons.append(f"sliding-window attention (window_pattern {cfg.window_pattern!r})")
    return reasons


def _hf_tensors(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    V = cfg.vocab_size
    out = {
        "model.embed_tokens.weight": sd["transformer.wte.weight"][:V],
        "lm_head.weight": sd["lm_head.weight"][:V],
    }
    names = {
        "attn.c_q": "self_attn.q_proj",
        "attn.c_k": "self_attn.k_proj",
        "attn.c_v": "self_attn.v_proj",
        "attn.c_proj": "self_attn.o_proj",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
    }
    for i in range(cfg.n_layer):
        for old, new in names.items():
            out[f"model.layers.{i}.{new}.weight"] = sd[f"transformer.h.{i}.{old}.weight"]
    return {k: t.to(torch.float32).contiguous() for k, t in out.items()}


def _configs(cfg: ModelConfig, specials: dict[str, int]) -> dict[str, dict[str, Any]]:
    bos, end = specials[BOS], specials[ASSISTANT_END]
    model_config = {
        "architectures": ["NanoChatForCausalLM"],
        "model_type": "nanochat",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "max_position_embeddings": cfg.sequence_len,
        "hidden_act": "relu2",
        "rms_norm_eps": FLOAT32_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "final_logit_softcapping": cfg.softcap,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": end,
        "pad_token_id": end,
        "dtype": "float32",
        "use_cache": True,
    }
    generation = {"bos_token_id": bos, "eos_token_id": [end, bos], "pad_token_id": end}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": ASSISTANT_END,
        "pad_token": ASSISTANT_END,
        "model_max_length": cfg.sequence_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    return {
        "config.json": model_config,
        "generation_config.json": generation,
        "tokenizer_config.json": tokenizer_config,
    }


def export_to_hf(
    directory: Path,
    out: Path,
    options: LoadOptions | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ExportReport:
    """Write ``directory``'s checkpoint (``options.step``, default the latest) to ``out`` and verify
    it; ``out`` must be absent or empty. Nothing is left in ``out`` when the export fails, or when
    ``cancel`` is set (it is read between the export's stages)."""
    opts = options or LoadOptions()
    report = stoppable(progress or (lambda _p, _m: None), cancel, "the export was stopped; nothing was kept")
    directory, out = Path(directory).expanduser(), Path(out).expanduser()
    created = _claim(out)  # before any work: a bad OUT fails at once, not after the conversion
    try:
        return _export(directory, out, opts, report)
    except BaseException:
        _remove(out, created)
        raise


def _claim(out: Path) -> bool:
    """Make ``out`` (absent or an empty folder) and prove a file can be written in it; True when
    it was created here. Refuses a file, a non-empty folder, a dangling link or a place where
    nothing can be written (below a file, /proc, a read-only disk) in one line."""
    if out.is_symlink() and not out.exists():
        raise NanoscopeError(f"{out}: a link to nothing; choose a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NanoscopeError(f"{out}: exists and is not an empty folder; choose a new one")
    created = not out.exists()
    probe = out / ".nanoscope-write-test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        _remove(out, created)
        raise NanoscopeError(f"{out}: cannot write the export here ({exc.strerror or exc})") from None
    return created


def _export(directory: Path, out: Path, opts: LoadOptions, report: Progress) -> ExportReport:
    report(5, "Loading the checkpoint")
    loaded = load_model(directory, opts.step, "cpu", "float32", opts.softcap)
    cfg = loaded.config
    sd = ckpt.load_state_dict(loaded.model_file)  # memory-mapped: shares pages with the model's
    blockers = export_blockers(cfg, sd)
    if blockers:
        raise UnsupportedFormatError(
            f"{loaded.model_file}: cannot be exported exactly to the transformers NanoChat format: "
            + "; ".join(blockers)
        )
    tok = select_tokenizer(tokenizer_dirs(directory, opts.base_dir), cfg.vocab_size, False, opts.tokenizer)
    if tok.kind != "tiktoken":
        raise UnsupportedFormatError(f"{tok.path}: only nanochat's tokenizer.pkl can be exported")
    state = cast(dict[str, Any], load_tiktoken_pickle(tok.path).__getstate__())
    missing = [name for name in SPECIAL_TOKENS if name not in state["special_tokens"]]
    if missing:
        raise UnsupportedFormatError(f"{tok.path}: lacks nanochat's special tokens {', '.join(missing)}")
    report(20, "Converting the tokenizer")
    hf_tok = build_tokenizer(state)
    compared = check_same_encoding(hf_tok, tok.encode)
    sample = [tok.bos_id, *tok.encode(" ".join(SAMPLE_TEXTS))][: min(COMPARE_TOKENS, cfg.sequence_len)]
    ids = torch.tensor([sample])
    report(30, "Computing the source's logits")
    source, source_fp32 = _source_logits(loaded.model, cfg, ids)
    expected_chat = render_for_completion(tok, list(SAMPLE_CONVERSATION), None).ids
    del loaded
    report(45, "Writing safetensors")
    _write(out, cfg, sd, state, hf_tok)
    del sd
    report(70, "Checking the export")
    return _verify(out, cfg, ids, (source, source_fp32), expected_chat, compared, report)


def _remove(out: Path, created: bool) -> None:
    """Undo a failed export: the folder if it was made for it, else what was written into it."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _source_logits(model: Any, cfg: ModelConfig, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The source's logits as nanochat computes them, and with float32 rotary tables (the port's
    only numeric difference from E0-E2, whose tables nanochat rounds to bf16)."""
    with torch.inference_mode():
        source = model(ids)[0]
        model.rotation = rotary_tables(
            replace(cfg, rope_bf16=False), model.device, model.compute_dtype, ids.size(1)
        )
        return source, model(ids)[0]


def _write(
    out: Path, cfg: ModelConfig, sd: dict[str, torch.Tensor], state: dict[str, Any], hf_tok: Any
) -> None:
    from safetensors.torch import save_file

    save_file(_hf_tensors(cfg, sd), str(out / "model.safetensors"), metadata={"format": "pt"})
    for name, data in _configs(cfg, state["special_tokens"]).items():
        (out / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    hf_tok.save(str(out / "tokenizer.json"))


def _verify(
    out: Path,
    cfg: ModelConfig,
    ids: torch.Tensor,
    sources: tuple[torch.Tensor, torch.Tensor],
    expected_chat: list[int],
    compared: int,
    report: Progress,
) -> ExportReport:
    source, source_fp32 = sources
    backend = HFBackend.open(out, LoadOptions(device="cpu", dtype="float32"))
    try:
        chat = backend.chat_ids(SAMPLE_CONVERSATION)
        if chat != expected_chat:
            raise CheckpointError(f"{out}: the chat template does not give nanochat's chat ids")
        logits = backend.model(ids)[0]
        parameters = backend.info().parameters
    finally:
        backend.close()
    exact = float((logits - source_fp32).abs().max())
    if exact > EXACT_TOLERANCE:
        raise CheckpointError(f"{out}: the exported model's logits differ from the source's by {exact:.2e}")
    report(85, "Checking the export with transformers")
    return ExportReport(
        out=out,
        era=cfg.era,
        parameters=parameters,
        tokens_compared=compared,
        max_diff_exact=exact,
        max_diff_source=float((logits - source).abs().max()),
        max_diff_transformers=_transformers_diff(out, ids, source_fp32, expected_chat),
    )


def _transformers_diff(
    out: Path, ids: torch.Tensor, source_fp32: torch.Tensor, expected_chat: list[int]
) -> float | None:
    """Load the export with transformers itself, when it is installed, and compare."""
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Its progress bars and length warnings would land in the user's terminal or log.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
        chat = tokenizer.apply_chat_template(
            message_dicts(SAMPLE_CONVERSATION), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        with torch.inference_mode():
            logits = model(ids).logits[0].float()
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    if list(chat) != expected_chat:
        raise CheckpointError(f"{out}: transformers renders the chat template to other ids than nanochat")
    return float((logits - source_fp32).abs().max())
