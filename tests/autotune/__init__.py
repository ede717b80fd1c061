"""Tests of tunekit/autotune/."""
