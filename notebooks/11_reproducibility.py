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
# # 11 · Reproducibility: seeds, environment, and how many repeats a claim needs
#
# **Claim.** A performance experiment changes one variable and keeps everything else fixed. That
# takes three things: fixed seeds (same data order, same initial weights, same losses), a recorded
# environment (software versions, hardware, the settings that change kernels), and knowing the
# run-to-run spread of your timings, because the spread decides how many repeats it takes before a
# 3% speed-up is real rather than noise. The documents' team could not tune on a shared network
# until they got an isolated one; a few shared CPU cores are the same problem at a small scale.

# %%
import math, statistics, time
import os, platform, subprocess, sys, tempfile
import torch
import plotly.graph_objects as go
import pandas as pd
import tunekit
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")
logdir = tempfile.mkdtemp()   # each Lab below gets its own run log


# %% [markdown]
# ## 1. Fixed seeds: identical runs
#
# Two labs built with the same seed train three steps each; a third uses another seed.

# %%
def fresh(seed, name):
    return tunekit.Lab(seed=seed, log_path=f'{logdir}/{name}.jsonl')
r0a = fresh(0, 'a').run(steps=3, warmup=0)
r0b = fresh(0, 'b').run(steps=3, warmup=0)
r1 = fresh(1, 'c').run(steps=3, warmup=0)
print(f'seed 0: loss {r0a.loss_first:.6f} -> {r0a.loss:.6f}; again: {r0b.loss_first:.6f} -> {r0b.loss:.6f}')
print(f'seed 1: loss {r1.loss_first:.6f} -> {r1.loss:.6f}')
assert (r0a.loss_first, r0a.loss) == (r0b.loss_first, r0b.loss)   # bitwise equal, not just close
assert r1.loss != r0a.loss


# %% [markdown]
# On a GPU, the same seed is not enough for bitwise equality: some kernels (atomics in backward,
# cuBLAS split-K) add in a different order each run. `torch.use_deterministic_algorithms(True)` with
# `CUBLAS_WORKSPACE_CONFIG=:4096:8` forces deterministic kernels, at some cost in speed — use it to
# debug, not to benchmark.
#
# ## 2. Capture the environment
#
# Everything that can change a timing goes into the record:

# %%
def capture_env():
    def git(*args):   # stdout, or None when git (or the repository) is missing
        try:
            r = subprocess.run(['git', *args], capture_output=True, text=True, timeout=5)
        except Exception:
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    status = git('status', '--porcelain')
    env = {
        'python': sys.version.split()[0], 'torch': torch.__version__, 'tunekit': tunekit.__version__,
        'platform': platform.platform(), 'cpu': platform.processor() or platform.machine(),
        'cpu_count': os.cpu_count(), 'torch_threads': torch.get_num_threads(),
        'cuda': torch.version.cuda if GPU else None,
        'gpu': torch.cuda.get_device_name() if GPU else None,
        'cudnn': torch.backends.cudnn.version() if GPU else None,
        'tf32_matmul': torch.backends.cuda.matmul.allow_tf32,
        'git_commit': git('rev-parse', '--short', 'HEAD'), 'git_dirty': None if status is None else bool(status),
    }
    for var in ('OMP_NUM_THREADS', 'CUDA_VISIBLE_DEVICES', 'PYTORCH_CUDA_ALLOC_CONF', 'CUBLAS_WORKSPACE_CONFIG', 'NCCL_ALGO'):
        env[var] = os.environ.get(var)
    return env
env = capture_env()
assert env['torch'] == torch.__version__ and env['torch_threads'] >= 1
pd.Series(env, name='value').to_frame()

# %% [markdown]
# ## 3. Run-to-run spread
#
# Time the same training step many times, in two blocks separated by a pause. Nothing changes
# between them, so any difference between the blocks is noise (an *A/A test*).

# %%
lab = fresh(0, 'spread')
x, y = lab.batch(4 if not GPU else 16, 128 if not GPU else 512)
model, opt = lab.model, torch.optim.AdamW(lab.model.parameters(), lr=1e-3)
def step():
    _, loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
