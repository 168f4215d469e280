"""Golden Hugging Face model folders, written by transformers' own ``save_pretrained``.

``python -m tools.golden transformers [--out tests/golden]``

transformers has no revision to check out: the installed release writes the folders, and its
version is recorded. For each case, its own code

* builds a tiny ``NanoChatForCausalLM`` or ``LlamaForCausalLM`` from its own config class and
  trains it briefly (AdamW, its own loss) on a story told in a fixed order, so greedy decoding is
  decided by clear logit gaps;
* saves it with ``save_pretrained`` (the sharded case with a ``max_shard_size`` that makes
  several safetensors files and their index; one case in bfloat16), and the tokenizer, a
  byte-level BPE trained by ``tokenizers`` with nanochat's special tokens, with
  ``PreTrainedTokenizerFast.save_pretrained`` and a chat template;
* loads the folder back with ``AutoModelForCausalLM`` / ``AutoTokenizer`` in float32 and records
  what ``generate(do_sample=False)`` gives for plain prompts (``tokenizer(text)``) and for a chat
  rendered by ``apply_chat_template``, with the top-2 logit gap of every greedy step.

Seeded sampling is not recorded: transformers draws from its own logits processors and RNG
stream, which Nanoscope's sampler (shared by every family) does not claim to follow.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .common import check_corpus, story_documents, write_manifest

VOCAB = 400
SPECIALS = (
    "<|bos|>",
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|output_start|>",
    "<|output_end|>",
)
BOS, EOS = SPECIALS[0], SPECIALS[4]
# A ChatML-like template in the tokenizer's own tokens (for the Llama cases; the NanoChat case
# uses the template its own export writes).
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|user_start|>' if message['role'] == 'user' else '<|assistant_start|>' }}"
    "{{ message['content'] | trim }}"
    "{{ '<|user_end|>' if message['role'] == 'user' else '<|assistant_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant_start|>' }}{% endif %}"
)
MAX_NEW = 30
STEPS = 300
PROMPTS = ("the small cat", "we ate bread and")
CHAT = "tell me about the red fox"
# name -> (model type, dtype saved, max_shard_size or None)
CASES: dict[str, tuple[str, torch.dtype, str | None]] = {
    "nanochat": ("nanochat", torch.float32, None),
    "llama-bf16": ("llama", torch.bfloat16, None),
    "llama-sharded": ("llama", torch.float32, "100KB"),
}


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def config(model_type: str, tok: Tokenizer) -> Any:
    common: dict[str, Any] = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(EOS),
    )
    if model_type == "nanochat":
        return transformers.NanoChatConfig(**common)
    return transformers.LlamaConfig(**common, tie_word_embeddings=False)


def train(model: Any, tok: Tokenizer, texts: list[str], seed: int) -> float:
    """A few hundred AdamW steps of next-token loss on documents of the story."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids = [i for text in texts for i in [bos, *tok.encode(text).ids, eos]]
    data = torch.tensor(ids)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(STEPS):
        starts = torch.randint(0, len(data) - 65, (16,), generator=gen)
        batch = torch.stack([data[s : s + 64] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return loss.item()


def greedy(model: Any, prompt: list[int]) -> tuple[list[int], list[float]]:
    """``generate(do_sample=False)``'s new ids (up to and with EOS) and each step's top-2 gap."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    ids = out.sequences[0, len(prompt) :].tolist()
    gaps = [float(torch.topk(s[0].float(), 2).values.diff().abs()) for s in out.scores]
    return ids, gaps


def write_case(name: str, out: Path, texts: list[str], tok: Tokenizer) -> dict[str, Any]:
    model_type, dtype, shard = CASES[name]
    case = out / "transformers" / name
    case.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cls = transformers.NanoChatForCausalLM if model_type == "nanochat" else transformers.LlamaForCausalLM
    model = cls(config(model_type, tok))
    loss = train(model, tok, texts, seed=1)
    model.to(dtype).save_pretrained(case, **({"max_shard_size": shard} if shard else {}))
    if model_type == "nanochat":
        from desktop.engine.export.hf_export import CHAT_TEMPLATE as template
    else:
        template = LLAMA_TEMPLATE
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS, chat_template=template
    ).save_pretrained(case)

    ref = transformers.AutoModelForCausalLM.from_pretrained(case, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(case)
    expected = []
    for text in PROMPTS:
        prompt = list(hf_tok(text)["input_ids"])
        ids, gaps = greedy(ref, prompt)
        expected.append({"text": text, "chat": False, "prompt_ids": prompt, "greedy": ids, "gaps": gaps})
    chat = [{"role": "user", "content": CHAT}]
    rendered = hf_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = list(rendered)
    ids, gaps = greedy(ref, prompt)
    expected.append({"text": CHAT, "chat": True, "prompt_ids": prompt, "greedy": ids, "gaps": gaps})
    manifest = {
        "family": "transformers",
        "model_class": cls.__name__,
        "saved_dtype": str(dtype).removeprefix("torch."),
        "max_shard_size": shard,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "train_steps": STEPS,
        "last_loss": round(loss, 4),
        "max_new_tokens": MAX_NEW,
        "expected": expected,
    }
    write_manifest(case, manifest)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden transformers")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    texts = story_documents(random.Random(0), 1500)
    tok = train_tokenizer(texts)
    for name in CASES:
        m = write_case(name, args.out, texts, tok)
        smallest = min(g for c in m["expected"] for g in c["gaps"])
        print(f"{name}: loss {m['last_loss']}, smallest greedy gap {smallest:.4f}")
    print(f"corpus: {check_corpus(args.out)} bytes")
    return 0
