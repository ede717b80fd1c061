"""``python -m tunekit``: the tunekit command (tunekit.cli)."""
import sys

from tunekit.cli import main

sys.exit(main())
