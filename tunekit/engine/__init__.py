"""The engine: trains and searches. The Lab (`lab`), the training step it and every distributed
rank share, the guard that undoes a run gone non-finite, the fit check, the max-batch search,
autotune, the microbenchmarks (`bench/`) and distributed runs (`dist/`). Returns records; never
prints or draws.
"""
