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
# # 07 · Matrix shapes: multiples, tiles, waves
#
# **Claim.** A GPU computes a GEMM's output in tiles, scheduled in waves over its SMs (108 on an
# A100). Dimensions that are not multiples of the tile (and of 8 to 64 elements for tensor cores: 64
# on A100 for the case study) waste part of a tile; a tile count just above a multiple of the SM
# count adds an almost empty wave. Hence the sizing rules: vocab divisible by 64, `b·s`, `h/a`,
# `h/t` with many powers of 2, and a measured search for SwiGLU's `d_ff` near `8/3·h` — 10922 →
# 10944 was +46% on an H100.

# %%
import math
import torch
import plotly.graph_objects as go
import pandas as pd
import tunekit
from tunekit import bench
from tunekit.core import advisor
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")


# %% [markdown]
# ## 1. Tile and wave quantization, on paper
#
# Model: an `(m, k) @ (k, n)` output split into 128×256 tiles, 108 SMs each taking one tile per wave
# (real kernels pick among several tile shapes, so treat this as the shape of the effect, not a
# prediction). Useful fraction = `m·n` / (tiles launched × tile area) × tiles / (waves × 108).

# %%
def quantized_efficiency(m, n, tile=(128, 256), sms=108):
    tm, tn = math.ceil(m / tile[0]), math.ceil(n / tile[1])
    tile_eff = m * n / (tm * tile[0] * tn * tile[1])
    tiles = tm * tn
    wave_eff = tiles / (math.ceil(tiles / sms) * sms)
    return tile_eff * wave_eff
ns = list(range(1024, 8193, 64))
eff = [quantized_efficiency(2048, n) for n in ns]
assert quantized_efficiency(128 * 108, 256) == 1.0          # 108 full tiles: one full wave
assert quantized_efficiency(128 * 109, 256) < 0.51          # 109 tiles: a second, nearly empty wave
fig = go.Figure(go.Scatter(x=ns, y=eff, mode='lines'))
fig.update_layout(title='modelled useful fraction, m = 2048, A100-like (108 SMs, 128x256 tiles)',
                  xaxis_title='n', yaxis_title='useful fraction of the launched work')
fig

# %% [markdown]
# ## 2. Measured: a matmul while one dimension sweeps
#
# `tunekit.bench.matmul_shape_sweep` times `(m, k) @ (k, n)` for each `n` (median of repeats). On a
# GPU the model above predicts a saw-tooth; on a CPU the units are SIMD vectors (8–16 fp32 lanes)
# and cache lines, far smaller than a tile, so a misaligned size can waste at most part of one.

# %%
if GPU:
    sweep = bench.matmul_shape_sweep('n', values=range(4032, 4161, 4), m=4096, k=4096, dtype='bf16')
else:
    sweep = bench.matmul_shape_sweep('n', values=range(496, 529), m=256, k=512, repeats=5)
aligned = sweep[sweep.n % 16 == 0].tflops.median()
odd = sweep[sweep.n % 2 == 1].tflops.median()
assert (sweep.tflops > 0).all() and len(sweep) > 10
bench.plot(sweep)

# %%
al = sweep[sweep.n % 16 == 0].tflops
band = max(0.05, (al.max() - al.min()) / al.max())   # aligned sizes should agree: their spread is the noise
print(f'median TFLOPS at n divisible by 16: {aligned:.4f}; at odd n: {odd:.4f} -> odd sizes run at {odd / aligned:.0%} of aligned '
      f'(noise band ±{band:.0%}, from the spread of the aligned sizes)')
print('Odd sizes are slower here, the direction of the GPU rule.' if odd < (1 - band) * aligned else
      'Odd sizes are faster here, against the rule: noise or this library\'s blocking; rerun the cell.' if odd > (1 + band) * aligned else
      'No penalty for odd sizes beyond the noise on this machine.')

# %% [markdown]
# ## 3. SwiGLU: search `d_ff` instead of taking 8/3·h
#
# The documents' H100 search at `h = 4096`: 10922 (=8/3·h) ran at 272.7 TFLOPS, 10944 at 398.4,
# 11008 (Llama-2-7B) at 395.0. tunekit proposes the multiples of 64/128/256 nearest to 8/3·h and
# `bench.swiglu_dff_search` times the three MLP GEMMs for every candidate.

