"""Render a Hugging Face chat template: Jinja code from a stranger's file, run in a sandbox.

The template comes from ``chat_template.jinja`` or ``tokenizer_config.json`` (the separate file
wins, as in transformers). It is compiled in jinja2's :class:`ImmutableSandboxedEnvironment`,
which refuses attribute access to Python internals (``__class__``, ``__globals__``...) and any
call that would mutate a list or dict, so a template can format text and nothing else
(checkpoint-formats spec §4.2). The environment offers what transformers' offers templates, so
they render the same text: ``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception``,
``strftime_now``, a ``tojson`` that does not escape HTML, ``namespace`` (without underscore
names) and the ``{% generation %}`` block (rendered as its body).

A template that fails, including one that reaches for Python objects, gives one line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from . import bounded
from .errors import TokenizerError
from .messages import TEXT, Message

# The named special tokens transformers passes to every template (its special_tokens_map).
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
MAX_TEMPLATE_CHARS = 1 << 20


def token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object
    ({"content": ...})."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` marks assistant text for training masks in
    transformers; rendering only needs the body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it as an instance attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing names that start with an underscore (no dunder attributes)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace attribute may not start with an underscore ({name!r})")


def _raise_exception(message: object) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


def message_dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as templates read them: ``{"role", "content"}``. Content is a string, except an
    assistant turn with calculator parts, which is a list of ``{"type", "text"}`` parts (the
    NanoChat port's template turns ``python`` / ``python_output`` parts into their tokens)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant" and any(p.kind != TEXT for p in m.parts):
            content: Any = [{"type": p.kind, "text": p.text} for p in m.parts]
        else:
            content = m.plain_text()
        out.append({"role": m.role, "content": content})
    return out


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with."""

    def __init__(self, source: str, origin: Path, special_tokens: dict[str, str]) -> None:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TokenizerError(f"{origin}: the chat template is {len(source):,} characters long; refused")
        self.origin = origin
        self.source = source
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise TokenizerError(
                f"{origin}: the chat template does not compile ({exc.message}, line {exc.lineno})"
            ) from None

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The prompt text; any failure of the template is one line naming the file."""
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except SecurityError as exc:
            raise TokenizerError(
                f"{self.origin}: the chat template tried to reach Python internals ({_line(exc)})"
            ) from None
        except jinja2.exceptions.TemplateError as exc:
            raise TokenizerError(f"{self.origin}: the chat template failed: {_line(exc)}") from None
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ZeroDivisionError,
            OverflowError,
        ) as exc:
            raise TokenizerError(
                f"{self.origin}: the chat template failed ({type(exc).__name__}: {_line(exc)})"
            ) from None
        except RecursionError:
            raise TokenizerError(f"{self.origin}: the chat template recursed too deeply") from None


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def template_source(tokenizer_config: dict[str, Any], directory: Path) -> tuple[str, Path] | None:
    """The default chat template and the file it came from, or None when the model has none."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return bounded.read_text(jinja_file, "template"), jinja_file
        except bounded.FileRefused as exc:
            raise TokenizerError(str(exc)) from None
    value = tokenizer_config.get("chat_template")
    origin = directory / "tokenizer_config.json"
    if isinstance(value, str):
        return value, origin
    # Named templates: a list of {"name", "template"} (or a dict); "default" is the chat one.
    if isinstance(value, list):
        value = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    if isinstance(value, dict) and isinstance(value.get("default"), str):
        return value["default"], origin
    return None
