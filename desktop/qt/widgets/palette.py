"""The light and dark colour sets, as plain data: Qt-free, so the Markdown renderer (which bakes
colours into HTML) can use them without importing Qt; ``theme`` applies them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Colors:
    window: str  # main background
    surface: str  # cards, inputs, bars
    sidebar: str  # side panels
    border: str
    text: str
    muted: str
    accent: str
    accent_hover: str
    on_accent: str
    hover: str
    selection: str
    user_bubble: str
    code_bg: str
    code_header: str
    inline_code_bg: str
    link: str
    tool_bg: str
    tool_border: str
    tool_label: str
    tool_result_bg: str
    tool_result: str
    thought_bg: str
    thought_border: str
    error: str
    error_bg: str
    warning: str
    warning_bg: str
    info: str
    info_bg: str
    success: str
    token_a: str  # raw-token view: alternating chip colours
    token_b: str


LIGHT = Colors(
    window="#f7f7f9",
    surface="#ffffff",
    sidebar="#eff0f3",
    border="#dcdfe5",
    text="#1c2029",
    muted="#687080",
    accent="#4f5bd5",
    accent_hover="#3f4ac4",
    on_accent="#ffffff",
    hover="#e6e8ee",
    selection="#dfe3fb",
    user_bubble="#e9edfc",
    code_bg="#f6f8fa",
    code_header="#eaedf1",
    inline_code_bg="#eceff3",
    link="#3451c6",
    tool_bg="#fff8eb",
    tool_border="#e9a23b",
    tool_label="#9a5b00",
    tool_result_bg="#e3f6ea",
    tool_result="#146c3b",
    thought_bg="#f4f1fd",
    thought_border="#b9a6ee",
    error="#c9302c",
    error_bg="#fdeeee",
    warning="#b26a00",
    warning_bg="#fff5e0",
    info="#2563c9",
    info_bg="#eaf2fe",
    success="#1d8a4c",
    token_a="#dfe6fb",
    token_b="#f7e2ee",
)
DARK = Colors(
    window="#17181c",
    surface="#202228",
    sidebar="#1b1c21",
    border="#30333c",
    text="#e5e7ec",
    muted="#9aa0ac",
    accent="#6d78f0",
    accent_hover="#808af4",
    on_accent="#ffffff",
    hover="#2a2d35",
    selection="#2d3253",
    user_bubble="#252a3d",
    code_bg="#0f1217",
    code_header="#1a1e25",
    inline_code_bg="#2b2f38",
    link="#93a4ff",
    tool_bg="#2b2416",
    tool_border="#d4952f",
    tool_label="#f2c26b",
    tool_result_bg="#183123",
    tool_result="#7fdca2",
    thought_bg="#241f35",
    thought_border="#7c66c6",
    error="#f06a63",
    error_bg="#3a1d1e",
    warning="#f0b450",
    warning_bg="#3a2e17",
    info="#74a7ff",
    info_bg="#1a2a44",
    success="#5cc98a",
    token_a="#28304d",
    token_b="#40283c",
)
