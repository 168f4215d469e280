"""The text under and about a chat message, without widgets: its stats footer (with the sampling
values, the fork and the speculative decoding it used), the raw-token summary line, and what
"Copy" copies. Compare's panes use the same lines."""

from __future__ import annotations

from desktop.engine.messages import Message
from desktop.qt.widgets.token_records import FORK_GLYPH, TokenRecord

STOP_REASONS = {"cancelled": "stopped", "max_tokens": "max tokens reached", "context": "context full"}
SPECULATIVE_NOTE = (
    "speculative decoding: the model's own distribution, drafted ahead; the seed repeats "
    "Nanoscope's own speculative stream, not nanochat's"
)


def copy_text(message: Message) -> str:
    """What "Copy" puts on the clipboard: the prose, or every part when there is no prose."""
    return message.plain_text() or "".join(p.text for p in message.parts)


def draft_label(draft: str) -> str:
    """How a footer names a draft: ``int8`` as it is, another checkpoint by its folder and step
    (``demo-d2@1200``), not its whole path."""
    precision, sep, rest = draft.partition(":")
    if not sep or "/" in precision:
        precision, rest = "", draft
    if "/" not in rest:
        return draft
    return f"{precision} {rest.rstrip('/').rsplit('/', 1)[-1]}".strip()


def speculative_line(draft: str, stats: dict) -> str:
    """ "speculative (int8) · 92% of 48 drafted kept": on, with which draft (", compiled" when it
    ran its compiled forward; "target compiled" when the target's passes ran its compiled twin),
    how much was kept. A reply that drafted nothing decoded plainly: the line says why, as the
    engine said it ("int8 copy not faster on this CPU: drafted nothing"); "" before it ended."""
    drafted = stats.get("drafted") or 0
    if not drafted:
        if stats.get("draft_skipped"):
            return str(stats["draft_skipped"])
        # A reply saved before the engine said why, or one that failed: no claim beyond the count.
        return f"{draft_label(draft)} draft: drafted nothing" if stats.get("new_tokens") else ""
    compiled = [
        said
        for key, said in (("draft_compiled", "compiled"), ("verifier_compiled", "target compiled"))
        if stats.get(key)
    ]
    named = f"speculative ({', '.join([draft_label(draft), *compiled])})"
    kept = 100 * (stats.get("accepted") or 0) / drafted
    return f"{named} · {kept:.0f}% of {drafted} drafted kept"


# The first reply after a kernel or speculative choice was made anew (Settings › Re-measure
# kernels, a new torch, another CPU: GenerationStats.choices_renewed).
RENEWED = "kernels chosen anew: this mode's replies may differ from older ones"


def step_line(stats: dict) -> str:
    """How a plain reply's one-row steps ran in fast or int8 mode: "compiled steps", or why they
    ran eagerly as the engine said it ("eager steps (compiling)"); "" where nothing is compiled
    (exact mode, a GPU, a speculative reply, a reply saved before)."""
    if stats.get("step_compiled"):
        return "compiled steps"
    return str(stats.get("step_eager") or "")


def drafted(stats: dict) -> bool:
    """Whether a reply's tokens were drafted ahead (its seed then repeats the speculative stream)."""
    return bool(stats.get("drafted"))


def raw_summary(records: list[TokenRecord]) -> str:
    """The line under the token view: how many tokens, and of which sort."""
    special = sum(r.special is not None for r in records)
    forced = sum(r.forced for r in records)
    line = f"{len(records)} tokens · {special} special · {forced} forced by a tool"
    given = sum(r.given for r in records)
    kept = sum(r.draft == "accepted" for r in records)
    corrected = sum(r.draft == "corrected" for r in records)
    drafts = (
        f" · {kept} drafted and kept (green) · {corrected} corrected (amber)" if kept or corrected else ""
    )
    return line + (f" · {given} yours" if given else "") + drafts + " · click a token for its alternatives"


def format_stats(meta: dict) -> tuple[str, str]:
    """The footer line and its tooltip, from a message's meta (stats, sampling, checkpoint)."""
    stats = meta.get("stats") or {}
    bits: list[str] = []
    if meta.get("error") or stats.get("error"):
        bits.append(f"⚠ {meta.get('error') or stats.get('error')}")
    fork = meta.get("fork")
    if isinstance(fork, dict) and fork.get("prefill"):
        bits.append(f"{FORK_GLYPH} began with your words")
    elif isinstance(fork, dict) and isinstance(fork.get("at"), int):
        verb = "continued after" if fork.get("continued") else "forked at"
        bits.append(f"{FORK_GLYPH} {verb} token {fork['at']}")
    if stats.get("new_tokens"):
        bits.append(f"{stats['new_tokens']} tokens")
    if stats.get("decode_tok_s"):
        bits.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if line := step_line(stats):
        bits.append(line)
    if stats.get("ttft_ms"):
        bits.append(f"TTFT {stats['ttft_ms']:.0f} ms")
    if stats.get("stopped") in STOP_REASONS:
        bits.append(STOP_REASONS[stats["stopped"]])
    if meta.get("draft") and (line := speculative_line(str(meta["draft"]), stats)):
        bits.append(line)
    elif meta.get("draft_skipped") and not meta.get("error"):  # a draft chosen, not asked for: why
        bits.append(str(meta["draft_skipped"]))
    if stats.get("choices_renewed"):
        bits.append(RENEWED)
    if stats.get("greedy_fallbacks"):  # the distribution degenerated (e.g. a tiny temperature)
        bits.append(f"⚠ {stats['greedy_fallbacks']} token(s) taken greedily")
    sampling = meta.get("sampling") or {}
    if sampling:
        t = sampling.get("temperature")
        if t == 0:
            bits.append("greedy")
        else:
            knobs = [f"T {t:g}"] if t is not None else []
            if sampling.get("top_k"):
                knobs.append(f"top-k {sampling['top_k']}")
            if sampling.get("top_p") not in (None, 1, 1.0):
                knobs.append(f"top-p {sampling['top_p']:g}")
            if sampling.get("min_p"):
                knobs.append(f"min-p {sampling['min_p']:g}")
            if sampling.get("repetition_penalty") not in (None, 1, 1.0):
                knobs.append(f"rep {sampling['repetition_penalty']:g}")
            if sampling.get("seed") is not None:
                knobs.append(f"seed {sampling['seed']}")
            bits.append(" ".join(knobs))
    if meta.get("name"):  # "sft/d20 · step 1,500", as the exports and the picker name it
        bits.append(str(meta["name"]))
    elif meta.get("tag"):  # replies saved before the name was recorded
        step = meta.get("step")
        bits.append(f"{meta['tag']} · step {step:,}" if isinstance(step, int) else str(meta["tag"]))
    tip_lines = [f"{k.replace('_', ' ')}: {v}" for k, v in sampling.items()]
    tip_lines += [f"{k}: {meta[k]}" for k in ("checkpoint", "era", "dtype", "device") if meta.get(k)]
    if stats.get("prompt_tokens"):
        tip_lines.append(f"prompt tokens: {stats['prompt_tokens']}")
    if meta.get("draft"):
        tip_lines += [f"draft: {meta['draft']}", *([SPECULATIVE_NOTE] * drafted(stats))]
    return "  ·  ".join(bits), "\n".join(tip_lines)
