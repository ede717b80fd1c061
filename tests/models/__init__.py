"""Tests of tunekit/models/."""
