"""`tunekit.plan`: one training step planned under fake tensors (engine/plan/planner.py)."""
from .planner import plan

__all__ = ["plan"]
