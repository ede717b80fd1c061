"""``tunekit.bench``: the documents' microbenchmarks and their chart, in one namespace.

    >>> from tunekit import bench
    >>> df = bench.swiglu_dff_search(256)      # candidates near 8/3*h ranked by TFLOPS
    >>> bench.plot(df).show()

Each function returns a pandas DataFrame (median of repeats with min and max, after warm-up,
device synchronized); ``plot(df)`` draws any of them. CPU-sized defaults run in seconds; pass
bigger sizes on a GPU.
"""
from tunekit.bench.allreduce import all_reduce_busbw
from tunekit.bench.compute import (
    compile_on_off,
    forward_backward_ratio,
    matmul_shape_sweep,
    naive_softmax,
    softmax_naive_vs_fused,
    swiglu_dff_search,
)
from tunekit.bench.host import (
    NUMA_NOTE,
    dataloader_workers,
    gc_in_training_loop,
    pin_memory_non_blocking,
    set_numa_affinity,
)
from tunekit.bench.plots import plot

__all__ = ["NUMA_NOTE", "all_reduce_busbw", "compile_on_off", "dataloader_workers", "forward_backward_ratio",
           "gc_in_training_loop", "matmul_shape_sweep", "naive_softmax", "pin_memory_non_blocking",
           "plot", "set_numa_affinity", "softmax_naive_vs_fused", "swiglu_dff_search"]
