"""PyInstaller's entry script: the frozen app runs the same ``main()`` as the ``nanoscope`` command."""

import sys

from desktop.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
