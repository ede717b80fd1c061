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
# # 03 · Anatomy of training memory
#
# **Claim.** Training memory is weights + gradients + optimizer states (static, proportional to the
# parameter count: 18 bytes/param for mixed precision with AdamW) plus activations saved for
# backward (proportional to batch × sequence length) plus temporaries. On a GPU add the CUDA context
# and kernels (memory torch's allocator never sees; section 5 prints the figure tunekit charges),
# `torch.distributed` buffers (~1–2 GB) and fragmentation. We estimate each line, then measure it
# on a live model.

# %%
import torch
import plotly.graph_objects as go
import pandas as pd
import tunekit
from tunekit.core.memory import estimate as anatomy
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")
GiB = 2**30

# %% [markdown]
# ## 1. Bytes per parameter
#
# The static lines depend only on the memory layout and the optimizer. A layout is where a step keeps
# its bytes (a Setting derives it from its precision: `Setting(precision='bf16').memory_layout` is
# `'amp'`); `mixed` keeps half weights beside fp32 master weights:

# %%
combos = [('fp32', 'adamw'), ('mixed', 'adamw'), ('amp', 'adamw'), ('bf16', 'adamw'),
          ('mixed', 'sgd'), ('mixed', 'adamw-8bit')]
table = pd.DataFrame([{'memory_layout': m, 'optimizer': o, **anatomy.bytes_per_param(m, o)} for m, o in combos])
table['total B/param'] = table[['weights', 'master_weights', 'gradients', 'optimizer_states']].sum(axis=1)
assert table.set_index(['memory_layout', 'optimizer']).loc[('mixed', 'adamw'), 'total B/param'] == 18   # 2+4+4+8
assert table.set_index(['memory_layout', 'optimizer']).loc[('fp32', 'adamw'), 'total B/param'] == 16   # 4+4+8
table

# %% [markdown]
# Mixed precision costs *more* static memory than fp32 (an extra half-precision copy of the
# weights, 18 against 16 B/param in the table); what it buys is faster half-precision math and
# smaller activations. For a 7B model the 18 B/param alone is:

# %%
print(f'7B x 18 B = {7e9 * 18 / 1e9:.0f} GB = {7e9 * 18 / GiB:.0f} GiB, before a single activation')
assert 7e9 * 18 / 1e9 == 126

# %% [markdown]
# ## 2. Activations: the documents' 147M-parameter example
#
# Korthikanti et al.: activations without recomputation take `s·b·h·L·(10 + 24/t + 5·a·s/(h·t))`
# bytes. For GPT with L=12, h=768, a=12, s=512 the cell below computes it per sample and at
# micro-batch 64 against the static memory. The printed example also double-counts the fp32 copy (20 B/param);
# `worked_example_147m` shows the three readings side by side.

# %%
ex = anatomy.worked_example_147m(64)
per_sample = anatomy.korthikanti_activation_bytes(s=512, b=1, h=768, n_layer=12, a=12)
assert per_sample == 512 * 768 * 12 * (10 + 24 + 5 * 12 * 512 / 768)   # = 349175808
summary = pd.DataFrame({k: {'static GiB': e.static_bytes / GiB, 'activations GiB': e['activations'] / GiB,
                            'total GiB': e.total_bytes / GiB} for k, e in ex.items()}).T.round(2)
print(f'activations per sample: {per_sample / 2**20:.0f} MiB; at micro-batch 64 they are '
      f'{(summary["activations GiB"] / summary["static GiB"]).min():.0f}-'
      f'{(summary["activations GiB"] / summary["static GiB"]).max():.0f}x the static memory (the readings below)')
summary

# %% [markdown]
# ## 3. Estimated vs measured on a live model
#
# `tunekit.measure_memory` runs one real training step and measures each component: parameter and
# gradient storage, optimizer state tensors, and every tensor autograd saved for backward.
# `estimate_memory` predicts the same lines tensor by tensor for tunekit's GPT.

# %%
lab = tunekit.Lab(preset='cpu-small' if not GPU else 'gpt2-124m')
seq = 128 if not GPU else 512
rep = tunekit.measure_memory(lab, micro_batch=4, seq_len=seq)
frame = rep.to_frame()
display(frame.style.format({'estimated_bytes': '{:,.0f}', 'measured_bytes': '{:,.0f}', 'error': '{:+.1%}'}))
rep.figure()

# %%
meas = rep.measured
static = meas['weights'] + meas['gradients'] + meas['optimizer_states']
assert meas['weights'] > 0 and meas['activations'] > 0
assert abs(meas['optimizer_states'] / meas['weights'] - 2) < 0.01   # AdamW: two fp32 moments per fp32 weight
print(f'static (weights+grads+AdamW) {static / 2**20:.1f} MiB = {static / lab.model.num_params(False):.1f} B/param; '
      f'activations {meas["activations"] / 2**20:.1f} MiB at micro-batch 4')
