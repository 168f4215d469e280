"""Message text to Qt rich-text HTML: a small Markdown converter with Pygments code blocks.

Model output is untrusted, so every character of it is HTML-escaped before any markup is added:
raw HTML in a reply shows as text, only http(s)/mailto links become anchors, and images are
shown as links (never loaded). The converter is our own rather than QTextDocument.setMarkdown
because streamed text is re-rendered many times a second while it is still incomplete: an
unclosed ``` fence must already look like code, and fenced code needs Pygments colours and a
copy link, which Qt's Markdown import cannot give.

Supported: ATX headings, paragraphs (single newlines kept as line breaks, as chat UIs do),
bold/italic/strikethrough, inline code, links, bullet/numbered lists (nested), block quotes,
horizontal rules, GitHub tables and fenced code.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from .theme import DARK, LIGHT, Colors

LIGHT_CODE_STYLE = "default"
DARK_CODE_STYLE = "github-dark"
COPY_CODE_SCHEME = "nanoscope-copy"  # anchors "nanoscope-copy:<n>" ask the view to copy code block n
SAFE_SCHEMES = ("http://", "https://", "mailto:")

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_QUOTE = re.compile(r"^ {0,3}> ?(.*)$")
_ITEM = re.compile(r"^( *)([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$")
_TABLE_SEP = re.compile(r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"(!?)\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"\n]*\")?\s*\)")
_BARE_URL = re.compile(r"\bhttps?://[^\s<>\"'`]+[^\s<>\"'`.,;:!?)\]]")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|(?<![\w_])__(?=\S)(.+?)(?<=\S)__(?![\w_])")
_ITALIC = re.compile(
    r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])|(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])"
)
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)  # in order; index n is copy link n


def render_markdown(text: str, *, dark: bool) -> Rendered:
    """HTML for one text part of a message (assistant replies and completions)."""
    renderer = _Renderer(DARK if dark else LIGHT, DARK_CODE_STYLE if dark else LIGHT_CODE_STYLE)
    body = renderer.blocks(_clean(text).split("\n"))
    return Rendered(body, renderer.code_blocks)


def render_plain(text: str) -> str:
    """HTML showing ``text`` exactly as typed (user messages): escaped, spaces and newlines kept."""
    return f'<p style="margin:0; white-space:pre-wrap">{html.escape(_clean(text))}</p>'


def is_special_token(text: str) -> bool:
    """nanochat's ``<|name|>`` and the fork's ``<UPPER_NAME>`` tokens."""
    return bool(re.fullmatch(r"<\|[a-z_]+\|>|<[A-Z][A-Z0-9_]*>", text))


def render_raw_tokens(tokens: Sequence[tuple[str, bool]], *, dark: bool) -> str:
    """The token stream as chips: alternating shades show the boundaries, special tokens are
    drawn in the accent colour, tokens forced by a tool (not sampled) on the tool colour."""
    c = DARK if dark else LIGHT
    shades = (c.token_a, c.token_b)
    chips = []
    forced = specials = 0
    for i, (text, was_forced) in enumerate(tokens):
        special = is_special_token(text)
        specials += special
        forced += was_forced
        shown = html.escape(_clean(text)).replace("\n", "↵<br/>").replace("\t", "→")
        style = f"background-color:{c.tool_bg if was_forced else shades[i % 2]}"
        if special:
            style += f"; color:{c.accent}; font-weight:600"
        if was_forced:
            style += f"; color:{c.tool_label}"
        chips.append(f'<span style="{style}">{shown or "∅"}</span>')
    summary = f"{len(tokens)} tokens · {specials} special · {forced} forced by a tool"
    return (
        f'<p style="margin:0; white-space:pre-wrap; font-family:monospace">{"".join(chips)}</p>'
        f'<p style="margin-top:6px; margin-bottom:0; color:{c.muted}">{summary}</p>'
    )


def _clean(text: str) -> str:
    # NUL is our placeholder marker; CR only confuses line handling.
    return text.replace("\x00", "\ufffd").replace("\r\n", "\n").replace("\r", "\n")


@lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer:
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()


@lru_cache(maxsize=2)
def _formatter(style: str) -> HtmlFormatter:
    return HtmlFormatter(style=style, noclasses=True, nowrap=True)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


class _Renderer:
    """Block-level parser; recursion handles list items and quotes, and numbers code blocks."""

    def __init__(self, colors: Colors, code_style: str) -> None:
        self.c = colors
        self.code_style = code_style
        self.code_blocks: list[str] = []

    # ----- blocks --------------------------------------------------------------------------

    def blocks(self, lines: list[str], tight: bool = False) -> str:
        out: list[str] = []
        para: list[str] = []

        def flush() -> None:
            if para:
                body = self.inline("\n".join(para)).replace("\n", "<br/>")
                out.append(body if tight else f'<p style="margin-top:0; margin-bottom:8px">{body}</p>')
                para.clear()

        i, n = 0, len(lines)
        while i < n:
            line = lines[i].expandtabs(4)
            if (m := _FENCE.match(line)) is not None:
                flush()
                i = self._fence(lines, i, m, out)
                continue
            if not line.strip():
                flush()
                i += 1
                continue
            if (m := _HEADING.match(line)) is not None:
                flush()
                level = min(len(m.group(1)) + 1, 5)
                out.append(
                    f'<h{level} style="margin-top:10px; margin-bottom:6px">{self.inline(m.group(2) or "")}'
                    f"</h{level}>"
                )
            elif _RULE.match(line):
                flush()
                out.append("<hr/>")
            elif _QUOTE.match(line):
                flush()
                inner = []
                while i < n and (q := _QUOTE.match(lines[i].expandtabs(4))) is not None:
                    inner.append(q.group(1))
                    i += 1
                quote_style = f"color:{self.c.muted}; margin-left:14px"
                out.append(f'<blockquote style="{quote_style}">{self.blocks(inner)}</blockquote>')
                continue
            elif _ITEM.match(line) and (not para or _ITEM.match(line).group(2)[0] in "-*+1"):
                flush()
                i = self._list(lines, i, out)
                continue
            elif "|" in line and i + 1 < n and "|" in lines[i + 1] and _TABLE_SEP.match(lines[i + 1]):
                flush()
                i = self._table(lines, i, out)
                continue
            else:
                para.append(line.strip())
            i += 1
        flush()
        return "".join(out)

    def _fence(self, lines: list[str], start: int, m: re.Match[str], out: list[str]) -> int:
        indent, fence, language = len(m.group(1)), m.group(2), m.group(3).lower()
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        i = start + 1
        # An unclosed fence (a reply still streaming) runs to the end of the text.
        while i < len(lines) and not closing.match(lines[i].expandtabs(4)):
            line = lines[i]
            body.append(line[min(indent, _indent(line)) :])
            i += 1
        out.append(self.code_block("\n".join(body).rstrip("\n"), language))
        return i + 1

    def code_block(self, code: str, language: str) -> str:
        index = len(self.code_blocks)
        self.code_blocks.append(code)
        c = self.c
        highlighted = highlight(code, _lexer(language), _formatter(self.code_style)) if code else ""
        # Borders go on the cells: a table border would also draw a line between the header cells.
        line = f"1px solid {c.border}"
        head = f"background-color:{c.code_header}; padding:4px 10px; color:{c.muted}; border-top:{line}"
        return (
            f'<table width="100%" cellspacing="0" cellpadding="0" border="0" bgcolor="{c.code_bg}"'
            f' style="margin-top:4px; margin-bottom:10px; border-collapse:collapse">'
            f'<tr><td style="{head}; border-left:{line}">{html.escape(language or "code")}</td>'
            f'<td align="right" style="{head}; border-right:{line}"><a href="{COPY_CODE_SCHEME}:{index}"'
            f' style="color:{c.muted}; text-decoration:none">Copy</a></td></tr>'
            f'<tr><td colspan="2" style="padding:8px 10px; border:{line}; border-top:none">'
            f'<pre style="margin:0; white-space:pre-wrap">{highlighted}</pre></td></tr></table>'
        )

    def _list(self, lines: list[str], start: int, out: list[str]) -> int:
        first = _ITEM.match(lines[start].expandtabs(4))
        assert first is not None
        base = len(first.group(1))
        ordered = first.group(2)[0].isdigit()
        items: list[list[str]] = []
        loose = False
        content_col = 0
        i, n = start, len(lines)
        while i < n:
            line = lines[i].expandtabs(4)
            m = _ITEM.match(line)
            if m and len(m.group(1)) == base and m.group(2)[0].isdigit() == ordered:
                content_col = base + len(m.group(2)) + len(m.group(3) or " ")
                items.append([m.group(4) or ""])
            elif not line.strip():
                j = i + 1
                while j < n and not lines[j].strip():
                    j += 1
                if j >= n or _indent(lines[j].expandtabs(4)) < content_col:
                    nxt = _ITEM.match(lines[j].expandtabs(4)) if j < n else None
                    if not (nxt and len(nxt.group(1)) == base):
                        break
                loose = True
                items[-1].append("")
            elif _indent(line) >= content_col:
                items[-1].append(line[content_col:])
            elif _indent(line) > base or not (
                _FENCE.match(line) or _HEADING.match(line) or _RULE.match(line) or _QUOTE.match(line) or m
            ):
                items[-1].append(line.strip())  # a nested marker or a lazy continuation line
            else:
                break
            i += 1
        tag = "ol" if ordered else "ul"
        number = int(first.group(2)[:-1]) if ordered else 1
        start_attr = f' start="{number}"' if ordered and number != 1 else ""
        rendered = "".join(f"<li>{self.blocks(item, tight=not loose)}</li>" for item in items)
        out.append(f'<{tag}{start_attr} style="margin-top:0; margin-bottom:8px">{rendered}</{tag}>')
        return i

    def _table(self, lines: list[str], start: int, out: list[str]) -> int:
        def cells(line: str) -> list[str]:
            line = line.strip()
            line = line[1:] if line.startswith("|") else line
            line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
            return [cell.strip().replace("\\|", "|") for cell in _CELL_SPLIT.split(line)]

        aligns = []
        for spec in cells(lines[start + 1]):
            left, right = spec.startswith(":"), spec.endswith(":")
            aligns.append("center" if left and right else "right" if right else "left")
        c = self.c
        cell_style = f"border:1px solid {c.border}; padding:4px 8px"

        def row(values: list[str], tag: str, extra: str = "") -> str:
            tds = []
            for k, align in enumerate(aligns):
                value = self.inline(values[k]) if k < len(values) else ""
                tds.append(f'<{tag} align="{align}" style="{cell_style}{extra}">{value}</{tag}>')
            return f"<tr>{''.join(tds)}</tr>"

        rows = [row(cells(lines[start]), "th", f"; background-color:{c.code_header}")]
        i = start + 2
        while i < len(lines) and "|" in lines[i] and lines[i].strip():
            rows.append(row(cells(lines[i]), "td"))
            i += 1
        out.append(
            f'<table cellspacing="0" cellpadding="0" style="border-collapse:collapse; margin-bottom:10px">'
            f"{''.join(rows)}</table>"
        )
        return i

    # ----- inline --------------------------------------------------------------------------

    def inline(self, text: str) -> str:
        """Escape ``text`` and add inline markup. Code spans and links are swapped for
        placeholders first, so emphasis rules never touch code or URLs (underscores!)."""
        held: list[str] = []

        def hold(fragment: str) -> str:
            held.append(fragment)
            return f"\x00{len(held) - 1}\x00"

        c = self.c
        text = _CODE_SPAN.sub(
            lambda m: hold(
                f'<code style="background-color:{c.inline_code_bg}">&#8202;'
                f"{html.escape(m.group(2).strip())}&#8202;</code>"
            ),
            text,
        )
        text = _LINK.sub(lambda m: hold(self._link(m.group(3), m.group(2), image=bool(m.group(1)))), text)
        text = _BARE_URL.sub(lambda m: hold(self._link(m.group(0), m.group(0), image=False)), text)
        text = html.escape(text, quote=False)
        text = _BOLD.sub(lambda m: f"<b>{m.group(1) or m.group(2)}</b>", text)
        text = _ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", text)
        text = _STRIKE.sub(r"<s>\1</s>", text)
        # Placeholders may nest (a code span inside a link label), so expand until none remain.
        while _PLACEHOLDER.search(text):
            text = _PLACEHOLDER.sub(lambda m: held[int(m.group(1))], text)
        return text

    def _link(self, url: str, label: str, image: bool) -> str:
        label = html.escape(f"[image: {label}]" if image else label, quote=False)
        if not url.lower().startswith(SAFE_SCHEMES):
            return label  # javascript:, file:, data: … are shown as text only
        href = html.escape(url, quote=True)
        return f'<a href="{href}" style="color:{self.c.link}">{label}</a>'
