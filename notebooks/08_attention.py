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
# # 08 · Attention: math vs SDPA vs flash
#
# **Claim.** Written out (`softmax(QKᵀ/√d)·V`), attention materializes a `B·heads·T×T` score matrix
# per layer and keeps it for backward: memory and memory traffic grow with `T²`. Fused kernels
# (`F.scaled_dot_product_attention`, FlashAttention) stream blocks of it through fast on-chip memory
# and recompute it in backward, so what they save grows only with `T`. In the documents' case study
# FlashAttention-2 alone doubled throughput (8,000 → 16,000 tokens/s).

# %%
import math
import torch
import pandas as pd
from plotly.subplots import make_subplots
import tunekit
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")

# %% [markdown]
# ## 1. What the math path must store
#
# One layer's score matrix in fp32 (bytes = `B·heads·T²·4`), before counting its masked and
# softmaxed copies:

# %%
for T in (1024, 4096, 8192):
    print(f'T={T:5d}: {8 * 32 * T * T * 4 / 2**30:7.2f} GiB per layer for B=8, 32 heads')
assert 8 * 32 * 4096**2 * 4 == 17_179_869_184   # 16 GiB: one layer at T=4096 would fill a fifth of an 80 GB GPU

# %% [markdown]
# ## 2. Measured over the sequence length
#
# The same small GPT runs with `attention='math'` and `'sdpa'` (and `'flash'` where flash-attn and a
# GPU exist). For each length: activation bytes saved for backward (`tunekit.measure_memory`) and
# the median forward+backward time, from 3 repeats that each carry the machine's condition
# (`tunekit.measure.time_records`), so that a repeat slowed by other work can be told apart.

# %%
seqs = [256, 512, 1024, 2048] if GPU else [128, 256, 512, 1024]
cfg = tunekit.GPTConfig(n_layer=2, n_head=8 if GPU else 4, n_embd=512 if GPU else 128, block_size=max(seqs))
B = 8 if GPU else 2
torch.manual_seed(0)
net = tunekit.GPT(cfg).to(device)
amp = torch.autocast('cuda', dtype=torch.bfloat16) if GPU else torch.autocast('cpu', enabled=False)
impls = ['math', 'sdpa'] + (['flash'] if GPU else [])
rows = []
for T in seqs:
    x = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    for impl in impls:
        net.set_attention(impl)
        saved = tunekit.measure_memory(net, (x, x), precision='bf16' if GPU else None, estimate=False).measured['activations']
        def fb():
            with amp:
                loss = net(x, x)[1]
            loss.backward(); net.zero_grad(set_to_none=True)
        repeats = tunekit.measure.time_records(fb, repeats=3, name=f'{impl} T={T}')
        rows.append(dict(seq=T, impl=impl, ran=net.attention_ran, saved_MiB=saved / 2**20,
                         fwd_bwd_ms=sorted(r.wall_s for r in repeats)[1] * 1e3, repeats=repeats))
df = pd.DataFrame(rows)
assert (df.saved_MiB > 0).all() and (df.fwd_bwd_ms > 0).all()
df.drop(columns='repeats').round(2)

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=['activations saved for backward (MiB)', 'forward+backward (ms, median)'])
colors = dict(zip(impls, ['#d62728', '#1f77b4', '#2ca02c']))   # one colour per kernel in both panels
for impl, g in df.groupby('impl', sort=False):
    fig.add_scatter(x=g.seq, y=g.saved_MiB, name=impl, legendgroup=impl, line_color=colors[impl], row=1, col=1)
    fig.add_scatter(x=g.seq, y=g.fwd_bwd_ms, name=impl, legendgroup=impl, line_color=colors[impl], showlegend=False, row=1, col=2)
fig.update_xaxes(type='log', title_text='sequence length (log)'); fig.update_yaxes(type='log')   # log-log: slope = growth exponent
fig.update_layout(title=f'attention implementations, B={B}, {cfg.n_layer} layers, {cfg.n_head} heads on {device}')
fig


# %%
def growth(impl, col):   # exponent p in value ~ T^p over the last doubling
    g = df[df.impl == impl].set_index('seq')[col]
    return math.log(g.iloc[-1] / g.iloc[-2], 2)
T = seqs[-1]
last = df[df.seq == T].set_index('impl')
mem_x = last.loc['math', 'saved_MiB'] / last.loc['sdpa', 'saved_MiB']
p_math, p_sdpa = growth('math', 'saved_MiB'), growth('sdpa', 'saved_MiB')
scores_share = 1 - last.loc['sdpa', 'saved_MiB'] / last.loc['math', 'saved_MiB']   # what math keeps beyond sdpa
print(f"over the last doubling, memory grows like T^{p_math:.2f} with math and T^{p_sdpa:.2f} with sdpa")
print(f'at T={T}: math keeps {mem_x:.1f}x the activations of sdpa; the extra, mostly score matrices, is '
      f'{scores_share:.0%} of what math keeps' + (': most of it.' if scores_share > 0.5 else '.'))
speed = tunekit.verdict(last.loc['math', 'repeats'], last.loc['sdpa', 'repeats'])   # sdpa against math, 3 repeats each
print(f'switching math -> sdpa at T={T}, speed: ' + speed.conclusion(
    helped='the fused kernel is faster at this length.',
    within_noise='no difference beyond the noise at this length.',
    hurt='the fused kernel is slower at this length: its backward recomputes the scores.'))
print('the model reports it ran:', last.loc['sdpa', 'ran'], '| on CPU torch uses its own flash-style kernel; flash-attn itself needs a GPU')
assert last.loc['math', 'saved_MiB'] > last.loc['sdpa', 'saved_MiB']
assert growth('math', 'saved_MiB') > growth('sdpa', 'saved_MiB')

# %% [markdown]
# ## Conclusion and exercise
#
# * The math path stores `T²` scores per head and the fused path does not, so as `T` grows the
#   math path's memory bends toward `T²` while the fused path's stays linear; the cell above prints
#   the exponents this run measured and how much of math's memory the extra is.
# * Speed: on a GPU, attention's score traffic makes it memory-bound, and keeping the scores on-chip
#   is what makes the fused kernel faster. Its backward recomputes the scores, which costs time
#   wherever memory traffic was not the limit, as it can be on a CPU; the verdict above says what
#   this machine did.
# * The case study's 2× from FlashAttention-2 (8,000 → 16,000 tokens/s) is a published figure:
#   Llama-2 7B finetuned on 1024-token sequences on A100s.
#
# **Exercise:** in the dashboard (`tunekit.Lab().dashboard()`), switch attention between math and
# sdpa at the longest sequence length: how do tokens/s and peak memory move?
