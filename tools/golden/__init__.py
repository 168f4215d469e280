"""Golden files: checkpoints, tokenizers and expected ids written by the real tools' own code.

``python -m tools.golden FAMILY --src CHECKOUT --out tests/golden`` (see :mod:`tools.golden.cli`).
Only the outputs are committed; the upstream code is imported from a fetched checkout, never copied.
"""
