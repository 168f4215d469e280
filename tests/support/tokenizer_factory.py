"""Write tiny, real tokenizer files for tests (no network, no downloads, deterministic).

Public helpers -- every one writes a file and returns its path:

``write_tiktoken_pkl(dirpath, vocab_size=512)``
    ``<dirpath>/tokenizer.pkl`` exactly as nanochat saves it: ``pickle.dump`` of a
    ``tiktoken.Encoding`` named "rustbpe" with nanochat's split pattern, 256 byte tokens plus
    merges learned by a small deterministic byte-level BPE over :data:`TRAINING_TEXT` (which
    includes emoji and CJK, so some tokens hold partial UTF-8), and nanochat's nine
    :data:`SPECIAL_TOKENS` as the last nine ids. ``vocab_size`` is exact (ranks = vocab - 9);
    ``n_merges=`` may be given instead. ``with_token_bytes=True`` also writes ``token_bytes.pt``.
``write_cpp_tokenizer_json(dirpath, vocab_size=400, tool_result_token=False)``
    ``<dirpath>/tokenizer.json`` shaped like the fork's C++ tokenizer (spec §2.4): a HF
    ``tokenizers`` BPE with :data:`CPP_CONTROL_TOKENS` at ids 0-19 (id 19 is ``<RESERVED_19>``,
    or ``<TOOL_RESULT>`` with ``tool_result_token=True``), :data:`CPP_KEYWORDS` and newline
    tokens as added special tokens, a C++ punctuation ``Split`` + ``WhitespaceSplit``
    pre-tokenizer, unk ``<UNK>``, no decoder. ``vocab_size`` is exact.
``write_evil_pickle(path, marker_file, disguised=False)``
    A pickle that creates ``marker_file`` when loaded with plain ``pickle``. ``disguised=True``
    hides the payload inside the state of a ``tiktoken.core.Encoding``.
``write_wrong_class_pickle(path)``
    A harmless pickle of a class other than ``tiktoken.Encoding`` (``datetime.date``).
"""

from __future__ import annotations

import copyreg
import datetime
import functools
import itertools
import pickle
import string
from collections import Counter
from pathlib import Path

import regex
import tiktoken
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

from desktop.engine.nanochat.special_tokens import SPECIAL_TOKENS

SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away again and again.
Hello there! How are you today? I am fine, thank you. What is the answer to 15*8? It is 120.
Strawberry has three r letters: s-t-r-a-w-b-e-r-r-y. Counting letters is harder than it looks.
In 2024 the model read 1,000,000 tokens, then 2,500,000 more. Numbers like 3.14159 and 2.71828.
def add(a, b):
    return a + b

for i in range(10):
    print(i * i)
Emoji time: 😀 😀 😃 🎉 🎉 🚀 🚀 🚀 — smiles, parties and rockets. Café, naïve, résumé, über.
中文文本：你好，世界！你好，朋友。我们学习语言模型。日本語のテキスト：こんにちは世界。
Русский текст: привет, мир! Ελληνικά: γειά σου κόσμε. עברית: שלום עולם.
The assistant answered the user, and the user asked the assistant another question.
"""


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


CPP_CONTROL_TOKENS = _names("""
    <PAD> <UNK> <BOS> <EOS> <FIM_PREFIX> <FIM_MIDDLE> <FIM_SUFFIX> <CODE_START> <CODE_END> <THOUGHT_START>
    <THOUGHT_END> <QUERY_TOOL> <INDEX> <DEBUG_CONTEXT> <FILE_SEP> <DIFF_START> <DIFF_END> <COMMENT_START>
    <COMMENT_END> <RESERVED_19>
""")
CPP_KEYWORDS = _names("""
    int char void bool float double auto const class struct return if else for while namespace template
    typename public private static virtual override unsigned long std vector string map size_t nullptr
    include true false
