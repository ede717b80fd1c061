"""Tests of tunekit/monitor/."""
