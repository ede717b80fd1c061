"""Tests of tunekit/planning/."""
