"""``python -m tools.golden``: see :mod:`tools.golden.cli`."""

from tools.golden.cli import main

raise SystemExit(main())
