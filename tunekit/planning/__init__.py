"""`tunekit.plan` (`planner`): one training step of any model planned under fake tensors (`step`,
`module`, `target`), placed on a device of the spec table (`device`, `cuda_like`), sharded over ranks
(`shard`), the analytic fallback (`analytic`), the `Plan` record (`record`), its chart (`plots`),
the dashboard's "Plan for" panel (`panel`).
"""
from tunekit.core.memory.answer import MemoryAnswer
from tunekit.planning.plots import plot_plan

__all__ = ["plot_plan", "MemoryAnswer"]
