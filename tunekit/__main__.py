"""``python -m tunekit``: the tunekit command (tunekit.ui.cli)."""
import sys

from .ui.cli import main

sys.exit(main())