worst = frame['error'].abs().max()
static_err = frame.loc[['weights', 'gradients', 'optimizer_states'], 'error'].abs().max()
print(f'largest estimate error over the components: {worst:.1%} ({frame["error"].abs().idxmax()}); '
      f'static lines: {static_err:.2%} -> ' + ('the estimate tracks the measurement closely for this model.'
      if worst < 0.05 else 'the estimate misses a line by more than 5% here: read the table for which.'))

# %% [markdown]
# ## 4. Activations scale with the batch; static memory does not
#
# Measure the activation bytes at a few micro-batch sizes and compare with the estimate. The
# crossover — where activations overtake weights + gradients + optimizer — is where checkpointing
# (chapter 05) starts to pay.

# %%
mbs = [1, 2, 4, 8]
acts = [tunekit.measure_memory(lab, micro_batch=b, seq_len=seq).measured['activations'] for b in mbs]
est = [tunekit.estimate_memory(lab.model, micro_batch=b, seq_len=seq, precision='fp32', device='cpu')['activations'] for b in mbs]
fig = go.Figure()
fig.add_scatter(x=mbs, y=[a / 2**20 for a in acts], name='activations measured', mode='lines+markers')
fig.add_scatter(x=mbs, y=[e / 2**20 for e in est], name='activations estimated', line_dash='dash')
fig.add_scatter(x=mbs, y=[static / 2**20] * len(mbs), name='weights+grads+AdamW', line_dash='dot')
fig.update_layout(title=f'memory vs micro-batch (seq {seq})', xaxis_title='micro-batch', yaxis_title='MiB (2^20 bytes)')
fig

# %%
per_sample_meas = (acts[-1] - acts[0]) / (mbs[-1] - mbs[0])
cross = static / per_sample_meas
linear_gap = abs(acts[-1] / acts[0] - mbs[-1] / mbs[0]) / (mbs[-1] / mbs[0])
print(f'each extra sample adds {per_sample_meas / 2**20:.2f} MiB of activations; '
      f'activations pass the static {static / 2**20:.1f} MiB at a micro-batch of about {cross:.1f}')
print(f'{mbs[-1] // mbs[0]}x the micro-batch gave {acts[-1] / acts[0]:.2f}x the activations: ' +
      ('linear within 15%.' if linear_gap < 0.15 else 'further from linear than 15%.'))
assert acts == sorted(acts) and acts[-1] > acts[0]
assert abs(acts[-1] / acts[0] - mbs[-1] / mbs[0]) / (mbs[-1] / mbs[0]) < 0.15   # close to linear

# %% [markdown]
# ## 5. What the allocator does not show: CUDA context, fragmentation
#
# On a GPU, `nvidia-smi` reports more than `torch.cuda.memory_allocated()`: the CUDA context and
# kernels, NCCL buffers, and memory the caching allocator *reserved* but split into pieces too
# small to reuse (fragmentation). An estimate or a plan charges the context its published figure
# for torch 2.1 on an A100 with kernels loaded lazily, torch's default (the cell prints it); loaded
# eagerly (`CUDA_MODULE_LOADING=EAGER`) the same source measured about twice that.
# `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lets segments grow instead of fragmenting; it
# must be set before the first CUDA allocation (in the shell, or `os.environ` before
# `import torch`).

# %%
import os
print(tunekit.estimate_memory(1e6, device='cuda').formulas['cuda_context'])   # the figure estimates and plans charge
print('PYTORCH_CUDA_ALLOC_CONF =', os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset: default allocator)'))
if GPU:
    free, total = torch.cuda.mem_get_info()
    used, reserved, alloc = total - free, torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    print(f'driver sees {used / GiB:.2f} GiB used; torch reserved {reserved / GiB:.2f}, allocated {alloc / GiB:.2f}')
    print(f'outside torch (context, kernels, other libraries): {(used - reserved) / GiB:.2f} GiB; '
          f'reserved but not allocated (cache + fragmentation): {(reserved - alloc) / GiB:.2f} GiB')
    print(rep.to_frame().tail(len(rep.cuda)))
else:
    print('CPU run: there is no CUDA context and no caching allocator, so this section only applies on a GPU.')
    print('notes from measure_memory:', *rep.notes, sep='\n  ')

# %% [markdown]
# ## Conclusion and exercise
#
# * The static part follows from the parameter count times bytes/param (section 3 prints how
#   close the estimate came on this model).
# * Activations are the variable part: linear in micro-batch (and in sequence length, plus a
#   quadratic term for non-fused attention); section 4 prints what the measurement did.
# * On CPU the numbers are real tensor sizes, so the anatomy carries over to a GPU; what CPU cannot
#   show is the CUDA context, NCCL and fragmentation overhead, so leave 1–3 GB of headroom there.
#
# **Exercise:** re-run section 3 with `precision='bf16'` in `measure_memory`: which lines shrink,
# and why do the weights stay fp32?