def block(n):   # n step times in seconds, each clocked with the device synchronized
    return tunekit.measure.time_repeats(step, warmup=0, repeats=n)
block(3)   # warm-up
a = block(20); time.sleep(0.5); b = block(20)
times = a + b
mean, sd = statistics.mean(times), statistics.stdev(times)
cv = sd / mean
aa = statistics.median(a) / statistics.median(b) - 1
print(f'{len(times)} steps: median {statistics.median(times) * 1e3:.1f} ms, mean {mean * 1e3:.1f} ms, '
      f'coefficient of variation {cv:.1%}, min..max {min(times) * 1e3:.1f}..{max(times) * 1e3:.1f} ms')
print(f'A/A test: block A vs block B medians differ by {aa:+.1%} with nothing changed')
assert all(t > 0 for t in times)
fig = go.Figure()
fig.add_scatter(y=[t * 1e3 for t in times], mode='markers+lines', name='step time')
fig.add_vline(x=len(a) - 0.5, line_dash='dot')
fig.update_layout(title='the same step, 40 times (block A | block B)', xaxis_title='step', yaxis_title='ms')
fig


# %% [markdown]
# ## 4. How many repeats does a claim need?
#
# To tell a real relative speed-up `d` from noise with spread `cv` (two-sided 5% error, 80% power,
# comparing two means), each side needs about `n = 2·(1.96 + 0.84)²·(cv/d)²` measurements.

# %%
def repeats_needed(cv, d, z_alpha=1.96, z_power=0.84):
    return max(2, math.ceil(2 * (z_alpha + z_power) ** 2 * (cv / d) ** 2))   # a spread needs 2 samples at least
assert repeats_needed(0.05, 0.05) == 16          # 2 * 2.8^2 = 15.68
assert repeats_needed(0.05, 0.025) == 63         # half the effect: 4x the repeats
effects = [0.01, 0.02, 0.03, 0.05, 0.10, 0.20]
need = {d: repeats_needed(cv, d) for d in effects}
fig = go.Figure(go.Bar(x=[f'{d:.0%}' for d in effects], y=list(need.values()), text=list(need.values())))
fig.update_layout(title=f'repeats per side to detect a speed-up, at the measured cv = {cv:.1%}',
                  xaxis_title='speed-up to detect', yaxis_title='timed steps per variant (log scale)', yaxis_type='log')
fig

# %%
print(f'With the spread measured here (cv {cv:.1%}), a 20% speed-up shows after {need[0.2]} steps per variant, '
      f'a 5% one needs {need[0.05]}, and a 2% one {need[0.02]}.')
print(f'The A/A difference of {abs(aa):.1%} is what noise alone produced: claims smaller than that from a '
      'single pair of runs are not claims.')
aa_by = {'means': statistics.mean(a) / statistics.mean(b) - 1, 'medians': aa, 'best steps': min(a) / min(b) - 1}
print('A/A difference by statistic: ' + ', '.join(f'{k} {v:+.1%}' for k, v in aa_by.items())
      + f'; smallest here with {min(aa_by, key=lambda k: abs(aa_by[k]))}.')
print('A median ignores the occasional slow step that pulls a mean, and contention only adds time, so the best of N '
      'is the least disturbed figure: that is why the chapters use them.'
      + ('' if abs(aa_by['means']) > min(abs(aa_by['medians']), abs(aa_by['best steps'])) else
         ' Here that did not help: load that lasts through a whole block moves every statistic of that block, '
         'which is why the chapters also alternate the variants.'))

# %% [markdown]
# ## Conclusion and exercise
#
# * Same seed, same software, same machine → bitwise-equal losses on CPU. Record the environment
#   with every result.
# * Measure the spread first; it sets how many repeats each comparison needs. On shared machines
#   alternate the variants (A B A B …) so a burst of load hits both.
#
# **Exercise:** set `torch.set_num_threads(1)` and measure the spread again: is a single thread
# slower but steadier?
