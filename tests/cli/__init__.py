"""Tests of tunekit/cli/."""
