"""Tiny Hugging Face model directories written by transformers itself (no network, deterministic).

``write_hf_model(directory, model_type, ...)`` builds a random ``NanoChatForCausalLM`` or
``LlamaForCausalLM`` from a tiny config and ``save_pretrained`` s it together with a small
byte-level BPE tokenizer (trained here on the tokenizer fixtures' text, nanochat's nine special
tokens added) and, optionally, a chat template. Weights are drawn with a large init range so
that greedy choices are far from ties: parity tests compare ids, not near-equal floats.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from desktop.engine.nanochat.special_tokens import SPECIAL_TOKENS
from support.tokenizer_factory import TRAINING_TEXT

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A ChatML-like template using the tokenizer's own tokens, for the Llama fixture.
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|user_start|>' if message['role'] == 'user' else '<|assistant_start|>' }}"
    "{{ message['content'] | trim }}"
    "{{ '<|user_end|>' if message['role'] == 'user' else '<|assistant_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant_start|>' }}{% endif %}"
)


def make_tokenizer(vocab_size: int = 400) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT] * 3, trainer)
    return tok


def hf_config(model_type: str, vocab_size: int, **overrides: Any) -> Any:
    from transformers import LlamaConfig, NanoChatConfig

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=4,  # <|assistant_end|>
        pad_token_id=4,
        initializer_range=0.25,
    )
    common.update(overrides)
    return NanoChatConfig(**common) if model_type == "nanochat" else LlamaConfig(**common)


def write_hf_model(
    directory: Path,
    model_type: str = "nanochat",
    *,
    chat_template: str | None = None,
    seed: int = 0,
    edit: Any = None,
    **config: Any,
) -> Path:
    """Write a transformers model + tokenizer to ``directory``; ``edit(model)`` may change weights
    before saving. Returns ``directory``."""
    from transformers import LlamaForCausalLM, NanoChatForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keeps stderr to what the code under test prints
    tok = make_tokenizer()
    torch.manual_seed(seed)
    cls = NanoChatForCausalLM if model_type == "nanochat" else LlamaForCausalLM
    model = cls(hf_config(model_type, tok.get_vocab_size(), **config)).eval()
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model.save_pretrained(directory)
    wrapper = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|assistant_end|>",
        pad_token="<|assistant_end|>",
        chat_template=chat_template,
    )
    wrapper.save_pretrained(directory)
    return Path(directory)


def load_reference(directory: Path) -> tuple[Any, Any]:
    """transformers' own model (float32, CPU) and tokenizer for ``directory``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(directory)


def reference_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' ``generate`` with greedy decoding: the new ids (up to and with EOS)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, attention_mask=None
        )
    return out[0, len(prompt) :].tolist()
