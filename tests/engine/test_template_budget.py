"""A chat template from a stranger's folder renders under a budget: operations, sizes, output.

Each hostile template ends in one line naming the file, quickly and without taking gigabytes;
an ordinary template still renders as transformers renders it (tests/test_hf_backend.py)."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from desktop.engine.chat_template import MAX_OUTPUT_CHARS, ChatTemplate
from desktop.engine.errors import TokenizerError

ORIGIN = Path("/models/x/chat_template.jinja")
HOSTILE = {
    "nested ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "a doubling macro": (
        "{% macro d(n) %}{% if n %}{{ d(n-1) }}{{ d(n-1) }}{% endif %}{% endmacro %}{{ d(60) }}"
    ),
    "a doubling string": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s }}"
    ),
    "center(2e9)": "{{ ''|center(2000000000) }}",
    "'a' * 2e9": "{{ 'a' * 2000000000 }}",
    "a printf width": "{{ '%2000000000d'|format(1) }}",
    "a printf width by %": "{{ '%2000000000d' % 1 }}",
    "a str.format width": "{{ '{:2000000000}'.format(1) }}",
    "tojson(indent=1e9)": "{{ messages|tojson(indent=1000000000) }}",
    "ljust(2e9)": "{{ 'a'.ljust(2000000000) }}",
    "replace of the empty text": "{{ ('a' * 1000000).replace('', 'b' * 1000) }}",
    "a huge power": "{{ 10 ** 100000000 }}",
    "too much output": "{% for m in range(5000) %}{{ 'x' * 4000 }}{% endfor %}",
}


@pytest.mark.parametrize("source", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_template_is_stopped_in_one_line(source):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    template = ChatTemplate(source, ORIGIN, {})
    with pytest.raises(TokenizerError) as info:
        template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    message = str(info.value)
    assert message.startswith(f"{ORIGIN}: the chat template was stopped: ") and "\n" not in message
    # Generous bounds, so a slow machine passes: the unbounded renders hang or take gigabytes.
    assert time.monotonic() - started < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20  # KB: under 1 GB


def test_deep_nesting_is_a_compile_error_in_one_line():
    source = "{% if 1 %}" * 5000 + "x" + "{% endif %}" * 5000
    with pytest.raises(TokenizerError, match=r"does not compile \(nested too deeply\)"):
        ChatTemplate(source, ORIGIN, {})


def test_an_ordinary_template_renders_a_long_conversation_within_the_budget():
    source = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content | trim }}"
        "{% else %}<|assistant|>{{ m.content }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"message {i} " * 20} for i in range(2000)]
    text = ChatTemplate(source, ORIGIN, {"bos_token": "<s>"}).render(messages, add_generation_prompt=True)
    assert text.startswith("<s><|user|>message 0") and text.endswith("<|assistant|>")
    assert text.count("<|user|>") == 1000 and len(text) < MAX_OUTPUT_CHARS


def test_the_budget_is_per_render():
    source = "{% for i in range(80000) %}{% endfor %}ok"  # 160,000 operations: a range item and an iteration
    template = ChatTemplate(source, ORIGIN, {})
    assert [template.render([], add_generation_prompt=False) for _ in range(3)] == ["ok"] * 3
