"""Markdown replies to Qt rich text: features, safety against hostile model output, streaming."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCharFormat, QTextDocument

from desktop.qt.widgets.markdown_render import COPY_CODE_SCHEME, SAFE_SCHEMES, render_markdown

pytestmark = pytest.mark.gui


def _doc(text: str, *, dark: bool = False) -> QTextDocument:
    doc = QTextDocument()
    doc.setHtml(render_markdown(text, dark=dark).html)
    return doc


def _format_of(doc: QTextDocument, word: str) -> QTextCharFormat:
    cursor = doc.find(word, 0, QTextDocument.FindFlag.FindWholeWords)
    assert not cursor.isNull(), f"{word!r} not shown"
    return cursor.charFormat()


def _anchors(doc: QTextDocument) -> list[str]:
    hrefs = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            if href := it.fragment().charFormat().anchorHref():
                hrefs.append(href)
            it += 1
        block = block.next()
    return hrefs


def test_model_html_and_scripts_are_escaped(qapp):
    script = '<script>alert("x")</script>'
    evil = f'{script} <img src="http://evil.example/p.png"> [x](javascript:alert(1))'
    for text in (evil, f"```html\n{evil}\n```", f"- {evil}", f"| a |\n|---|\n| {evil} |"):
        html = render_markdown(text, dark=False).html
        assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
        doc = QTextDocument()
        doc.setHtml(html)
        assert script in doc.toPlainText()  # shown as text


def test_only_web_mail_and_copy_links_are_clickable(qapp):
    text = (
        "[a](javascript:alert(1)) [b](file:///etc/passwd) [c](data:text/html,x) <javascript:alert(2)>"
        f" [d]({COPY_CODE_SCHEME}:0) [e](/relative) ![f](file:///x.png)"
        " [ok](https://example.org) <mailto:me@example.org> [HTTP](HTTP://EXAMPLE.ORG)"
    )
    doc = _doc(text)
    assert sorted(_anchors(doc)) == sorted(
        ["https://example.org", "mailto:me@example.org", "HTTP://EXAMPLE.ORG"]
    )
    assert "[a](javascript:alert(1))" in doc.toPlainText()  # a refused link stays its source text


@settings(max_examples=150, deadline=None)
@given(
    st.text(alphabet="[]()<>!*_`#-|:/ \nax" + "\x00", max_size=80),
    st.sampled_from(["javascript:", "file:", "https:", ""]),
)
def test_any_reply_renders_with_safe_links_only(qapp, noise, scheme):
    doc = _doc(noise.replace("x", scheme, 1))
    for href in _anchors(doc):
        assert href.lower().startswith(SAFE_SCHEMES) or href.startswith(f"{COPY_CODE_SCHEME}:")


def test_markdown_features_and_an_unclosed_fence(qapp):
    md = "# Title\n**bold** *it* `x_y` [site](https://example.org/a_b)\n\n- one\n- two\n\n```python\ndef f("
    rendered = render_markdown(md, dark=False)
    doc = QTextDocument()
    doc.setHtml(rendered.html)
    assert _format_of(doc, "bold").fontWeight() >= 600
    assert _format_of(doc, "it").fontItalic()
    assert _format_of(doc, "site").anchorHref() == "https://example.org/a_b"  # "_" in URLs is no emphasis
    assert not _format_of(doc, "x_y").fontItalic()
    assert doc.find("one").block().textList() is not None
    assert rendered.code_blocks == ["def f("]  # streaming: the fence is not closed yet
    assert f'href="{COPY_CODE_SCHEME}:0"' in rendered.html


def test_code_blocks_are_numbered_for_their_copy_links(qapp):
    md = "```python\nx = 1\n```\ntext\n```nosuchlanguage\n<b>y</b>\n```\n\n    indented\n"
    rendered = render_markdown(md, dark=True)
    assert rendered.code_blocks == ["x = 1", "<b>y</b>", "indented"]
    doc = QTextDocument()
    doc.setHtml(rendered.html)
    assert [h for h in _anchors(doc) if h.startswith(COPY_CODE_SCHEME)] == [
        f"{COPY_CODE_SCHEME}:{i}" for i in range(3)
    ]
    assert "<b>y</b>" in doc.toPlainText()  # an unknown language is plain escaped text


def test_tables_lists_quotes_and_images(qapp):
    md = "| l | r |\n|:--|--:|\n| a | 1.5 |\n\n3. three\n4. four\n\n> quoted\n\n![pic](https://e.org/p.png)"
    doc = _doc(md)
    assert doc.find("1.5").blockFormat().alignment() & Qt.AlignmentFlag.AlignRight
    assert (
        doc.find("a", 0, QTextDocument.FindFlag.FindWholeWords).blockFormat().alignment()
        & Qt.AlignmentFlag.AlignLeft
    )
    numbered = doc.find("three").block().textList()
    assert numbered is not None and numbered.itemText(doc.find("three").block()) == "3."
    assert _format_of(doc, "[image: pic]").anchorHref() == "https://e.org/p.png"  # a link, never loaded


def test_bare_urls_become_links_without_trailing_punctuation(qapp):
    doc = _doc("See https://example.org/x_y. Or (https://example.org/z), [t](https://example.org/t).")
    assert _anchors(doc) == ["https://example.org/x_y", "https://example.org/z", "https://example.org/t"]


@pytest.mark.parametrize("text", ["- " * 300 + "a", ">" * 2000, "> - 1. " * 300 + "a", "[" * 5000 + "a"])
def test_deep_nesting_renders_the_rest_as_text(qapp, text):
    doc = _doc(text + "\n\nafter")  # these raised RecursionError in the old renderer
    shown = doc.toPlainText()
    assert shown.rstrip().endswith("after")
    assert text[-1] in shown


def test_streaming_prefixes_render_sensibly(qapp):
    reply = "Try [the docs](https://example.org/d) now:\n```python\nprint('hi')\n```\nDone."
    for end in range(len(reply) + 1):
        render_markdown(reply[:end], dark=False)  # every intermediate state renders
    half_link = _doc("Try [the docs](https://exam")  # shown as typed so far, not yet a link
    assert _anchors(half_link) == [] and "[the docs](https://exam" in half_link.toPlainText()
    open_fence = render_markdown("x:\n```python\nprint('h", dark=False)
    assert open_fence.code_blocks == ["print('h"]
    assert render_markdown("x:\n```", dark=False).code_blocks == [""]


def _render_work(text: str) -> int:
    """Python lines executed to render ``text``: a measure of work that, unlike a clock, does
    not depend on the machine or on what else it is doing."""
    lines = 0

    def trace(_frame, event, _arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return trace

    sys.settrace(lambda *_: trace)
    try:
        render_markdown(text, dark=False)
    finally:
        sys.settrace(None)
    return lines


@pytest.mark.parametrize("unit", ["[a](", "**a ", "[", "- ", ">"])
def test_looping_reply_renders_in_linear_work(unit):
    # A model stuck in a loop emits these; the old renderer took 29 s for 64 KB of "[a](".
    small, large = ((unit * (size // len(unit)))[:size] for size in (2 * 1024, 16 * 1024))
    ratio = _render_work(large) / _render_work(small)
    assert ratio < 12, f"16 KB took {ratio:.1f}x the work of 2 KB (linear is 8x, quadratic 64x)"
