"""Message text to display HTML: Markdown for prose, Pygments for fenced code.

Model output is untrusted: raw HTML in it is never interpreted (Qt's Markdown parser runs with
HTML disabled and code is escaped by Pygments), and no remote resources are loaded by labels.
"""

from __future__ import annotations

import html
import re

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound
from PySide6.QtGui import QTextDocument

FENCE = re.compile(r"^```([\w+#.-]*)[^\n]*\n(.*?)(?:^```[ \t]*$|\Z)", re.S | re.M)
BODY = re.compile(r"<body[^>]*>(.*)</body>", re.S)


def _prose(text: str) -> str:
    if not text.strip():
        return ""
    doc = QTextDocument()
    doc.setMarkdown(
        text,
        QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML,
    )
    match = BODY.search(doc.toHtml())
    return match.group(1) if match else html.escape(text)


def _code(code: str, language: str, dark: bool) -> str:
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    style = "monokai" if dark else "friendly"
    formatter = HtmlFormatter(noclasses=True, style=style, nowrap=True)
    body = highlight(code.rstrip("\n"), lexer, formatter)
    bg = "#272822" if dark else "#f4f6f8"
    return (
        f'<table width="100%" cellpadding="8" style="background:{bg}; margin:4px 0"><tr><td>'
        f'<pre style="font-family: monospace; margin:0">{body}</pre></td></tr></table>'
    )


def to_html(text: str, dark: bool = False) -> str:
    """HTML for a text part; an unclosed fence (mid-stream) renders as code up to the end."""
    out: list[str] = []
    pos = 0
    for m in FENCE.finditer(text):
        out.append(_prose(text[pos : m.start()]))
        out.append(_code(m.group(2), m.group(1), dark))
        pos = m.end()
    out.append(_prose(text[pos:]))
    return "".join(out)


def code_html(text: str) -> str:
    """Plain monospace HTML (for tool calls and raw token views)."""
    return f'<span style="font-family: monospace">{html.escape(text)}</span>'
