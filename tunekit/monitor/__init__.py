"""Per-step measurement inside the user's own loop (`monitor.Monitor`, its I/O): the arithmetic of a
step, pure (`arithmetic`), what a step was called with (`tap`), its peak and rates (`rates`), its
rows and columns (`rows`, `steps`), rank 0's view of a distributed run (`gather`), where its
figures go (`sinks`) and its live view (`view`).
"""
