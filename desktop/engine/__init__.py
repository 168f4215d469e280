"""Qt-free inference core: formats, model, tokenizers, sampling, generation, tools.

Nothing in this package may import PySide6. torch is imported only by the modules
that need it, so importing the package itself stays cheap.
"""
