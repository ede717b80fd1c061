"""tunekit's tests, in folders named like the package's (see docs/ARCHITECTURE.md, "Where a test goes")."""
