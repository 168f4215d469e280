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

Every render runs under a budget (:class:`_Budget`), enforced inside the sandbox: each call,
attribute or item lookup, operator and loop iteration costs one operation (at most
:data:`MAX_OPERATIONS`); no string or list a template builds may exceed :data:`MAX_OUTPUT_CHARS`,
checked before it is built (``'a' * 2e9``, ``center(2e9)``, ``format`` widths, ``tojson(indent=…)``),
and the output stream stops there too. Nested ``range`` loops or doubling macros end in one
line instead of hanging or taking gigabytes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from desktop.engine.errors import TokenizerError
from desktop.engine.files import bounded
from desktop.engine.messages import TEXT, Message
from desktop.engine.text_lines import error_text

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
# A real template spends a few operations per message and writes the conversation once.
MAX_OPERATIONS = 200_000
MAX_OUTPUT_CHARS = 4 << 20
MAX_NUMBER_ARG = 10_000  # widths, indents, counts a filter may be given beside its value
MAX_JSON_INDENT = 64


class _OverBudget(Exception):
    """A render that would cost more than its budget; the message says which limit."""


class _Budget:
    """Operations left for one render."""

    def __init__(self) -> None:
        self.left = MAX_OPERATIONS

    def spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise _OverBudget(f"it took more than {MAX_OPERATIONS:,} operations")


def _size_ok(value: object) -> object:
    if isinstance(value, (str, list, tuple, dict, range)) and len(value) > MAX_OUTPUT_CHARS:
        raise _OverBudget(f"it built a value of more than {MAX_OUTPUT_CHARS:,} items")
    return value


_FORMAT_NUMBERS = re.compile(r"%[^a-zA-Z%]*?(\d{5,})|\{[^}]*?(\d{5,})")


def _check_format(fmt: object) -> None:
    """A printf- or format-style width or precision big enough to build gigabytes."""
    if isinstance(fmt, str) and _FORMAT_NUMBERS.search(fmt):
        raise _OverBudget("a format width or precision is too large")