# %%
doc = pd.DataFrame({'d_ff': [10922, 10944, 11008], 'tflops_H100': [272.73, 398.38, 395.01]})
gain = doc.tflops_H100[1] / doc.tflops_H100[0] - 1
c = advisor.swiglu_dff_candidates(4096)
assert (c['x64'], c['x128'], c['x256']) == (10944, 10880, 11008) and round(gain, 2) == 0.46
print(f'documents: 10944 is {gain:.0%} faster than 10922; candidates for h=4096: {c}')
h = 4096 if GPU else 256
runs_ = [bench.swiglu_dff_search(h, tokens=(4096 if GPU else 256), dtype=('bf16' if GPU else 'fp32'), repeats=5) for _ in range(2)]
# best of two full searches per d_ff: a burst of contention on shared cores slows a few candidates, never speeds them up
search = pd.concat(runs_).sort_values('tflops', ascending=False).drop_duplicates('d_ff').reset_index(drop=True)
search.attrs.update(runs_[0].attrs)
assert (search.tflops > 0).all()
bench.plot(search)

# %%
base = search[search.is_baseline].iloc[0]
top = search.iloc[0]
print(f'h={h}: baseline d_ff={int(base.d_ff)} at {base.tflops:.4f} TFLOPS; fastest d_ff={int(top.d_ff)} at {top.tflops:.4f} '
      f'({top.tflops / base.tflops - 1:+.0%}).')
top3 = search.head(3).d_ff.astype(int)
print(f'on this {device} the spread over all candidates is {search.tflops.max() / search.tflops.min():.2f}x; '
      f'{int((top3 % 64 == 0).sum())} of the 3 fastest d_ff ({", ".join(map(str, top3))}) are multiples of 64. '
      'Each is the best of two searches: rerun to see which winners repeat.')
search.head(5)[['d_ff', 'tflops', 'median_s', 'is_baseline']]

# %% [markdown]
# ## 4. Vocabulary padding
#
# GPT-2's vocabulary of 50257 tokens is a GEMM dimension of the embedding and the output head;
# padding it to 50304 (a multiple of 64) costs 47 unused rows and keeps the largest GEMM aligned.

# %%
assert advisor.padded_vocab(50257) == 50304
hid, toks = (768, 2048) if GPU else (128, 256)
dt = torch.bfloat16 if GPU else torch.float32
xh = torch.randn(toks, hid, device=device, dtype=dt)
reps = {V: [] for V in (50257, 50304)}
ws = {V: torch.randn(hid, V, device=device, dtype=dt) for V in (50257, 50304)}
for _ in range(3):   # alternate the two: each repeat is a median of 5
    for V, w in ws.items():
        reps[V].append(tunekit.measure.median_s(lambda: xh @ w, repeats=5))
times = {V: min(r) for V, r in reps.items()}
speed = {V: 2 * toks * hid * V / t / 1e12 for V, t in times.items()}
print(f'lm_head GEMM: vocab 50257 {speed[50257]:.4f} TFLOPS, padded 50304 {speed[50304]:.4f} TFLOPS '
      f'(padded does {50304/50257 - 1:.2%} more work and runs {times[50257] / times[50304]:.2f}x as fast)')
print('padding the vocabulary: ' + tunekit.verdict(reps[50257], reps[50304]).conclusion(
    helped='the aligned GEMM is faster, more than its extra 0.09% of work costs.',
    within_noise='no difference beyond the noise; the padded GEMM does only 0.09% more work'
                 + ('.' if GPU else ', and a CPU has no tensor-core tiles to fill.'),
    hurt='the padded GEMM was slower here; it does only 0.09% more work, so rerun the cell to see whether it repeats.'))
assert all(t > 0 for t in times.values())

# %% [markdown]
# ## 5. The sizing rules as a checklist
#
# `tunekit.advise` checks a config against the documents' recommendations. GPT-2's real shapes pass;
# an awkward variant does not:

# %%
good = tunekit.advise(tunekit.GPTConfig.preset('gpt2-124m'), micro_batch=8, seq_len=1024)
awkward = dict(vocab_size=50257, n_layer=12, n_head=12, n_embd=780, block_size=1000, mlp='swiglu', d_ff=2080)
bad = tunekit.advise(awkward, micro_batch=3, seq_len=1000)   # a plain dict works too
print(f'gpt2-124m: {len(good.problems)} problems; awkward variant: {len(bad.problems)} problems')
assert len(good.problems) == 0 and len(bad.problems) >= 3
bad.to_frame()[['status', 'value', 'recommendation']]

# %% [markdown]
# ## Conclusion and exercise
#
# * Shape rules are GPU rules: tiles, waves and tensor-core multiples. The tile model above and the
#   published SwiGLU search (+46% on an H100) show how large they can be; a CPU's vectors and cache
#   lines are far smaller units (sections 2–4 print what this machine showed), so measure on the
#   hardware you will train on.
# * Padding (vocab), rounding (`d_ff`) and choosing heads (`h/a`) cost almost no parameters — check
#   them before training with `tunekit.advise`.
#
# **Exercise:** change `h` in section 3 to 384 and 320. Do the x64 candidates still win?
