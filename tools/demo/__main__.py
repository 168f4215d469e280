"""``python -m tools.demo``: see :mod:`tools.demo.cli`."""

from tools.demo.cli import main

raise SystemExit(main())
