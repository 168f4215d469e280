"""A message to its stored columns and back; a damaged row gives back what can be read of it."""

from __future__ import annotations

import json
from typing import Any

from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.messages import TEXT, Message, Part, Role

# The last part of a stored message that could only partly be read.
UNREADABLE = "[Part of this message could not be read from the history: {}. The rest is shown.]"


def restore_message(role: Role, parts_json: object, meta_json: object) -> Message:
    """A message from its stored columns, as much of it as can be read.

    A row written by a crash, another program or a hand edit may hold malformed or deeply nested
    JSON; it must not make its conversation impossible to open. Unreadable parts are left out, an
    unreadable meta (token trace, sampling) is dropped, and a last text part says what was lost.
    """
    parts: list[Part] = []
    problems: list[str] = []
    try:
        stored = loads_bounded(parts_json) if isinstance(parts_json, str) else None
        if not isinstance(stored, list):
            raise JsonRefused("the parts are not a list")
        for item in stored:
            try:
                parts.append(Part.from_dict(item))
            except (KeyError, TypeError, ValueError):
                problems.append("a part is not a {kind, text} object")
    except JsonRefused as exc:
        problems.append(f"parts: {exc}")
    try:
        meta = loads_bounded(meta_json) if isinstance(meta_json, str) else None
        if not isinstance(meta, dict):
            raise JsonRefused("not an object")
        message = Message.restore(role, parts, meta)
    except JsonRefused as exc:
        problems.append(f"details: {exc}")
        message = Message.restore(role, parts, {})
    except (KeyError, TypeError, ValueError, OverflowError):
        problems.append("details: the stored token record is malformed")
        message = Message.restore(role, parts, {})
    if problems:
        message.parts.append(Part(TEXT, UNREADABLE.format("; ".join(dict.fromkeys(problems)))))
    return message


def dumps(value: Any) -> str:
    # default=str: the store does not interpret meta, and a stray Path must not lose a reply.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _search_text(message: Message) -> str:
    return "\n".join(p.text for p in message.parts)


def message_columns(message: Message) -> tuple[str, str, str, str]:
    """Serialised now, so a message that keeps growing cannot change a write still pending."""
    parts = dumps([p.to_dict() for p in message.parts])
    return message.role, parts, dumps(message.stored_meta()), _search_text(message)
