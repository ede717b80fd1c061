"""``python -m tunekit``: the tunekit command (tunekit.cli.main)."""
import sys

from tunekit.cli.main import main

if __name__ == "__main__":   # imported (by the docs' API inspection, say), it runs nothing
    sys.exit(main())
