"""Export a conversation as Markdown (to read or paste) or JSON (to keep, diff or re-import).

JSON format, version 1 — one object:

    {
      "format": "nanoscope.conversation",   # identifies the file
      "version": 1,                         # bumped on any incompatible change
      "exported_at": "2025-01-31T12:00:00+00:00",
      "app_version": "0.1.0",               # the Nanoscope that wrote it
      "title": "…",
      "meta": {…},                          # conversation metadata (kind, compared checkpoints, …)
      "messages": [                         # the active branch, first message first
        {
          "role": "system" | "user" | "assistant",
          "parts": [{"kind": "text" | "python" | "python_output" | "tool_query"
                             | "tool_result" | "thought", "text": "…"}],
          "meta": {…}                       # per reply: checkpoint, step, seed, sampling, tokens/s, …
        }
      ]
    }

Readers must ignore keys they do not know; writers add keys without bumping ``version``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from desktop import __version__
from desktop.engine.errors import NanoscopeError
from desktop.engine.messages import (
    PYTHON,
    PYTHON_OUTPUT,
    TEXT,
    THOUGHT,
    TOOL_QUERY,
    TOOL_RESULT,
    Message,
)
from desktop.session.compare.analysis import checkpoint_label, describe_sampling

FORMAT = "nanoscope.conversation"
VERSION = 1

_ROLE_HEADINGS = {"system": "System", "user": "User", "assistant": "Assistant"}
# Fence info strings: a calculator call is Python; results say they are output.
_FENCES = {PYTHON: "python", PYTHON_OUTPUT: "output", TOOL_QUERY: "tool-call", TOOL_RESULT: "tool-output"}


class ExportFormatError(NanoscopeError):
    """A file that is not a Nanoscope conversation export this version can read."""


@dataclass
class ExportedConversation:
    title: str
    messages: list[Message]
    meta: dict[str, Any] = field(default_factory=dict)


def _fenced(info: str, text: str) -> str:
    # A fence longer than any backtick run inside, so code containing ``` cannot end it early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{info}\n{body}{fence}"


def _part_markdown(kind: str, text: str) -> str:
    if kind == TEXT:
        return text.strip("\n")
    if kind == THOUGHT:
        return "\n".join("> " + line if line else ">" for line in text.strip("\n").split("\n"))
    if kind in (PYTHON_OUTPUT, TOOL_RESULT):
        return "Output:\n\n" + _fenced(_FENCES[kind], text)
    return _fenced(_FENCES.get(kind, kind), text)


def to_markdown(title: str, messages: Iterable[Message]) -> str:
    """Readable Markdown: one section per message, tool calls and their results as fenced blocks."""
    blocks = [f"# {title.strip() or 'Untitled conversation'}"]
    for message in messages:
        blocks.append(f"## {_ROLE_HEADINGS.get(message.role, message.role.title())}")
        blocks.extend(md for p in message.parts if (md := _part_markdown(p.kind, p.text)))
    return "\n\n".join(blocks) + "\n"


def comparison_markdown(title: str, messages: list[Message], meta: dict[str, Any]) -> str:
    """A readable report of a comparison: the prompt, a table of panes, the divergence, each
    reply, and the cross-scores."""
    replies = [m for m in messages if m.role == "assistant"]
    lines = [f"# {title}", "", "**Prompt**", ""]
    lines += ["> " + line if line else ">" for line in str(meta.get("prompt", "")).split("\n")]
    lines += ["", "| pane | model | sampling | tokens | tok/s | TTFT |", "|---|---|---|--:|--:|--:|"]
    for m in replies:
        stats = m.meta.get("stats") or {}
        tok_s = f"{stats['decode_tok_s']:.1f}" if stats.get("decode_tok_s") else "–"
        ttft = f"{stats['ttft_ms']:.0f} ms" if stats.get("ttft_ms") else "–"
        lines.append(
            f"| {m.meta.get('pane', '?')} | {checkpoint_label(m.meta)} | "
            f"{describe_sampling(m.meta.get('sampling') or {})} | {len(m.tokens)} | {tok_s} | {ttft} |"
        )
    divergence = meta.get("divergence")
    lines.append("")
    if divergence is not None:
        lines.append(f"The replies first differ at token {divergence}.")
    for m in replies:
        lines += ["", f"## {m.meta.get('pane', '?')} · {checkpoint_label(m.meta)}", ""]
        lines += [md for p in m.parts if (md := _part_markdown(p.kind, p.text))] or ["*(empty reply)*"]
        if m.meta.get("error"):
            lines += ["", f"*Failed: {m.meta['error']}*"]
    scored = [m for m in replies if m.meta.get("cross_scores")]
    if scored:
        lines += [
            "",
            "## Cross-scores",
            "",
            "| reply | scored by | bits/byte | mean log p |",
            "|---|---|--:|--:|",
        ]
        for m in scored:
            for letter, score in m.meta["cross_scores"].items():
                bpb = f"{score['bits_per_byte']:.3f}" if score.get("bits_per_byte") is not None else "–"
                mean = score.get("mean_logprob")
                mean_text = f"{mean:.3f}" if mean is not None else score.get("error", "–")
                lines.append(f"| {m.meta.get('pane')} | {letter} | {bpb} | {mean_text} |")
    return "\n".join(lines) + "\n"


def to_json(title: str, messages: Iterable[Message], meta: dict[str, Any] | None = None) -> str:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "app_version": __version__,
        "title": title,
        "meta": meta or {},
        "messages": [m.to_dict() for m in messages],
    }
    return json.dumps(doc, ensure_ascii=False, indent=2, default=str) + "\n"


def from_json(text: str) -> ExportedConversation:
    """Read what ``to_json`` wrote; raises ExportFormatError with one readable line otherwise."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ExportFormatError(f"not a conversation export: invalid JSON (line {e.lineno}: {e.msg})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ExportFormatError(f'not a conversation export (no "format": "{FORMAT}")')
    version = doc.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ExportFormatError(
            f"conversation export version {version!r} is newer than this Nanoscope reads ({VERSION})"
        )
    try:
        messages = [Message.from_dict(m) for m in doc["messages"]]
    except (KeyError, TypeError, AttributeError) as e:
        raise ExportFormatError(f"conversation export has a malformed message ({e!r})") from e
    for m in messages:
        if m.role not in _ROLE_HEADINGS:
            raise ExportFormatError(f"conversation export has a message with unknown role {m.role!r}")
    return ExportedConversation(
        title=str(doc.get("title", "")), messages=messages, meta=dict(doc.get("meta") or {})
    )
