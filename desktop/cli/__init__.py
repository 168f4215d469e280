"""The ``nanoscope`` command: ``main`` (list, generate, bench, and the GUI), ``remote`` (served
models), ``export``, the desktop entry and the smoke test."""
