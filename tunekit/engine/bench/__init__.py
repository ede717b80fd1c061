"""Microbenchmarks from the documents, each returning a pandas DataFrame (median of repeats with
min and max, after warm-up, device synchronized). Engine layer: they measure, never draw;
``tunekit.bench`` (tunekit/ui/bench.py) is the public namespace with ``bench.plot(df)``.

Modules: `compute` (matmul shapes, SwiGLU width, softmax, compile, forward/backward), `host`
(data-loader workers, pinned memory, gc, NUMA), `allreduce` (bus bandwidth of all_reduce).
"""
