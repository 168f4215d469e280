"""``python -m desktop`` runs the same entry point as the ``nanoscope`` command."""

import sys

from .cli import main

sys.exit(main())
