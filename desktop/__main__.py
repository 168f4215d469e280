"""``python -m desktop`` runs the same entry point as the ``nanoscope`` command."""

import sys

from desktop.cli.main import main

sys.exit(main())
