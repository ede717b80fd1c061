"""Tests of tunekit/lab/."""
