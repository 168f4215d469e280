"""nanochat's ``tokenizer.pkl`` (a tiktoken encoding) as a Hugging Face ``tokenizer.json``.

tiktoken splits text with a regex, then merges bytes inside each piece by rank; a piece that is
itself a token is taken whole. The ``tokenizers`` equivalent is a byte-level BPE:

* the pre-tokenizer splits with the same pattern (``Split``, isolated), then maps bytes to the
  GPT-2 printable alphabet (``ByteLevel`` without its own regex);
* the vocabulary holds every token spelled in that alphabet, with its rank as id;
* the merges list, for every token of two or more bytes, each way of cutting it into two tokens,
  ordered by the rank of the token it makes, so the lowest-rank merge always applies first as in
  tiktoken; ``ignore_merges`` takes a whole-piece token directly, as tiktoken does;
* nanochat's special tokens are added tokens with their ids.

:func:`check_same_encoding` verifies the two tokenizers agree on a text sample before an export
is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from desktop.engine.errors import TokenizerError

# Text for the encode check: prose, code, numbers, whitespace runs, several scripts and emoji.
SAMPLE_TEXTS = (
    "Hello world! How are you today? I'm fine, thanks; you've been great.",
    "What is 12 times 7? It is 84. And 1,234,567.89 + 3.14159 = 1234571.03159",
    "def add(a, b):\n    return a + b\n\n\tfor i in range(10):\n        print(i * i)  # squares\n",
    "   leading spaces, trailing spaces   \n\n\nnewlines\r\nand CRLF  ",
    "Café naïve résumé über — “quotes” and ‘apostrophes’ … ellipsis",
    "中文文本：你好，世界！日本語のテキスト：こんにちは。한국어 텍스트: 안녕하세요",
    "Русский текст: привет, мир! Ελληνικά: γειά σου κόσμε. עברית: שלום עולם. العربية: مرحبا",
    "Emoji: 😀 😃 🎉🎉 🚀🚀🚀 👩‍👩‍👧 ✔️ and symbols ©®™ ∑∫√ ≤≥≠",
    "Strawberry has three r's: s-t-r-a-w-b-e-r-r-y. DON'T SHOUT. it's ok, we'll see, they're here",
    "<|bos|> <|user_start|> typed special names stay text here",
)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte → printable character map, which ``tokenizers``' ByteLevel uses: printable
    Latin-1 bytes map to themselves, the others to code points from 256 up, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_tokenizer(state: dict[str, Any]) -> Tokenizer:
    """A ``tokenizers`` tokenizer equal to ``tiktoken.Encoding(**state)`` (its ``__getstate__``)."""
    ranks: dict[bytes, int] = state["mergeable_ranks"]
    specials: dict[str, int] = state["special_tokens"]
    alphabet = byte_alphabet()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], spell(left), spell(right)))
    merges.sort()
    model = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], ignore_merges=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(state["pat_str"]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    ordered = sorted(specials.items(), key=lambda item: item[1])
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name, _ in ordered])
    wrong = [name for name, i in ordered if tok.token_to_id(name) != i]
    if wrong:
        raise TokenizerError(f"special tokens {', '.join(wrong)} would change ids in tokenizer.json")
    return tok


def check_same_encoding(tok: Tokenizer, encode_ordinary: Any, texts: Iterable[str] = SAMPLE_TEXTS) -> int:
    """Raise unless ``tok`` encodes every text (special names as plain text) to tiktoken's ids and
    decodes them back; returns the number of tokens compared."""
    plain = Tokenizer.from_str(tok.to_str())
    plain.encode_special_tokens = True
    compared = 0
    for text in texts:
        expected = list(encode_ordinary(text))
        got = plain.encode(text, add_special_tokens=False).ids
        if got != expected:
            first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
            where = first if first is not None else min(len(got), len(expected))
            raise TokenizerError(
                f"the converted tokenizer encodes {text[:30]!r} unlike tokenizer.pkl (from token {where})"
            )
        if plain.decode(got, skip_special_tokens=False) != text:
            raise TokenizerError(f"the converted tokenizer does not decode {text[:30]!r} back to itself")
        compared += len(got)
    return compared
