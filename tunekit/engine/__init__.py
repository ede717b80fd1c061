"""The engine: trains and searches. The Lab (`lab`, a façade), the training step it and every
distributed rank share (`train/`), a single-process run (`run`) and a distributed one
(`distributed`, launching `dist/`), the guard that undoes a run gone non-finite, the fit check,
the max-batch search, autotune and the microbenchmarks (`bench/`). Returns records; never
prints or draws.
"""
