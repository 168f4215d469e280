""" "Same model?": where two greedy, same-seed replies first differ, and how far apart their
probabilities are while they agree (no Qt, no torch).

Token ids are compared where both replies have them and mean the same text (one tokenizer).
Otherwise (a served model that gives text only) the replies are compared by text: the first
character where they differ, reported as a token position in each; probabilities are compared
for the tokens both replies cut at the same place before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from desktop.engine.messages import TokenTrace


@dataclass(frozen=True)
class SameModelReport:
    compared_by: str  # "ids" or "text"
    first_difference: int | None  # token position in reply A where they first differ; None: identical
    first_difference_b: int | None  # the same place in reply B
    length_a: int
    length_b: int
    mean_abs_dlogprob: float | None  # over the agreeing prefix, where both gave log-probabilities
    logprob_tokens: int  # how many tokens that mean covers

    @property
    def identical(self) -> bool:
        return self.first_difference is None

    def summary(self, a: str = "A", b: str = "B") -> str:
        """One line for the status bar and the report banner."""
        if self.identical:
            head = f"Same {self.length_a} tokens"
        else:
            where = f"token {self.first_difference} of {a}"
            if self.first_difference_b != self.first_difference:
                where += f" / {self.first_difference_b} of {b}"
            head = f"First difference at {where}"
        head += " (by token ids)" if self.compared_by == "ids" else " (by text: no shared token ids)"
        if self.mean_abs_dlogprob is None:
            tail = "no log-probabilities from both models to compare"
        else:
            tail = f"mean |Δ log p| {self.mean_abs_dlogprob:.2e} over {self.logprob_tokens} agreeing tokens"
        return f"{head}; {tail}."


def compare_replies(a: TokenTrace, b: TokenTrace, by_ids: bool) -> SameModelReport:
    """Compare two replies token by token (``by_ids``) or by text."""
    if by_ids:
        n = min(len(a.ids), len(b.ids))
        first = next((i for i in range(n) if a.ids[i] != b.ids[i]), None)
        if first is None and len(a.ids) != len(b.ids):
            first = n
        pairs = [(i, i) for i in range(first if first is not None else n)]
        return _report("ids", a, b, first, first, pairs)
    text_a, text_b = "".join(a.texts), "".join(b.texts)
    common = _common_prefix(text_a, text_b)
    identical = text_a == text_b
    starts_a, starts_b = _starts(a.texts), _starts(b.texts)
    first_a = None if identical else _token_at(starts_a, a.texts, common)
    first_b = None if identical else _token_at(starts_b, b.texts, common)
    # Tokens cut the same way (same start, same text) inside the agreeing text.
    index_b = {(s, t): j for j, (s, t) in enumerate(zip(starts_b, b.texts, strict=True))}
    pairs = []
    for i, (s, t) in enumerate(zip(starts_a, a.texts, strict=True)):
        j = index_b.get((s, t))
        if j is not None and s + len(t) <= common:
            pairs.append((i, j))
    return _report("text", a, b, first_a, first_b, pairs)


def _report(
    by: str,
    a: TokenTrace,
    b: TokenTrace,
    first_a: int | None,
    first_b: int | None,
    pairs: list[tuple[int, int]],
) -> SameModelReport:
    deltas = [
        abs(a.logprobs[i][0] - b.logprobs[j][0])  # type: ignore[index]
        for i, j in pairs
        if a.logprobs[i] is not None and b.logprobs[j] is not None
    ]
    mean = sum(deltas) / len(deltas) if deltas else None
    return SameModelReport(by, first_a, first_b, len(a), len(b), mean, len(deltas))


def _common_prefix(x: str, y: str) -> int:
    n = min(len(x), len(y))
    return next((i for i in range(n) if x[i] != y[i]), n)


def _starts(texts: list[str]) -> list[int]:
    return [0, *accumulate(len(t) for t in texts)][:-1] if texts else []


def _token_at(starts: list[int], texts: list[str], offset: int) -> int:
    """The token whose text holds character ``offset`` (the end: one past the last token)."""
    for i, (s, t) in enumerate(zip(starts, texts, strict=True)):
        if s <= offset < s + len(t):
            return i
    return len(texts)