def _check_str_method(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A string method whose result could be far larger than its inputs (``ljust(2e9)``,
    ``replace('', long)``), refused before it runs."""
    values = (*args, *kwargs.values())
    if any(isinstance(a, int | float) and abs(a) > MAX_NUMBER_ARG for a in values):
        raise _OverBudget(f"a string method was given a number over {MAX_NUMBER_ARG:,}")
    if name == "replace" and len(args) >= 2 and isinstance(args[1], str):
        _size_ok(range((len(text) + 1) * max(len(args[1]), 1)))


def _check_product(left: object, right: object) -> None:
    """``left * right`` where one side is a sequence: refuse before it is built."""
    for seq, n in ((left, right), (right, left)):
        sized = isinstance(seq, (str, list, tuple)) and isinstance(n, int | float)
        if sized and len(seq) * n > MAX_OUTPUT_CHARS:  # type: ignore[arg-type, operator]
            raise _OverBudget(f"it built a value of more than {MAX_OUTPUT_CHARS:,} items")


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


def _concat_call(node: jinja2.nodes.Concat) -> jinja2.nodes.Filter:
    parts = jinja2.nodes.List(node.nodes, lineno=node.lineno)
    return jinja2.nodes.Filter(parts, "_concat", [], [], None, None, lineno=node.lineno)


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with a cost on everything a template does (see the module doc)."""

    intercepted_binops = frozenset({"*", "**", "%", "+", "//"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
        )
        self.budget = _Budget()
        self.filters = {name: self._guarded(f) for name, f in self.filters.items()}
        self.filters["tojson"] = self._guarded(_tojson)
        self.filters["_budget"] = self._iterate
        self.filters["_concat"] = self._concat
        self.globals["range"] = self._range
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["namespace"] = _Namespace

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        # Every for loop iterates through _budget, so each iteration costs an operation, and
        # every ``a ~ b`` joins through _concat, which refuses a result over the size limit
        # (jinja2 compiles ``~`` inline, past the operator hooks).
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(jinja2.nodes.For):
            loop.iter = jinja2.nodes.Filter(loop.iter, "_budget", [], [], None, None, lineno=loop.lineno)
        for parent in tree.find_all(jinja2.nodes.Node):
            for field in parent.fields:
                child = getattr(parent, field, None)
                if isinstance(child, jinja2.nodes.Concat):
                    setattr(parent, field, _concat_call(child))
                elif isinstance(child, list):
                    child[:] = [_concat_call(c) if isinstance(c, jinja2.nodes.Concat) else c for c in child]
        return tree

    def _iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.budget.spend()
            yield item

    def _concat(self, parts: list[Any]) -> str:
        self.budget.spend()
        texts = [str(p) for p in parts]
        _size_ok(range(sum(map(len, texts))))
        return "".join(texts)

    def _range(self, *args: int) -> Iterator[int]:
        for n in range(*args):
            self.budget.spend()
            yield n

    def _guarded(self, f: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.budget.spend()
            extra = [a for a in (*args[1:], *kwargs.values()) if not isinstance(a, jinja2.runtime.Context)]
            if any(isinstance(a, int | float) and abs(a) > MAX_NUMBER_ARG for a in extra):
                raise _OverBudget(f"a filter was given a number over {MAX_NUMBER_ARG:,}")
            indent = kwargs.get("indent")
            if isinstance(indent, int | float) and indent > MAX_JSON_INDENT:
                raise _OverBudget("tojson's indent is too large")
            for a in args[:2]:
                _check_format(a)
            return _size_ok(f(*args, **kwargs))

        # Keep what jinja2 reads off a filter (pass_context, pass_environment...).
        guarded.__dict__.update(getattr(f, "__dict__", {}))
        return guarded

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        self.budget.spend()
        if operator == "*":
            _check_product(left, right)
        elif operator == "**" and isinstance(right, int | float) and abs(right) > 64:
            raise _OverBudget("an exponent is too large")
        elif operator == "%":
            _check_format(left)
        elif operator == "+" and isinstance(left, (str, list)) and isinstance(right, (str, list)):
            _size_ok(range(len(left) + len(right)))
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.budget.spend()
        if isinstance(getattr(__obj, "__self__", None), str):  # a str method: widths, replace
            _check_str_method(__obj.__self__, getattr(__obj, "__name__", ""), args, kwargs)
        return _size_ok(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # "{:99999999}".format(x): the format string is the method's own text.
        if isinstance(getattr(value, "__self__", None), str):
            _check_format(value.__self__)
        return super().wrap_str_format(value)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.budget.spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.budget.spend()
        return super().getitem(obj, argument)


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
        self._env = _BudgetedEnvironment()
        self._lock = threading.Lock()  # one render at a time: the budget is the environment's
        try:
            self._template = self._env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise TokenizerError(
                f"{origin}: the chat template does not compile ({exc.message}, line {exc.lineno})"
            ) from None
        except (RecursionError, MemoryError):
            raise TokenizerError(
                f"{origin}: the chat template does not compile (nested too deeply)"
            ) from None

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The prompt text; any failure of the template is one line naming the file."""
        try:
            with self._lock:
                self._env.budget = _Budget()
                return self._bounded_output(
                    self._template.generate(
                        messages=[dict(m) for m in messages],
                        tools=None,
                        documents=None,
                        add_generation_prompt=add_generation_prompt,
                        **self.special_tokens,
                    )
                )
        except _OverBudget as exc:
            raise TokenizerError(f"{self.origin}: the chat template was stopped: {exc}") from None
        except SecurityError as exc:
            raise TokenizerError(
                f"{self.origin}: the chat template tried to reach Python internals ({error_text(exc)})"
            ) from None
        except jinja2.exceptions.TemplateError as exc:
            raise TokenizerError(f"{self.origin}: the chat template failed: {error_text(exc)}") from None
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
                f"{self.origin}: the chat template failed ({error_text(exc, named=True)})"
            ) from None
        except (RecursionError, MemoryError):
            raise TokenizerError(f"{self.origin}: the chat template recursed too deeply") from None

    @staticmethod
    def _bounded_output(chunks: Iterator[str]) -> str:
        """The rendered text, stopped once it passes :data:`MAX_OUTPUT_CHARS` (before the
        tokenizer ever sees it)."""
        out: list[str] = []
        total = 0
        for chunk in chunks:
            total += len(chunk)
            if total > MAX_OUTPUT_CHARS:
                raise _OverBudget(f"it wrote more than {MAX_OUTPUT_CHARS:,} characters")
            out.append(chunk)
        return "".join(out)


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
    # Named templates: a list of {"name", "template"} (or a dict); "default" is the chat one. A
    # name that is not text (a list cannot even be a dict key) names no template.
    if isinstance(value, list):
        named = [t for t in value if isinstance(t, dict) and isinstance(t.get("name"), str)]
        value = {t["name"]: t.get("template") for t in named}
    if isinstance(value, dict) and isinstance(value.get("default"), str):
        return value["default"], origin
    return None
