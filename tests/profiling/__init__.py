"""Tests of tunekit/profiling/."""
