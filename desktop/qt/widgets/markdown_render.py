"""Message text to Qt rich-text HTML: markdown-it-py (CommonMark + tables + strikethrough) with
Pygments code blocks.

Model output is untrusted: markdown-it runs with raw HTML off (tags in a reply show as text),
only http(s)/mailto links become anchors (other links stay as their source text), and images are
shown as links, never loaded. We render to HTML ourselves rather than use QTextDocument.setMarkdown
because fenced code needs Pygments colours and a copy link, and Qt's rich text has no style sheet
for our tags, so the look is written inline on each of them.

Streamed text is re-rendered as it grows: an unclosed ``` fence already reads as code (CommonMark
runs it to the end of the text) and an unfinished link stays text until its ``)`` arrives.
Hostile replies stay cheap: markdown-it's parsing is linear on the patterns that made the old
hand-written parser quadratic, and block nesting stops at ``maxNesting`` (deeper markers are text).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.rules_block import StateBlock, blockquote, list_block
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from desktop.qt.widgets.palette import DARK, LIGHT, Colors

LIGHT_CODE_STYLE = "default"
DARK_CODE_STYLE = "github-dark"
COPY_CODE_SCHEME = "nanoscope-copy"  # anchors "nanoscope-copy:<n>" ask the view to copy code block n
SAFE_SCHEMES = ("http://", "https://", "mailto:")
MAX_NESTING = 20  # markdown-it token levels: about 9 nested lists or 19 nested quotes

# Not right after "](": that is a link still streaming in, which shows as its source text until it closes.
_BARE_URL = re.compile(r"(?<!\]\()\bhttps?://[^\s<>\"'`]+[^\s<>\"'`.,;:!?)\]]")


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)  # in order; index n is copy link n


def render_markdown(text: str, *, dark: bool) -> Rendered:
    """HTML for one text part of a message (assistant replies and completions)."""
    colors = DARK if dark else LIGHT
    env: EnvType = {
        "colors": colors,
        "code_style": DARK_CODE_STYLE if dark else LIGHT_CODE_STYLE,
        "code_blocks": [],
    }
    tokens = _MD.parse(text, env)
    _add_styles(tokens, colors)
    return Rendered(_MD.renderer.render(tokens, _MD.options, env), env["code_blocks"])


def render_plain(text: str) -> str:
    """HTML showing ``text`` exactly as typed (user messages): escaped, spaces and newlines kept."""
    return f'<p style="margin:0; white-space:pre-wrap">{html.escape(_clean(text))}</p>'


def _clean(text: str) -> str:
    # The same normalisation markdown-it applies to replies: NUL is replaced (CommonMark's rule)
    # and a lone CR would otherwise show as nothing in a pre-wrap paragraph.
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


def _add_styles(tokens: list[Token], c: Colors) -> None:
    """Write the look onto the tokens' tags (Qt's rich text supports inline CSS and these attributes)."""
    spaced = {"style": "margin-top:0; margin-bottom:8px"}
    cell = f"border:1px solid {c.border}; padding:4px 8px"
    attrs: dict[str, dict[str, str]] = {
        "paragraph_open": spaced,
        "bullet_list_open": spaced,
        "ordered_list_open": spaced,
        "heading_open": {"style": "margin-top:10px; margin-bottom:6px"},
        "blockquote_open": {"style": f"color:{c.muted}; margin-left:14px"},
        "table_open": {
            "cellspacing": "0",
            "cellpadding": "0",
            "style": "border-collapse:collapse; margin-bottom:10px",
        },
        "th_open": {"style": f"{cell}; background-color:{c.code_header}"},
        "td_open": {"style": cell},
        "link_open": {"style": f"color:{c.link}"},
    }
    for block in tokens:
        for token in (block, *(block.children or ())):
            if token.type in ("th_open", "td_open"):
                # markdown-it writes alignment as CSS, which Qt ignores on cells; the attribute works.
                token.attrSet("align", str(token.attrGet("style") or "left").removeprefix("text-align:"))
            for name, value in attrs.get(token.type, {}).items():
                token.attrSet(name, value)
            if token.type in ("heading_open", "heading_close"):
                token.tag = f"h{min(int(token.tag[1]) + 1, 5)}"  # Qt's h1 is far too big for a chat


def _code_block(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """A fenced (or indented) code block: language header, "Copy" link, Pygments colours."""
    token = tokens[idx]
    language = token.info.split()[0].lower() if token.info.strip() else ""
    code = token.content.rstrip("\n")
    index = len(env["code_blocks"])
    env["code_blocks"].append(code)
    c: Colors = env["colors"]
    highlighted = highlight(code, _lexer(language), _formatter(env["code_style"])) if code else ""
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


def _code_inline(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    # Hair spaces pad the shaded background, which Qt draws tight to the glyphs.
    return (
        f'<code style="background-color:{env["colors"].inline_code_bg}">&#8202;'
        f"{html.escape(tokens[idx].content)}&#8202;</code>"
    )


def _image(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
    """An image as a link to it: the view never loads resources named by model output."""
    token = tokens[idx]
    label = html.escape(f"[image: {self.renderInlineAsText(token.children or [], options, env)}]")
    src = html.escape(str(token.attrGet("src")), quote=True)
    return f'<a href="{src}" style="color:{env["colors"].link}">{label}</a>'


def _link_bare_urls(state: StateCore) -> None:
    """Core rule: http(s) URLs in plain text become links (markdown-it's linkify needs another package)."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        in_link = 0
        for token in block.children:
            in_link += {"link_open": 1, "link_close": -1}.get(token.type, 0)
            if token.type != "text" or in_link or "://" not in token.content:
                children.append(token)
                continue
            text, pos = token.content, 0
            for match in _BARE_URL.finditer(text):
                children += [
                    Token("text", "", 0, content=text[pos : match.start()]),
                    Token("link_open", "a", 1, attrs={"href": state.md.normalizeLink(match[0])}),
                    Token("text", "", 0, content=match[0]),
                    Token("link_close", "a", -1),
                ]
                pos = match.end()
            children.append(Token("text", "", 0, content=text[pos:]))
        block.children = children


def _within_nesting(rule: Callable[..., bool]) -> Callable[..., bool]:
    """A container rule (list, quote) that declines near ``maxNesting``, so deeper markers read as
    paragraph text; at the limit itself markdown-it would silently drop the rest of the reply."""

    def guarded(state: StateBlock, start: int, end: int, silent: bool) -> bool:
        # A list opens two levels (list, item) before parsing its content.
        return state.level + 2 < state.md.options.maxNesting and rule(state, start, end, silent)

    return guarded


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "maxNesting": MAX_NESTING})
    md.enable(["table", "strikethrough"])
    md.validateLink = lambda url: url.lower().startswith(SAFE_SCHEMES)  # type: ignore[method-assign]
    # Ruler.at resets a rule's alt chains, so markdown-it's own ones are given again.
    md.block.ruler.at("list", _within_nesting(list_block), {"alt": ["paragraph", "reference", "blockquote"]})
    quote_alt = ["paragraph", "reference", "blockquote", "list"]
    md.block.ruler.at("blockquote", _within_nesting(blockquote), {"alt": quote_alt})
    md.core.ruler.push("bare_urls", _link_bare_urls)
    for name, rule in (("fence", _code_block), ("code_block", _code_block)):
        md.add_render_rule(name, rule)
    md.add_render_rule("code_inline", _code_inline)
    md.add_render_rule("image", _image)
    return md


_MD = _build()