""")
CPP_NEWLINES = ("\n", "\n\n")
# Multi-character operators get merges of their own (before anything learned), as a code
# tokenizer trained on C++ would have.
CPP_OPERATORS = _names(
    ":: -> ->* ... .* ++ -- ## <=> <<= >>= == != <= >= && || << >> += -= *= /= %= &= |= ^= // /* */"
)
# Operators longest first, then single punctuation; "_" is split off as in the fork.
CPP_SPLIT_PATTERN = (
    r"::|->\*|->|\.\.\.|\.\*|\+\+|--|##|<=>|<<=|>>=|==|!=|<=|>=|&&|\|\||<<|>>|[-+*/%&|^]=|//|/\*|\*/"
    r"|[{}()\[\]<>;:,.+\-*/%&|^~!?=#@$\\\"'_]"
)
CPP_TRAINING_TEXT = """\
#include <vector>
#include <string>
namespace demo {
class Counter {
public:
    explicit Counter(int start) : value_(start) {}
    int next() { return ++value_; }
    bool is_prime(int n) const {
        if (n < 2) return false;
        for (int i = 2; i * i <= n; ++i) if (n % i == 0) return false;
        return true;
    }
private:
    int value_;
};
template <typename T> T max_of(const std::vector<T>& items) {
    T best = items[0];
    for (const auto& item : items) if (item > best) best = item;
    return best;
}
}  // namespace demo
int main(int argc, char** argv) {
    std::vector<int> numbers = {1, 2, 3, 42};
    std::string message = "checkpoint loaded";
    demo::Counter counter(0);
    while (counter.next() < 10) { numbers.push_back(counter.next()); }
    return numbers.size() > 3 ? 0 : 1;
}
"""


def _fallback_pairs(alphabet: list[str]):
    """Deterministic extra pairs for when the training text runs out of merges."""
    for a in alphabet:
        for b in alphabet:
            yield a, b


@functools.lru_cache(maxsize=16)
def _byte_bpe_ranks(n_merges: int) -> tuple[tuple[bytes, int], ...]:
    """256 byte tokens + ``n_merges`` merged tokens learned from TRAINING_TEXT."""
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    words = Counter(regex.findall(SPLIT_PATTERN, TRAINING_TEXT))
    seqs = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
    while len(ranks) < 256 + n_merges:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for w, seq in seqs.items():
            for pair in itertools.pairwise(seq):
                pairs[pair] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        ranks.setdefault(merged, len(ranks))
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    printable = [bytes([b]) for b in range(0x21, 0x7F)]
    fallback = (a + b for a, b in _fallback_pairs(printable))
    while len(ranks) < 256 + n_merges:
        ranks.setdefault(next(fallback), len(ranks))
    return tuple(ranks.items())


def make_tiktoken_encoding(vocab_size: int = 512) -> tiktoken.Encoding:
    """The encoding :func:`write_tiktoken_pkl` pickles, for tests that want it in memory."""
    n_ranks = vocab_size - len(SPECIAL_TOKENS)
    if n_ranks < 256:
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)}")
    ranks = dict(_byte_bpe_ranks(n_ranks - 256))
    specials = {name: n_ranks + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(
        name="rustbpe", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


def write_tiktoken_pkl(
    dirpath: Path,
    *,
    vocab_size: int | None = None,
    n_merges: int | None = None,
    with_token_bytes: bool = False,
) -> Path:
    """Write ``<dirpath>/tokenizer.pkl`` (vocab 512 by default) and return its path."""
    if vocab_size is not None and n_merges is not None:
        raise ValueError("give vocab_size or n_merges, not both")
    if vocab_size is None:
        vocab_size = 256 + (n_merges if n_merges is not None else 247) + len(SPECIAL_TOKENS)
    enc = make_tiktoken_encoding(vocab_size)
    dirpath = Path(dirpath)
    dirpath.mkdir(parents=True, exist_ok=True)
    path = dirpath / "tokenizer.pkl"
    with path.open("wb") as f:
        pickle.dump(enc, f)
    if with_token_bytes:
        import torch

        # Byte length of every token, 0 for the specials, as nanochat's tok_train writes it.
        n_ranks = vocab_size - len(SPECIAL_TOKENS)
        lengths = [len(enc.decode_single_token_bytes(i)) for i in range(n_ranks)] + [0] * len(SPECIAL_TOKENS)
        torch.save(torch.tensor(lengths, dtype=torch.int32), dirpath / "token_bytes.pt")
    return path


def _cpp_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CPP_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.WhitespaceSplit(),
        ]
    )


def write_cpp_tokenizer_json(
    dirpath: Path, *, vocab_size: int = 400, tool_result_token: bool = False
) -> Path:
    """Write ``<dirpath>/tokenizer.json`` shaped like the fork's C++ tokenizer and return its path."""
    controls = list(CPP_CONTROL_TOKENS)
    if tool_result_token:
        controls[19] = "<TOOL_RESULT>"
    added = [*controls, *CPP_KEYWORDS, *CPP_NEWLINES]
    vocab = {tok: i for i, tok in enumerate(added)}
    words = Counter(
        piece for piece, _ in _cpp_pre_tokenizer().pre_tokenize_str(CPP_TRAINING_TEXT) if piece not in vocab
    )
    # Every printable ASCII character, as a real code tokenizer has, plus what the text uses.
    ascii_chars = set(string.ascii_letters + string.digits + string.punctuation)
    alphabet = sorted({c for w in words for c in w} | ascii_chars)
    for c in alphabet:
        vocab.setdefault(c, len(vocab))
    merges: list[tuple[str, str]] = []
    for op in CPP_OPERATORS:
        for k in range(1, len(op)):
            if op[: k + 1] not in vocab:
                merges.append((op[:k], op[k]))
                vocab[op[: k + 1]] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size must be at least {len(vocab)}")
    seqs = {w: list(w) for w in words}
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, seq in seqs.items():
            for pair in itertools.pairwise(seq):
                pairs[pair] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    for a, b in _fallback_pairs(alphabet):
        if len(vocab) >= vocab_size:
            break
        if a + b not in vocab:
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<UNK>"))
    tokenizer.pre_tokenizer = _cpp_pre_tokenizer()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in controls]
        + [AddedToken(t, special=True, normalized=False, single_word=True) for t in CPP_KEYWORDS]
        + [AddedToken(t, special=True, normalized=False) for t in CPP_NEWLINES]
    )
    dirpath = Path(dirpath)
    dirpath.mkdir(parents=True, exist_ok=True)
    path = dirpath / "tokenizer.json"
    tokenizer.save(str(path))
    return path


class _Touch:
    """Unpickling this calls ``Path(marker).touch()``: harmless, but proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = Path(marker)

    def __reduce__(self):
        return (Path.touch, (self.marker,))


class _DisguisedEncoding:
    """Pickles as ``tiktoken.core.Encoding`` whose state dict carries a :class:`_Touch`."""

    # pickle checks ``obj.__class__`` against the class handed to ``copyreg.__newobj__``.
    __class__ = property(lambda self: tiktoken.Encoding)  # type: ignore[assignment]

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce_ex__(self, protocol):
        state = {"name": _Touch(self.marker), "pat_str": "x", "mergeable_ranks": {}, "special_tokens": {}}
        return (copyreg.__newobj__, (tiktoken.Encoding,), state)


def write_evil_pickle(path: Path, marker_file: Path, *, disguised: bool = False) -> Path:
    """Write a pickle that creates ``marker_file`` if anyone loads it with plain ``pickle``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = _DisguisedEncoding(marker_file) if disguised else _Touch(marker_file)
    path.write_bytes(pickle.dumps(payload))
    return path


def write_wrong_class_pickle(path: Path) -> Path:
    """Write a pickle of a harmless class that is not ``tiktoken.Encoding``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(datetime.date(2024, 1, 1)))
    return path
