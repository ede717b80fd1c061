# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Host-side tuning: NUMA affinity, Python's gc, `torch.compile`
#
# **Claim.** Three settings outside the model: (1) on a multi-socket server, bind each GPU's process
# to the CPU cores of the GPU's NUMA node, so host work and data never cross sockets; (2) Python's
# automatic garbage collection fires at arbitrary steps, which across hundreds of ranks makes
# stragglers — disable it and collect at the same step everywhere; (3) `torch.compile` fuses
# kernels, but pays a compile time up front and does not help every model.

# %%
import math
import os
import glob
import torch
import plotly.graph_objects as go
import tunekit
from tunekit import bench
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")


# %% [markdown]
# ## 1. NUMA affinity
#
# In the documents' 8-GPU server, GPUs 0–3 sit on NUMA node 0 with cores `0-51,104-155` and GPUs 4–7
# on node 1. NVML reports that as a bitmask; `tunekit.bench.set_numa_affinity(gpu)` reads it and
# binds the process (call it before creating DataLoaders so workers inherit the binding).

# %%
def cpus_from_mask(words):   # NVML's affinity mask: 64-bit words, word 0 = CPUs 0..63, bit i = CPU 64*w + i
    return [64 * w + bit for w, word in enumerate(words) for bit in range(64) if (word >> bit) & 1]
assert cpus_from_mask([0b1011]) == [0, 1, 3]
node0 = list(range(0, 52)) + list(range(104, 156))   # the documents' GPU0-3 cores
mask = [sum(1 << c for c in node0 if 64 * w <= c < 64 * (w + 1)) >> (64 * w) for w in range(4)]
assert cpus_from_mask(mask) == node0
nodes = len(glob.glob('/sys/devices/system/node/node[0-9]*'))   # Linux sysfs; 0 elsewhere
before = sorted(os.sched_getaffinity(0))
bound = bench.set_numa_affinity(0)
print(f'this machine: {nodes} NUMA node(s), process allowed on {len(before)} CPUs')
print('bound to', f'{len(bound)} CPUs local to cuda:0' if bound else
      f'nothing ({bench.NUMA_NOTE["last"]}): no binding to make here')
fig = go.Figure(go.Bar(x=['GPU0-3 (node 0)', 'GPU4-7 (node 1)', 'this process'],
                       y=[len(node0), len(node0), len(bound or before)]))
fig.update_layout(title='CPU cores per binding (documents server vs here)', yaxis_title='logical CPUs')
fig

# %% [markdown]
# ## 2. Garbage collection in the training loop
#
# `bench.gc_in_training_loop` trains a small MLP for 30 steps while creating 2000 reference cycles
# per step, once with automatic gc and once with gc disabled and a full `gc.collect()` every 10
# steps.

# %%
g = bench.gc_in_training_loop(steps=30, garbage_per_step=2000, collect_every=10)
assert (g.median_s > 0).all() and len(g) == 2
display(g[['variant', 'median_s', 'max_s', 'total_s', 'max_over_median']].round(4))
bench.plot(g)

# %%
auto, manual = g.iloc[0], g.iloc[1]
print(f'automatic gc: worst step {auto.max_over_median:.1f}x the median; manual: worst step {manual.max_over_median:.1f}x the median '
      f'({30 // 10} of its 30 steps also run a full collection), total {manual.total_s / auto.total_s:.2f}x the automatic total. '
      'One run of each: a burst of other work can also make a worst step.')

# %% [markdown]
# How to read it: the automatic collector mostly cleans young garbage, often and cheaply. A full
# `gc.collect()` walks every tracked object (torch's included), so it is expensive. Disabling gc
# does not make collection free, it makes it *predictable*: across many ranks every rank pays at the
# same step, instead of one random straggler holding up each all-reduce. Collect rarely, at the same
# step everywhere.

# %% [markdown]
# ## 3. `torch.compile`: speed after a compile-time toll
#
# `bench.compile_on_off` times forward+backward of a small MLP eagerly and compiled (inductor), and
# records the first compiled call (tracing + code generation).

# %%
c = bench.compile_on_off(width=(1024 if GPU else 128), tokens=(4096 if GPU else 256), repeats=7)
print('notes:', c.attrs.get('notes'))
display(c[['variant', 'median_s', 'compile_s', 'speedup']].round(4))
assert c.median_s.iloc[0] > 0
bench.plot(c)

# %%
eager, comp = c.iloc[0], c.iloc[1]
if math.isnan(comp.median_s):
    print('compile did not run here:', c.attrs.get('notes'))
else:
    saved = eager.median_s - comp.median_s
    v = tunekit.verdict(eager.times, comp.times)   # eager -> compiled, 7 repeats each
    why = ('; this tiny MLP is two matmuls that eager already runs well, and compile pays off when many small '
           'elementwise ops can be fused (norms, activations, attention glue).')
    print(f'first compiled call took {comp.compile_s:.2f} s')
    print('eager -> compiled: ' + v.conclusion(
        helped=f'the compile time is repaid after {comp.compile_s / saved:,.0f} steps.',
        within_noise='no speed-up beyond the noise to amortize' + why,
        hurt='compiled is slower here, nothing to amortize' + why))

# %% [markdown]
# ## Conclusion and exercise
#
# * NUMA binding matters only with several sockets and CPU-heavy host work; it is cheap to do, so do
#   it on multi-socket GPU servers and skip it where there is one NUMA node (section 1 prints how
#   many this machine has).
# * gc: control *when* it happens, not whether — a full collection walks every tracked object, so
#   its cost grows with the heap, and it should land on the same step on every rank.
# * compile: measure the speed-up and the compile time on your model; inductor caches the code it
#   generates, so a later launch with the same shapes can skip most of the compile.
#
# **Exercise:** compile the tunekit GPT (`lab.run(compile=True)` in the dashboard) and compare with
# the MLP here.
