"""``python -m tunekit``: the tunekit command (tunekit.ui.cli)."""
import sys

from .ui.cli import main

if __name__ == "__main__":   # imported (by the docs' API inspection, say), it runs nothing
    sys.exit(main())
