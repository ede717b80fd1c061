"""``python -m tunekit``: the tunekit command (tunekit.cli.main)."""
import sys

from tunekit.cli.main import main

sys.exit(main())
