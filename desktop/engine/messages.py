"""Conversation data types shared by the engine, the store and the UI (Qt-free, torch-free).

A message is a list of parts so that tool calls survive a round trip through rendering,
storage and display: nanochat's assistant turns interleave text with
``<|python_start|>expr<|python_end|>`` calls and their forced ``<|output_start|>…`` results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]

# Part kinds. The first three are nanochat's; the rest appear with the fork's C++ tokenizer.
TEXT = "text"
PYTHON = "python"  # calculator expression between <|python_start|> and <|python_end|>
PYTHON_OUTPUT = "python_output"  # forced result between <|output_start|> and <|output_end|>
TOOL_QUERY = "tool_query"  # fork: <QUERY_TOOL> call <CODE_END> (shown, never executed)
TOOL_RESULT = "tool_result"  # fork: <TOOL_RESULT> result <CODE_END>
THOUGHT = "thought"  # fork: <THOUGHT_START> … <THOUGHT_END>
PART_KINDS = (TEXT, PYTHON, PYTHON_OUTPUT, TOOL_QUERY, TOOL_RESULT, THOUGHT)


@dataclass
class Part:
    kind: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Part:
        return cls(kind=str(d["kind"]), text=str(d["text"]))


@dataclass
class Message:
    role: Role
    parts: list[Part] = field(default_factory=list)
    # Free-form metadata stored with the message (sampling values, checkpoint, stats...).
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_text(cls, role: Role, text: str) -> Message:
        return cls(role=role, parts=[Part(TEXT, text)])

    def plain_text(self) -> str:
        """The text parts joined; tool parts are left out."""
        return "".join(p.text for p in self.parts if p.kind == TEXT)

    def append(self, kind: str, text: str) -> None:
        """Append streamed text, extending the last part when it is of the same kind."""
        if self.parts and self.parts[-1].kind == kind:
            self.parts[-1].text += text
        else:
            self.parts.append(Part(kind, text))

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "parts": [p.to_dict() for p in self.parts], "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            parts=[Part.from_dict(p) for p in d.get("parts", [])],
            meta=dict(d.get("meta", {})),
        )


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as the engine streams it.

    ``text`` is the clean text delta this token adds to the reply (it may be empty while a
    multi-byte character is incomplete, and is empty for special tokens). ``kind`` says which
    part the token belongs to, so views can draw tool calls without re-parsing.
    """

    id: int
    text: str
    forced: bool
    kind: str
    special: str | None = None  # the special token's name, e.g. "<|python_start|>"
