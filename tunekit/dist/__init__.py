"""Distributed runs on torch.distributed: the worker, the launcher and emulated nodes (netns)."""
