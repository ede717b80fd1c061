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
# # 09 · Feeding the model: DataLoader workers, pinned memory, non-blocking copies
#
# **Claim.** With `num_workers=0` the training loop waits while every batch is loaded and
# transformed. Worker processes prepare the next batches while the model computes; the documents'
# run fell from 5.39 s (0 workers) to 0.84 s (3 workers), then stopped improving once the workers
# outpaced the consumer. On a GPU, `pin_memory=True` (page-locked host buffers) plus
# `.to(device, non_blocking=True)` lets the copy overlap compute: 0.646 s → 0.459 s in the
# documents' A100 test.

# %%
import math
import torch
import plotly.graph_objects as go
import pandas as pd
import tunekit
from tunekit import bench
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")

# %% [markdown]
# ## 1. Workers
#
# `bench.dataloader_workers` passes over a dataset whose items take 10 ms each to “transform” (a
# sleep, like waiting on storage) with 0…4 workers; workers persist between passes, and the median
# pass time is reported.

# %%
doc = pd.Series([5.39, 3.90, 1.33, 0.84, 0.88], index=range(5), name='documents_s')
w = bench.dataloader_workers(num_workers=(0, 1, 2, 3, 4), n_items=32, batch_size=4, transform_s=0.01, repeats=3)
assert (w.median_s > 0).all() and list(w.num_workers) == [0, 1, 2, 3, 4]
# no pass can beat its sleeps, however busy the machine: 32 items in 8 batches of 4; with n workers
# the busiest one loads ceil(8 / n) batches x 4 items x 10 ms, with none this process loads all 32
assert all(w.min_s[i] >= math.ceil(8 / max(n, 1)) * 4 * 0.01 for i, n in enumerate(w.num_workers))
fig = go.Figure()
fig.add_scatter(x=w.num_workers, y=w.speedup_vs_first, name='measured here', mode='lines+markers')
fig.add_scatter(x=doc.index, y=doc.iloc[0] / doc, name='documents', mode='lines+markers', line_dash='dash')
fig.add_scatter(x=w.num_workers, y=[max(1, n) for n in w.num_workers], name='ideal (n workers)', line_dash='dot')
fig.update_layout(title='DataLoader speed-up over num_workers=0', xaxis_title='num_workers', yaxis_title='speed-up (x)')
display(w[['num_workers', 'median_s', 'min_s', 'max_s', 'speedup_vs_first']].round(3))
fig

# %%
best = w.loc[w.median_s.idxmin()]
v = tunekit.verdict(w.times.iloc[0], best.times)   # 0 workers against the fastest setting, pass by pass
print(f'measured: {w.median_s.iloc[0]:.3f} s with 0 workers -> {best.median_s:.3f} s with {int(best.num_workers)}: '
      f'{v}; documents: {doc.iloc[0]:.2f} s -> {doc.min():.2f} s ({doc.iloc[0] / doc.min():.1f}x)')
import os
print(f'this machine has {os.cpu_count()} CPUs: a sleeping (I/O-like) transform still overlaps across more workers than cores, '
      'but a CPU-heavy transform would stop scaling at the core count, and workers compete with the training step for those cores.')
one = tunekit.verdict(w.times.iloc[0], w.times.iloc[1])   # 0 workers against 1, pass by pass
print('1 worker against none: ' + one.conclusion(
    within_noise='this loop does no compute of its own, so a single worker has nothing to overlap with; '
                 'the gain comes from several items loading at once.',
    hurt='slower: this loop has no compute for one worker to overlap with, and handing batches between '
         'processes costs time.',
    helped='faster here, though this loop has no compute for it to overlap with: rerun to see whether it repeats.'))

# %% [markdown]
# ## 2. Pinned memory × non-blocking copies
#
# A copy from ordinary (pageable) host memory is staged through a pinned buffer by the driver and
# blocks the host; from pinned memory with `non_blocking=True` it is a DMA transfer that overlaps
# the GPU's work. The documents' A100 numbers (seconds to feed the same batches):

# %%
doc_pin = pd.DataFrame({'pin_memory': [True, True, False, False], 'non_blocking': [True, False, True, False],
                        'documents_s': [0.459, 0.522, 0.658, 0.646]})
assert doc_pin.documents_s.idxmin() == 0   # pinned + non-blocking is fastest
meas = bench.pin_memory_non_blocking(n_batches=32 if GPU else 4)
doc_pin['measured_s'] = meas.median_s.values
doc_pin['case'] = [f'pin={p}, nb={n}' for p, n in zip(doc_pin.pin_memory, doc_pin.non_blocking)]
fig = go.Figure(go.Bar(x=doc_pin.case, y=doc_pin.documents_s, name='documents (A100)'))
if GPU:
    fig.add_bar(x=doc_pin.case, y=doc_pin.measured_s, name='measured here')
fig.update_layout(barmode='group', title='pin_memory x non_blocking', yaxis_title='seconds')
print('measurement notes:', meas.attrs.get('notes'))
fig

# %%
gain = doc_pin.documents_s.iloc[3] / doc_pin.documents_s.iloc[0]
print(f'documents: pinned + non-blocking is {gain:.2f}x faster than neither; pinning alone '
      f'{doc_pin.documents_s.iloc[3] / doc_pin.documents_s.iloc[1]:.2f}x; non_blocking without pinning gains nothing '
      f'({doc_pin.documents_s.iloc[2]:.3f} vs {doc_pin.documents_s.iloc[3]:.3f} s).')
if GPU:
    m = doc_pin.measured_s
    print(f'measured here: {m.iloc[3] / m.iloc[0]:.2f}x for pinned + non-blocking over neither')
else:
    assert doc_pin.measured_s.isna().all()   # a figure that cannot be measured is NaN, never 0
    print('no GPU here: there is no host-to-device copy to overlap, so the measured column is NaN.')

# %% [markdown]
# ## Conclusion and exercise
#
# * Workers hide waiting (storage, decoding) behind compute; the gain saturates once data is ready
#   faster than the model consumes it — more workers then only cost memory and cores.
# * `non_blocking=True` can only overlap a copy from pinned memory, so the two work as a pair: in the
#   documents' A100 test non-blocking alone gained nothing, pinning alone some, both the most.
#
# **Exercise:** make the transform CPU-bound (replace the sleep in a copy of `SlowDataset` by a busy
# loop) and rerun section 1: where does the speed-up stop now, and why?
