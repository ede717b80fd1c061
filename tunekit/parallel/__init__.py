"""Distributed runs on torch.distributed: DDP, FSDP2 (FULL_SHARD, SHARD_GRAD_OP) and HSDP.

    >>> from tunekit.parallel.launch import launch
    >>> from tunekit.models.spec import model_spec
    >>> r = launch({"model": model_spec(model), "parallel": "fsdp", "steps": 10}, nproc=2)
    >>> lab.run(parallel="hsdp", nproc=2, nodes=2)      # the same from a Lab

Modules: `worker` (one rank: ``python -m tunekit.parallel.worker SPEC.json`` under torchrun,
or ``join(spec)``), `launch` (starts the ranks under the elastic agent, or one torchrun per
emulated node), `netns` (emulated nodes: a network namespace per node joined by a shaped link).
A model travels to the ranks as a spec (`tunekit.models.spec`).
"""
