"""Write one benchmark's figures into its own section of docs/PERFORMANCE.md.

Each benchmark owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, so
benchmarks can be rerun one at a time without clobbering each other's figures.
"""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, body: str) -> None:
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + f"\n\n## {name}\n\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
