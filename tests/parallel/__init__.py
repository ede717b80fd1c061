"""Tests of tunekit/parallel/."""
