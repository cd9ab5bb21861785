"""``python -m pipeline``: the command-line entry point (see pipeline/cli.py)."""

import sys

from pipeline.cli import main

sys.exit(main())
