"""Tests of tunekit/core/."""
