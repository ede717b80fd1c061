"""Distributed runs on torch.distributed: DDP, FSDP2 (FULL_SHARD, SHARD_GRAD_OP) and HSDP.

    >>> from tunekit.dist.launch import launch        # the module and the function share a name
    >>> from tunekit.dist import model_spec
    >>> r = launch({"model": model_spec(model), "parallel": "fsdp", "steps": 10}, nproc=2)
    >>> lab.run(parallel="hsdp", nproc=2, nodes=2)      # the same from a Lab

Modules: `spec` (what a worker rebuilds the model from), `worker` (one rank:
``python -m tunekit.dist.worker SPEC.json`` under torchrun, or ``join(spec)``), `launch` (starts
the ranks under the elastic agent, or one torchrun per emulated node), `netns` (emulated
nodes: a network namespace per node joined by a shaped link).
"""
import importlib

_EXPORTS = {"DistRunError": "launch", "join": "worker", "Trainer": "worker",
            "model_spec": "spec", "factory_spec": "spec", "build_model": "spec"}


def __getattr__(name):  # lazy: importing the package loads no torch
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'tunekit.dist' has no attribute {name!r}")
