"""Tests of tunekit/view/."""
