"""Tests of tunekit/bench/."""
