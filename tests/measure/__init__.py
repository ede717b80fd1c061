"""Tests of tunekit/measure/."""
