"""Writes the chapter notebooks notebooks/02_* ... (outputs stripped, kernelspec python3).

Run: .venv/bin/python tools/make_chapters.py [--out DIR] [02 03 ...]
Without numbers every chapter is written; --out defaults to notebooks/.
Each chapter: a short claim, a live tunekit measurement, a plotly figure, a conclusion computed
from the measured numbers, and assert cells that nbval-lax turns into regression checks.
"""
import argparse
import pathlib

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell

# Every chapter starts the same way: sizes depend on the device, and CPU timings are noisy
# (shared cores), so each measurement is repeated and medians / ratios are what we read.
SETUP = """import math, statistics, time
import torch, tunekit
import plotly.graph_objects as go
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
print("device:", torch.cuda.get_device_name() if GPU else f"cpu ({torch.get_num_threads()} threads)")"""


def median_timer():
    return '''def median_s(fn, repeats=5, warmup=1):
    """Median wall time of fn() over `repeats` runs after `warmup` (device synchronized)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if GPU: torch.cuda.synchronize()
        t0 = time.perf_counter(); fn()
        if GPU: torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)'''


# ---------------------------------------------------------------------------------------------
def ch02():
    return [
        md("# 02 · FLOPs, TFLOPS and MFU\n\n"
           "**Claim.** A multiply-accumulate (MAC) is two FLOPs. Training a decoder costs about "
           "6 FLOPs per parameter per token (2 forward, 4 backward) plus an attention term, so a "
           "step's FLOPs can be *estimated* from the model size, or *counted* by running it. "
           "Dividing by the step time gives TFLOPS; dividing that by the hardware peak gives MFU "
           "(model FLOPs) or HFU (FLOPs actually executed, recomputation included). "
           "MFU is useful to track your own progress, and treacherous to compare across teams.\n\n"
           "*CPU note:* timings on shared cores are noisy; the conclusions below use FLOP counts "
           "(exact) and ratios of medians, never a single timing."),
        code(SETUP + "\nfrom tunekit import formulas as F"),
        md("## 1. MACs vs FLOPs\n\n`(m, k) @ (k, n)` is `m·n` dot products of length `k`: `m·k·n` MACs, "
           "`2·m·k·n` FLOPs. The reverse conversion halves: 100 FLOPs of fused multiply-adds are 50 MACs."),
        code("assert F.macs_to_flops(50) == 100 and F.flops_to_macs(100) == 50\n"
             "assert F.matmul_flops(64, 256, 1024) == 33_554_432   # 2*64*256*1024\n"
             "a, b = torch.randn(64, 256), torch.randn(256, 1024)\n"
             "counted = tunekit.count_flops(lambda: a @ b).executed\n"
             "assert counted == F.matmul_flops(64, 256, 1024)\n"
             "print(f'torch counts {counted:,} FLOPs for the (64,256)@(256,1024) matmul = {F.flops_to_macs(counted):,.0f} MACs')"),
        md("## 2. The estimate formula and the documents' worked example\n\n"
           "`TFLOPS ≈ model_size_B · 4 · 2 · seqlen · GBS / (step_s · n_gpus · 1e3)`. The `2` is "
           "FLOPs per MAC, `3` = forward + 2× backward, `4` adds the recomputed forward of "
           "activation checkpointing. The documents' example: a 52B model, 64 GPUs, GBS 1024, "
           "seqlen 2048, 127 s per iteration."),
        code("hw = F.estimate_tflops(52, seq_len=2048, global_batch=1024, step_s=127, n_gpus=64, recompute=True)\n"
             "model = F.estimate_tflops(52, seq_len=2048, global_batch=1024, step_s=127, n_gpus=64, recompute=False)\n"
             "print(f'hardware-FLOPs estimate (factor 4): {hw:.1f} TFLOPS per GPU')\n"
             "print(f'model-FLOPs estimate (factor 3):    {model:.1f} TFLOPS per GPU')\n"
             "a100 = tunekit.peak_tflops('NVIDIA A100-SXM4-80GB', 'bf16')   # 312, dense\n"
             "print(f'against the A100 bf16 peak of {a100:.0f}: HFU {hw / a100:.1%}, MFU {model / a100:.1%}')\n"
             "assert round(hw, 2) == 107.33    # 52*4*2*2048*1024 / (127*64*1e3)\n"
             "assert abs(hw / model - 4 / 3) < 1e-12"),
        md("## 3. Counting automatically with `%%gpuprofile`\n\n"
           "The estimate ignores attention and anything architecture-specific. tunekit counts the "
           "FLOPs that actually execute (torch's `FlopCounterMode`, plus the CPU attention kernel torch "
           "misses and a causal-mask correction). Counting slows the run, so the first run of a cell "
           "only counts; the re-run reuses the count and reports TFLOPS and MFU from a clean clock."),
        code("%load_ext tunekit\n"
             "cfg = (tunekit.GPTConfig(n_layer=8, n_head=8, n_embd=512, block_size=512) if GPU\n"
             "       else tunekit.GPTConfig.preset('cpu-small'))\n"
             "batch, seq = (16, 512) if GPU else (4, 128)\n"
             "torch.manual_seed(0)\n"
             "net = tunekit.GPT(cfg).to(device)\n"
             "opt = torch.optim.AdamW(net.parameters(), lr=1e-3)\n"
             "x = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)\n"
             "y = torch.roll(x, -1, 1)\n"
             "def step():\n"
             "    _, loss = net(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)\n"
             "step()   # warm-up: allocate optimizer states outside the measurement\n"
             "N = net.num_params()\n"
             "print(f'{N:,} matmul parameters, batch {batch} x seq {seq}')"),
        code("%%gpuprofile -n train_step\nfor _ in range(2):\n    step()"),
        code("%%gpuprofile -n train_step\nfor _ in range(2):\n    step()"),
        code("rec = tunekit.last()\n"
             "per_token_formula = F.train_flops_per_token(N, cfg.n_layer, cfg.n_embd, seq, causal=True)\n"
             "formula_step = 2 * batch * seq * per_token_formula\n"
             "print(f'counted : {rec.flops:.3e} FLOPs ({rec.flops_source}) for 2 steps')\n"
             "print(f'formula : {formula_step:.3e} FLOPs = 2 steps x {batch*seq} tokens x (6N + causal attention)')\n"
             "print(f'ratio counted/formula = {rec.flops/formula_step:.3f}')\n"
             "print(f'{rec.tflops:.3f} TFLOPS, MFU {rec.mfu:.1%} of {rec.peak_tflops:.3g} TFLOPS ({rec.peak_source})')\n"
             "if rec.mfu > 1:\n"
             "    print('MFU above 100% means the peak is too low: it was calibrated while other work shared the cores. '\n"
             "          'Run tunekit.calibrate(force=True) on a quiet machine and re-run the profile.')\n"
             "assert rec.flops_source == 'cached' and rec.flops > 0 and rec.wall_s > 0\n"
             "assert 0.95 < rec.flops / formula_step < 1.10"),
        md("The count and the formula agree to a few percent. The count is slightly higher because "
           "torch charges the attention backward as 10 FLOP units against the forward's 4 (it recomputes "
           "the scores), where `12·L·h·s` assumes exactly 2× the forward. Now watch the attention term grow "
           "with the sequence length: counting needs no timing, so this sweep is exact even on noisy cores."),
        code("rows = []\n"
             "for s in sorted({32, 64, 128, 256, cfg.block_size}):   # on CPU block_size is 256 itself\n"
             "    xs = torch.randint(0, cfg.vocab_size, (1, s), device=device)\n"
             "    fc = tunekit.count_flops(lambda: net(xs, xs)[1].backward())\n"
             "    net.zero_grad(set_to_none=True)\n"
             "    rows.append(dict(seq=s, counted=fc.executed / s, six_n=6 * N,\n"
             "                     formula=F.train_flops_per_token(N, cfg.n_layer, cfg.n_embd, s)))\n"
             "fig = go.Figure()\n"
             "fig.add_scatter(x=[r['seq'] for r in rows], y=[r['counted'] / 1e6 for r in rows], name='counted (tunekit)')\n"
             "fig.add_scatter(x=[r['seq'] for r in rows], y=[r['formula'] / 1e6 for r in rows], name='6N + causal attention', line_dash='dash')\n"
             "fig.add_scatter(x=[r['seq'] for r in rows], y=[r['six_n'] / 1e6 for r in rows], name='6N only', line_dash='dot')\n"
             "fig.update_layout(title='training FLOPs per token vs sequence length', xaxis_title='sequence length',\n"
             "                  yaxis_title='MFLOP per token', xaxis_type='log')\n"
             "fig"),
        code("attn_share = 1 - rows[-1]['six_n'] / rows[-1]['counted']\n"
             "print(f'at seq {rows[-1][\"seq\"]} attention is {attn_share:.1%} of the counted FLOPs; '\n"
             "      f'at seq {rows[0][\"seq\"]} it is {1 - rows[0][\"six_n\"] / rows[0][\"counted\"]:.1%}')\n"
             "assert rows[-1]['counted'] > rows[0]['counted'] > 6 * N"),
        md("## 4. MFU vs HFU: the Megatron-LM numbers\n\n"
           "Megatron-LM published these A100-80GB figures with activation recomputation on. HFU counts the "
           "recomputed FLOPs, MFU does not, so HFU ≥ MFU. Full recomputation would make HFU/MFU = 4/3; "
           "Megatron's small gap shows it recomputed selectively (only the cheap-to-redo attention parts)."),
        code("import pandas as pd\n"
             "meg = pd.DataFrame({'model': ['22B', '175B', '530B', '1T'],\n"
             "                    'MFU': [41.5, 51.4, 56.0, 56.3], 'HFU': [43.7, 52.8, 57.0, 57.0]})\n"
             "meg['HFU/MFU'] = (meg.HFU / meg.MFU).round(3)\n"
             "assert (meg.HFU >= meg.MFU).all() and (meg['HFU/MFU'] < 4 / 3).all()\n"
             "fig = go.Figure([go.Bar(name='MFU %', x=meg.model, y=meg.MFU), go.Bar(name='HFU %', x=meg.model, y=meg.HFU)])\n"
             "fig.update_layout(barmode='group', title='Megatron-LM on A100-80GB (published)', yaxis_title='% of 312 TFLOPS')\n"
             "display(meg); fig"),
        md("## 5. Why MFU comparisons across teams mislead\n\n"
           "Take **one** measured run and compute “MFU” the ways different write-ups do: which FLOPs "
           "(6N only, nanoGPT's non-causal attention, counted), which clock (compute only, or the whole "
           "iteration including fetching the batch), which peak. Same hardware, same code, different numbers."),
        code(median_timer() + "\n"
             "def fetch():   # a stand-in data pipeline: tokens built on the host, copied to the device\n"
             "    xb = torch.randint(0, cfg.vocab_size, (batch, seq)).to(device)\n"
             "    return xb, torch.roll(xb, -1, 1)\n"
             "def step_with_data():\n"
             "    xb, yb = fetch(); _, loss = net(xb, yb); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)\n"
             "t_step, t_iter = median_s(step), median_s(step_with_data)\n"
             "peak = rec.peak_tflops          # the same peak the profile used\n"
             "tok = batch * seq\n"
             "fl_counted = rec.flops / 2      # one step\n"
             "variants = {\n"
             "    '6N, compute clock': 6 * N * tok / t_step,\n"
             "    '6N + full attention (nanoGPT), compute clock': F.train_flops_per_token(N, cfg.n_layer, cfg.n_embd, seq, causal=False) * tok / t_step,\n"
             "    'counted, compute clock': fl_counted / t_step,\n"
             "    'counted, whole-iteration clock': fl_counted / t_iter,\n"
             "}\n"
             "mfu = {k: v / 1e12 / peak for k, v in variants.items()}\n"
             "fig = go.Figure(go.Bar(x=[v * 100 for v in mfu.values()], y=list(mfu), orientation='h'))\n"
             "fig.update_layout(title=f'one run, four \"MFU\"s (peak {peak:.3g} TFLOPS, median of 5)', xaxis_title='MFU %')\n"
             "assert all(v > 0 for v in mfu.values())\n"
             "fig"),
        code("spread = max(mfu.values()) / min(mfu.values())\n"
             "h100_fp32, h100_bf16 = tunekit.peak_tflops('NVIDIA H100 80GB HBM3', 'fp32'), tunekit.peak_tflops('NVIDIA H100 80GB HBM3', 'bf16')\n"
             "print(f'Same run, same machine: the reported MFU ranges from {min(mfu.values()):.1%} to {max(mfu.values()):.1%} '\n"
             "      f'({spread:.2f}x) depending only on bookkeeping.')\n"
             "print(f'The peak matters even more: an H100 is {h100_bf16:.0f} TFLOPS in bf16 but {h100_fp32:.0f} in fp32, '\n"
             "      f'so the fp32 parts of a mixed-precision run, scored against the bf16 peak, look {h100_bf16/h100_fp32:.0f}x less efficient than they are.')\n"
             "fetch = t_iter / t_step - 1\n"
             "print(f'On this {device} the fetch changed the median step by {fetch:+.0%}: ' + (\n"
             "      'within the noise of two separate timings, so here the clock choice barely matters; with a slow '\n"
             "      'pipeline (chapter 09) it is the largest of these effects.' if abs(fetch) < 0.05 else\n"
             "      'the whole-iteration clock sees the data pipeline, the compute clock does not.'))\n"
             "assert spread > 1"),
        md("## Conclusion and exercise\n\n"
           "* FLOP counts are exact and machine-independent; the formula is a good first estimate and "
           "the counter catches what the formula leaves out (attention, causal masking, recomputation).\n"
           "* TFLOPS and MFU depend on the clock and the peak. On CPU the peak is a *measured* matmul "
           "maximum (`tunekit.calibrate`), so CPU MFU is not comparable to the 40–57% GPU figures above; and if the calibration ran while other jobs shared the cores, the peak is low and MFU can even exceed 100%.\n"
           "* Compare MFU only with numbers computed the same way — ideally your own, before and after a change.\n\n"
           "**Exercise:** set `seq = cfg.block_size` in the setup cell and re-run section 3: how does the "
           "gap between counted FLOPs and `6N` change, and does MFU move?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch03():
    return [
        md("# 03 · Anatomy of training memory\n\n"
           "**Claim.** Training memory is weights + gradients + optimizer states (static, proportional "
           "to the parameter count: 18 bytes/param for mixed precision with AdamW) plus activations "
           "saved for backward (proportional to batch × sequence length) plus temporaries. On a GPU add "
           "the CUDA context (0.5–2 GB that torch's allocator never sees), `torch.distributed` buffers "
           "(~1–2 GB) and fragmentation. We estimate each line, then measure it on a live model."),
        code(SETUP + "\nfrom tunekit import anatomy\nimport pandas as pd\nGiB = 2**30"),
        md("## 1. Bytes per parameter\n\nThe static lines depend only on precision and optimizer:"),
        code("combos = [('fp32', 'adamw'), ('mixed', 'adamw'), ('amp', 'adamw'), ('bf16', 'adamw'),\n"
             "          ('mixed', 'sgd'), ('mixed', 'adamw-8bit')]\n"
             "table = pd.DataFrame([{'precision': p, 'optimizer': o, **anatomy.bytes_per_param(p, o)} for p, o in combos])\n"
             "table['total B/param'] = table[['weights', 'master_weights', 'gradients', 'optimizer_states']].sum(axis=1)\n"
             "assert table.set_index(['precision', 'optimizer']).loc[('mixed', 'adamw'), 'total B/param'] == 18   # 2+4+4+8\n"
             "assert table.set_index(['precision', 'optimizer']).loc[('fp32', 'adamw'), 'total B/param'] == 16   # 4+4+8\n"
             "table"),
        md("Mixed precision costs *more* static memory than fp32 (an extra half-precision copy of the "
           "weights); its wins are speed and smaller activations. For a 7B model the 18 B/param alone is:"),
        code("print(f'7B x 18 B = {7e9 * 18 / 1e9:.0f} GB = {7e9 * 18 / GiB:.0f} GiB, before a single activation')\n"
             "assert 7e9 * 18 / 1e9 == 126"),
        md("## 2. Activations: the documents' 147M-parameter example\n\n"
           "Korthikanti et al.: activations without recomputation take `s·b·h·L·(10 + 24/t + 5·a·s/(h·t))` "
           "bytes. For GPT with L=12, h=768, a=12, s=512 that is 333 MiB *per sample*; at micro-batch 64 it "
           "dwarfs the weights. The printed example also double-counts the fp32 copy (20 B/param); "
           "`worked_example_147m` shows the three readings side by side."),
        code("ex = anatomy.worked_example_147m(64)\n"
             "per_sample = anatomy.korthikanti_activation_bytes(s=512, b=1, h=768, n_layer=12, a=12)\n"
             "assert per_sample == 512 * 768 * 12 * (10 + 24 + 5 * 12 * 512 / 768)   # = 349175808\n"
             "summary = pd.DataFrame({k: {'static GiB': e.static_bytes / GiB, 'activations GiB': e['activations'] / GiB,\n"
             "                            'total GiB': e.total_bytes / GiB} for k, e in ex.items()}).T.round(2)\n"
             "summary"),
        md("## 3. Estimated vs measured on a live model\n\n"
           "`tunekit.measure_memory` runs one real training step and measures each component: parameter "
           "and gradient storage, optimizer state tensors, and every tensor autograd saved for backward. "
           "`estimate_memory` predicts the same lines tensor by tensor for tunekit's GPT."),
        code("lab = tunekit.Lab(preset='cpu-small' if not GPU else 'gpt2-124m')\n"
             "seq = 128 if not GPU else 512\n"
             "rep = tunekit.measure_memory(lab, micro_batch=4, seq_len=seq)\n"
             "frame = rep.to_frame()\n"
             "display(frame.style.format({'estimated_bytes': '{:,.0f}', 'measured_bytes': '{:,.0f}', 'error': '{:+.1%}'}))\n"
             "rep.figure()"),
        code("meas = rep.measured\n"
             "static = meas['weights'] + meas['gradients'] + meas['optimizer_states']\n"
             "assert meas['weights'] > 0 and meas['activations'] > 0\n"
             "assert abs(meas['optimizer_states'] / meas['weights'] - 2) < 0.01   # AdamW: two fp32 moments per fp32 weight\n"
             "print(f'static (weights+grads+AdamW) {static / 2**20:.1f} MiB = {static / lab.model.num_params(False):.1f} B/param; '\n"
             "      f'activations {meas[\"activations\"] / 2**20:.1f} MiB at micro-batch 4')\n"
             "worst = frame['error'].abs().max()\n"
             "print(f'largest estimate error over the components: {worst:.1%}')"),
        md("## 4. Activations scale with the batch; static memory does not\n\n"
           "Measure the activation bytes at a few micro-batch sizes and compare with the estimate. "
           "The crossover — where activations overtake weights + gradients + optimizer — is where "
           "checkpointing (chapter 05) starts to pay."),
        code("mbs = [1, 2, 4, 8]\n"
             "acts = [tunekit.measure_memory(lab, micro_batch=b, seq_len=seq).measured['activations'] for b in mbs]\n"
             "est = [tunekit.estimate_memory(lab.model, micro_batch=b, seq_len=seq, precision='fp32', device='cpu')['activations'] for b in mbs]\n"
             "fig = go.Figure()\n"
             "fig.add_scatter(x=mbs, y=[a / 2**20 for a in acts], name='activations measured', mode='lines+markers')\n"
             "fig.add_scatter(x=mbs, y=[e / 2**20 for e in est], name='activations estimated', line_dash='dash')\n"
             "fig.add_scatter(x=mbs, y=[static / 2**20] * len(mbs), name='weights+grads+AdamW', line_dash='dot')\n"
             "fig.update_layout(title=f'memory vs micro-batch (seq {seq})', xaxis_title='micro-batch', yaxis_title='MiB (2^20 bytes)')\n"
             "fig"),
        code("per_sample_meas = (acts[-1] - acts[0]) / (mbs[-1] - mbs[0])\n"
             "cross = static / per_sample_meas\n"
             "print(f'each extra sample adds {per_sample_meas / 2**20:.2f} MiB of activations; '\n"
             "      f'activations pass the static {static / 2**20:.1f} MiB at a micro-batch of about {cross:.1f}')\n"
             "assert acts == sorted(acts) and acts[-1] > acts[0]\n"
             "assert abs(acts[-1] / acts[0] - mbs[-1] / mbs[0]) / (mbs[-1] / mbs[0]) < 0.15   # close to linear"),
        md("## 5. What the allocator does not show: CUDA context, fragmentation\n\n"
           "On a GPU, `nvidia-smi` reports more than `torch.cuda.memory_allocated()`: the CUDA context and "
           "kernels (0.5–2 GB, lazily loaded), NCCL buffers, and memory the caching allocator *reserved* "
           "but split into pieces too small to reuse (fragmentation). "
           "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lets segments grow instead of fragmenting; "
           "it must be set before the first CUDA allocation (in the shell, or `os.environ` before "
           "`import torch`)."),
        code("import os\n"
             "print('PYTORCH_CUDA_ALLOC_CONF =', os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset: default allocator)'))\n"
             "if GPU:\n"
             "    free, total = torch.cuda.mem_get_info()\n"
             "    used, reserved, alloc = total - free, torch.cuda.memory_reserved(), torch.cuda.memory_allocated()\n"
             "    print(f'driver sees {used / GiB:.2f} GiB used; torch reserved {reserved / GiB:.2f}, allocated {alloc / GiB:.2f}')\n"
             "    print(f'outside torch (context, kernels, other libraries): {(used - reserved) / GiB:.2f} GiB; '\n"
             "          f'reserved but not allocated (cache + fragmentation): {(reserved - alloc) / GiB:.2f} GiB')\n"
             "    print(rep.to_frame().tail(len(rep.cuda)))\n"
             "else:\n"
             "    print('CPU run: there is no CUDA context and no caching allocator, so this section only applies on a GPU.')\n"
             "    print('notes from measure_memory:', *rep.notes, sep='\\n  ')"),
        md("## Conclusion and exercise\n\n"
           "* The static part is predictable to the byte: count parameters, multiply by bytes/param.\n"
           "* Activations are the variable part: linear in micro-batch (and in sequence length, plus a "
           "quadratic term for non-fused attention). The estimate tracks the measurement closely for this model.\n"
           "* On CPU the numbers are real tensor sizes, so the anatomy carries over to a GPU; what CPU cannot show "
           "is the CUDA context, NCCL and fragmentation overhead, so leave 1–3 GB of headroom there.\n\n"
           "**Exercise:** re-run section 3 with `precision='bf16'` in `measure_memory`: which lines shrink, "
           "and why do the weights stay fp32?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch04():
    return [
        md("# 04 · Batch sizes and gradient accumulation\n\n"
           "**Claim.** The global batch (samples per optimizer step) is `GBS = MBS · DP · GAS`: micro-batch "
           "per device × data-parallel replicas × gradient-accumulation steps, with `DP = N_GPUs / (TP · PP)`. "
           "Make the micro-batch as large as memory allows (bigger matmuls run closer to peak), then reach "
           "the GBS you want with accumulation: same math per optimizer step, less memory, fewer optimizer "
           "steps and fewer gradient all-reduces."),
        code(SETUP + "\nfrom tunekit import formulas as F\nimport pandas as pd"),
        md("## 1. The arithmetic, with the documents' examples"),
        code("assert F.global_batch_size(micro_batch=4, dp=8) == 32                 # 8 GPUs, MBS 4\n"
             "dp = F.data_parallel_size(8, tp=2, pp=2)\n"
             "assert dp == 2 and F.global_batch_size(4, dp) == 8                     # TP=2, PP=2 -> 2 replicas\n"
             "assert F.global_batch_size(4, dp=F.data_parallel_size(8), grad_accum=4) == 128\n"
             "try:\n    F.data_parallel_size(8, tp=3)\nexcept ValueError as e:\n    print('refused:', e)"),
        md("## 2. Same global batch, different splits\n\n"
           "We train the live model with a fixed GBS of 8 sequences split four ways: MBS 1 × GAS 8 … "
           "MBS 8 × GAS 1. The work per optimizer step is identical; only the shape of the matmuls, the "
           "number of kernel launches and the activation memory change. Runs alternate and repeat, and we "
           "read the *fastest* step of each: on shared cores, contention only ever adds time, so the minimum is the most repeatable estimate."),
        code("lab = tunekit.Lab(preset='gpt2-124m' if GPU else 'cpu-tiny')\n"
             "GBS, seq = 8, (512 if GPU else 128)\n"
             "splits = [(1, 8), (2, 4), (4, 2), (8, 1)]\n"
             "lab.run(steps=1, warmup=1, micro_batch=2, grad_accum=1, seq_len=seq)   # warm caches, calibrate peak\n"
             "runs = {s: [] for s in splits}\n"
             "for _ in range(2):\n"
             "    for mb, ga in splits:\n"
             "        runs[(mb, ga)].append(lab.run(steps=3, warmup=1, micro_batch=mb, grad_accum=ga, seq_len=seq))\n"
             "rows = []\n"
             "for (mb, ga), rs in runs.items():\n"
             "    rows.append(dict(micro_batch=mb, grad_accum=ga, gbs=mb * ga,\n"
             "                     tokens_per_s=rs[0].tokens_per_step / min(r.step_s_min for r in rs),   # best step of 6\n"
             "                     saved_MiB=rs[-1].saved_bytes / 2**20,\n"
             "                     static_MiB=(rs[-1].params_bytes + rs[-1].grads_bytes + rs[-1].optimizer_bytes) / 2**20))\n"
             "def noise_check(groups):   # groups: repeated RunResults of one setting each\n"
             "    worst = max(max(r.step_s_min for r in rs) / min(r.step_s_min for r in rs) for rs in groups)\n"
             "    print(f'repeat agreement: the two runs of one setting differ by up to {worst - 1:.0%}', '-> the machine was busy; '\n"
             "          'rerun this cell before trusting small differences' if worst > 1.2 else '-> stable enough to compare')\n"
             "    return worst\n""noise_check(runs.values())\n"
             "df = pd.DataFrame(rows)\n"
             "assert (df.gbs == GBS).all() and (df.tokens_per_s > 0).all()\n"
             "df.round(2)"),
        code("from plotly.subplots import make_subplots\n"
             "fig = make_subplots(specs=[[{'secondary_y': True}]])\n"
             "labels = [f'MBS {m} x GAS {g}' for m, g in splits]\n"
             "fig.add_bar(x=labels, y=df.tokens_per_s, name='tokens/s (best step)')\n"
             "fig.add_scatter(x=labels, y=df.saved_MiB, name='activations saved per micro-batch (MiB)', secondary_y=True, mode='lines+markers')\n"
             "fig.update_layout(title=f'GBS {GBS} at seq {seq}: throughput and activation memory')\n"
             "fig.update_yaxes(title_text='tokens/s', secondary_y=False)\n"
             "fig.update_yaxes(title_text='MiB (2^20 bytes)', secondary_y=True)\n"
             "fig"),
        code("speedup = df.tokens_per_s.iloc[-1] / df.tokens_per_s.iloc[0]\n"
             "mem_ratio = df.saved_MiB.iloc[-1] / df.saved_MiB.iloc[0]\n"
             "print(f'MBS 8 x GAS 1 runs at {speedup:.2f}x the tokens/s of MBS 1 x GAS 8 and holds {mem_ratio:.1f}x the activations per micro-batch.')\n"
             "best_split = labels[int(df.tokens_per_s.idxmax())]\n"
             "print(f'fastest split here: {best_split}. ' + ('As on a GPU, the biggest micro-batch won.' if best_split == labels[-1] else\n"
             "      'Unlike on a GPU, the biggest micro-batch did not win: 2 CPU cores are already saturated by small matmuls, '\n"
             "      'and larger activations spill out of the CPU caches.'))\n"
             "print(f'Static memory (weights+grads+AdamW) is {df.static_MiB.iloc[0]:.1f} MiB in every split: accumulation does not touch it.')\n"
             "assert df.saved_MiB.iloc[-1] > df.saved_MiB.iloc[0]"),
        md("On a GPU the gap is usually large: a micro-batch of 1 leaves most of the chip idle. On 2 shared "
           "CPU cores even small matmuls already keep the cores busy, so the gain comes mostly from fewer "
           "Python/kernel launches per sample and may be modest; the memory side of the trade is exact on "
           "both. With data parallelism, GAS also divides the number of gradient all-reduces (each moving "
           "~2× the gradient bytes) — chapter 12 measures that cost."),
        md("## 3. The largest micro-batch that fits\n\n"
           "`lab.find_max_batch_size` grows the micro-batch until a step runs out of memory (on CPU: exceeds a "
           "budget), then bisects, so the answer need not be a power of 2. The global batch must still come out exact: pick a "
           "micro-batch that divides it."),
        code("budget = None if GPU else 96 * 2**20   # CPU: allow 96 MiB above the baseline\n"
             "best = lab.find_max_batch_size(memory_budget_bytes=budget, limit=64, seq_len=seq)\n"
             "print(best)\n"
             "assert best.best is not None and best.best >= 1\n"
             "mbs64 = max(d for d in range(1, min(best.best, 64) + 1) if 64 % d == 0)   # GBS = MBS x GAS must come out exact\n"
             "print(f'largest micro-batch: {best.best}. For GBS 64 on one device: MBS {mbs64} x GAS {64 // mbs64}'\n"
             "      + ('' if mbs64 == best.best else f' (MBS {best.best} x GAS {math.ceil(64 / best.best)} would give GBS {best.best * math.ceil(64 / best.best)}, not 64)'))"),
        md("## Conclusion and exercise\n\n"
           "* `GBS = MBS · DP · GAS` fixes the optimization; how you split it is a performance choice.\n"
           "* Bigger micro-batches cost activation memory linearly and buy throughput until the device is saturated.\n"
           "* Accumulation keeps the GBS when memory runs out, and in data parallelism cuts communication.\n\n"
           "**Exercise:** open `lab.dashboard()` (chapter 01) and find the smallest micro-batch that reaches "
           "90% of the best tokens/s on your machine."),
    ]


# ---------------------------------------------------------------------------------------------
def ch05():
    return [
        md("# 05 · Activation checkpointing: memory saved vs time paid\n\n"
           "**Claim.** Checkpointing drops the activations inside a block and recomputes them in backward: "
           "one extra forward, so about 20–25% (up to 30–40%) less throughput, in exchange for most of the "
           "activation memory — which can then buy a 2–4× larger micro-batch. Splitting `L` layers into "
           "`√L` segments minimizes what must be stored."),
        code(SETUP + "\nimport pandas as pd\nfrom torch.utils.checkpoint import checkpoint_sequential"),
        md("## 1. On the live GPT\n\nSame model, same batch, checkpointing off and on, alternated and repeated."),
        code("lab = tunekit.Lab(preset='gpt2-124m' if GPU else 'cpu-small')\n"
             "mb, seq = (8, 512) if GPU else (4, 128)\n"
             "lab.run(steps=1, warmup=1, micro_batch=mb, seq_len=seq)   # warm-up + peak calibration\n"
             "res = {False: [], True: []}\n"
             "for _ in range(2):\n"
             "    for ck in (False, True):\n"
             "        res[ck].append(lab.run(steps=3, warmup=1, micro_batch=mb, seq_len=seq, checkpointing=ck))\n"
             "base, ckpt = res[False][-1], res[True][-1]\n"
             "t_base = min(r.step_s_min for r in res[False])   # best of 6 steps: contention only adds time\n"
             "t_ckpt = min(r.step_s_min for r in res[True])\n"
             "table = pd.DataFrame({'checkpointing': ['off', 'on'], 'best step_s': [t_base, t_ckpt],\n"
             "                      'saved activations MiB': [base.saved_bytes / 2**20, ckpt.saved_bytes / 2**20],\n"
             "                      'executed GFLOP/step': [base.flops_per_step / 1e9, ckpt.flops_per_step / 1e9],\n"
             "                      'HFU/MFU': [base.hfu / base.mfu, ckpt.hfu / ckpt.mfu]})\n"
             "def noise_check(groups):   # groups: repeated RunResults of one setting each\n"
             "    worst = max(max(r.step_s_min for r in rs) / min(r.step_s_min for r in rs) for rs in groups)\n"
             "    print(f'repeat agreement: the two runs of one setting differ by up to {worst - 1:.0%}', '-> the machine was busy; '\n"
             "          'rerun this cell before trusting small differences' if worst > 1.2 else '-> stable enough to compare')\n"
             "    return worst\n""noise_check(res.values())\n"
             "assert ckpt.saved_bytes < base.saved_bytes and ckpt.flops_per_step > base.flops_per_step\n"
             "table.round(4)"),
        code("from plotly.subplots import make_subplots\n"
             "fig = make_subplots(rows=1, cols=2, subplot_titles=['saved activations (MiB)', 'step time (ms, best of 6)'])\n"
             "fig.add_bar(x=['off', 'on'], y=[base.saved_bytes / 2**20, ckpt.saved_bytes / 2**20], row=1, col=1, showlegend=False)\n"
             "fig.add_bar(x=['off', 'on'], y=[t_base * 1e3, t_ckpt * 1e3], row=1, col=2, showlegend=False)\n"
             "fig.update_xaxes(title_text='checkpointing')\n"
             "fig.update_yaxes(title_text='MiB (2^20 bytes)', row=1, col=1); fig.update_yaxes(title_text='ms', row=1, col=2)\n"
             "fig.update_layout(title='checkpointing: memory saved vs time paid')\n"
             "fig"),
        code("mem_saved = 1 - ckpt.saved_bytes / base.saved_bytes\n"
             "time_paid = t_ckpt / t_base - 1\n"
             "extra_flops = ckpt.flops_per_step / base.flops_per_step - 1\n"
             "print(f'checkpointing saved {mem_saved:.0%} of the activations and cost {time_paid:+.0%} step time '\n"
             "      f'for {extra_flops:+.0%} executed FLOPs (the recomputed forward).')\n"
             "print(f'HFU/MFU with checkpointing = {ckpt.hfu / ckpt.mfu:.2f}; without = {base.hfu / base.mfu:.2f}')\n"
             "print('The documents expect 20-25% slower (recent papers: up to 30-40%); this run ' + (\n"
             "      'is within that range.' if 0.2 <= time_paid <= 0.4 else\n"
             "      'paid less: the recompute skips what backward does not need, and the logits and loss outside the checkpointed blocks are not redone.' if time_paid < 0.2 else\n"
             "      'paid more: on shared CPU cores a burst of load inflates one variant (check the repeat agreement above), and a tiny model spends relatively more time outside matmuls.'))"),
        md("The extra FLOPs are below 33% (a full second forward) because torch's non-reentrant checkpoint "
           "recomputes only what backward needs. What does the saved memory buy? The largest micro-batch that "
           "fits a fixed budget, with and without:"),
        code("budget = None if GPU else 64 * 2**20\n"
             "fit_off = lab.find_max_batch_size(memory_budget_bytes=budget, limit=64, seq_len=seq, checkpointing=False).best\n"
             "fit_on = lab.find_max_batch_size(memory_budget_bytes=budget, limit=64, seq_len=seq, checkpointing=True).best\n"
             "print(f'largest micro-batch: {fit_off} without, {fit_on} with checkpointing ({fit_on / fit_off:.1f}x)')\n"
             "assert fit_on >= fit_off >= 1"),
        md("## 2. Where to put the checkpoints: √L segments\n\n"
           "Split `L` equal layers into `k` segments and keep only each segment's input. Backward "
           "recomputes one segment at a time, so memory ≈ `k` stored inputs + `L/k` layers of one segment, "
           "minimal at `k = √L`. We measure it on a stack of 16 Linear+ReLU layers with "
           "`torch.utils.checkpoint.checkpoint_sequential` (which never checkpoints its last segment, so "
           "the tally at the end of forward is exactly `k` inputs + `L/k` layers)."),
        code("L, width, rows_ = 16, (1024 if GPU else 256), (4096 if GPU else 512)\n"
             "stack = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(L)]).to(device)\n"
             "class Segmented(torch.nn.Module):\n"
             "    def __init__(self, k):\n"
             "        super().__init__(); self.stack, self.k = stack, k\n"
             "    def forward(self, x):\n"
             "        return self.stack(x) if self.k == 1 else checkpoint_sequential(self.stack, self.k, x, use_reentrant=False)\n"
             "xin = torch.randn(rows_, width, device=device)\n"
             "act_bytes = xin.numel() * xin.element_size()   # one layer's saved tensor\n"
             "ks = [1, 2, 4, 8, 16]\n"
             "seg = []\n"
             "for k in ks:\n"
             "    saved = tunekit.measure_memory(Segmented(k), (xin,), estimate=False).measured['activations']\n"
             "    seg.append(dict(segments=k, saved_MiB=saved / 2**20, model_MiB=(k + L / k) * act_bytes / 2**20))\n"
             "best = {k: math.inf for k in ks}\n"
             "for _ in range(4):   # interleave the variants so a burst of load hits them all; keep each one's fastest\n"
             "    for k in ks:\n"
             "        m = Segmented(k)\n"
             "        best[k] = min(best[k], median_s(lambda: m(xin).sum().backward(), repeats=1))\n"
             "seg = pd.DataFrame(seg).assign(step_ms=[best[k] * 1e3 for k in ks])\n"
             "seg.round(2)".replace("seg = []", median_timer() + "\nseg = []")),
        code("fig = make_subplots(specs=[[{'secondary_y': True}]])\n"
             "fig.add_scatter(x=seg.segments, y=seg.saved_MiB, name='saved activations, measured (MiB)', mode='lines+markers')\n"
             "fig.add_scatter(x=seg.segments, y=seg.model_MiB, name='k + L/k layers (model)', line_dash='dash')\n"
             "fig.add_scatter(x=seg.segments, y=seg.step_ms, name='fwd+bwd ms (best of 4, interleaved)', secondary_y=True, mode='lines+markers')\n"
             "fig.update_layout(title=f'L={L} layers split into k checkpointed segments', xaxis_type='log', xaxis_title='segments k (log scale)')\n"
             "fig.update_yaxes(title_text='MiB (2^20 bytes)', secondary_y=False); fig.update_yaxes(title_text='ms', secondary_y=True)\n"
             "fig".replace("fig = make_subplots", "from plotly.subplots import make_subplots\nfig = make_subplots")),
        code("best_k = int(seg.loc[seg.saved_MiB.idxmin(), 'segments'])\n"
             "print(f'least memory at k = {best_k} segments (sqrt(L) = {math.isqrt(L)}): '\n"
             "      f'{seg.saved_MiB.min():.1f} MiB vs {seg.saved_MiB.iloc[0]:.1f} MiB unsegmented')\n"
             "print(f'time with k = {best_k}: {seg.step_ms[seg.segments == best_k].item() / seg.step_ms.iloc[0]:.2f}x the unsegmented step')\n"
             "assert best_k == math.isqrt(L)\n"
             "assert abs(seg.saved_MiB.iloc[0] - L * act_bytes / 2**20) / seg.saved_MiB.iloc[0] < 0.1"),
        md("## Conclusion and exercise\n\n"
           "* Checkpointing trades recompute (HFU rises above MFU) for activation memory; the win is the bigger "
           "micro-batch the freed memory allows, not the checkpointed step itself.\n"
           "* With `k` segments memory is `k + L/k` layers' worth, lowest at `k = √L`; the time cost is one "
           "recomputed forward of all but the last segment, `(1 − 1/k)` of a forward, so it grows with `k` and saturates.\n\n"
           "**Exercise:** run the live GPT at the micro-batch `fit_on` with checkpointing and compare its tokens/s "
           "with the best run without checkpointing (`fit_off`). Which wins on this machine?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch06():
    return [
        md("# 06 · Optimizers: bytes per parameter and speed\n\n"
           "**Claim.** AdamW keeps two fp32 moments: 8 bytes per parameter, nearly half of the 18 B/param of "
           "mixed-precision training. SGD-with-momentum, Lion and Adafactor keep ~4 bytes, bf16 AdamW 4, and "
           "8-bit AdamW (bitsandbytes) 2. `torch.optim.AdamW(fused=True)` does the same math in one kernel per "
           "parameter group instead of a loop of small ops — faster, same memory."),
        code(SETUP + "\nimport pandas as pd\nfrom tunekit import anatomy"),
        md("## 1. Bytes per parameter (analytic)"),
        code("names = ['adamw', 'adamw-bf16', 'sgd', 'lion', 'adafactor', 'adamw-8bit']\n"
             "bpp = {n: anatomy.optimizer_bytes_per_param(n, 'fp32') for n in names}\n"
             "assert bpp['adamw'] == 8 and bpp['sgd'] == 4 and bpp['adamw-8bit'] == 2 and bpp['adamw-bf16'] == 4\n"
             "n7b = 7e9\n"
             "pd.DataFrame({'B/param': bpp, 'GB for a 7B model': {k: v * n7b / 1e9 for k, v in bpp.items()}})"),
        md("## 2. Measured on the live model\n\nEach available optimizer trains the same model; the Lab reports the "
           "bytes its state tensors hold and the step time (the fastest of 6 steps over alternating runs: on shared cores contention only adds time, so the minimum is the repeatable figure)."),
        code("lab = tunekit.Lab(preset='gpt2-124m' if GPU else 'cpu-small')\n"
             "mb, seq = (8, 512) if GPU else (4, 128)\n"
             "missing = lab.env().unavailable_optimizers   # name -> why it cannot run here\n"
             "for k, why in missing.items(): print(f'skipped {k}: {why}')\n"
             "opts = [o for o in ['adamw', 'adamw_fused', 'sgd', 'adafactor', 'lion', 'adamw_8bit'] if o not in missing]\n"
             "lab.run(steps=1, warmup=1, micro_batch=mb, seq_len=seq)\n"
             "res = {o: [] for o in opts}\n"
             "for _ in range(2):\n"
             "    for o in opts:\n"
             "        res[o].append(lab.run(steps=3, warmup=1, micro_batch=mb, seq_len=seq, optimizer=o))\n"
             "n_params = res['adamw'][-1].n_params\n"
             "df = pd.DataFrame([dict(optimizer=o, state_bytes_per_param=rs[-1].optimizer_bytes / n_params,\n"
             "                        step_ms=1e3 * min(r.step_s_min for r in rs),   # best of 6: contention only adds time\n"
             "                        loss_drop=rs[-1].loss_first - rs[-1].loss) for o, rs in res.items()])\n"
             "def noise_check(groups):   # groups: repeated RunResults of one setting each\n"
             "    worst = max(max(r.step_s_min for r in rs) / min(r.step_s_min for r in rs) for rs in groups)\n"
             "    print(f'repeat agreement: the two runs of one setting differ by up to {worst - 1:.0%}', '-> the machine was busy; '\n"
             "          'rerun this cell before trusting small differences' if worst > 1.2 else '-> stable enough to compare')\n"
             "    return worst\n""noise_check(res.values())\n"
             "assert abs(df.set_index('optimizer').loc['adamw', 'state_bytes_per_param'] - 8) < 0.01\n"
             "df.round(3)"),
        code("from plotly.subplots import make_subplots\n"
             "fig = make_subplots(rows=1, cols=2, subplot_titles=['optimizer state, bytes/param', 'step time, ms (best of 6 steps)'])\n"
             "fig.add_bar(x=df.optimizer, y=df.state_bytes_per_param, row=1, col=1, showlegend=False)\n"
             "fig.add_bar(x=df.optimizer, y=df.step_ms, row=1, col=2, showlegend=False)\n"
             "fig.update_layout(title=f'optimizers on {device}, {n_params:,} parameters')\n"
             "fig"),
        code("d = df.set_index('optimizer')\n"
             "print(f\"measured state: AdamW {d.loc['adamw', 'state_bytes_per_param']:.2f} B/param, \"\n"
             "      f\"SGD {d.loc['sgd', 'state_bytes_per_param']:.2f} B/param -> the analytic 8 and 4.\")\n"
             "if 'adamw_fused' in d.index:\n"
             "    r = d.loc['adamw', 'step_ms'] / d.loc['adamw_fused', 'step_ms']\n"
             "    print(f'fused AdamW: same {d.loc[\"adamw_fused\", \"state_bytes_per_param\"]:.2f} B/param; the whole step runs at {r:.2f}x the speed '\n"
             "          'of the default (foreach) AdamW' + (' - within the noise of shared cores, so no verdict from this run.' if abs(r - 1) < 0.05 else\n"
             "          ' - faster, as expected.' if r > 1 else ' - slower here; rerun the cell to see whether it repeats.'))\n"
             "for o in d.index:\n"
             "    assert d.loc[o, 'step_ms'] > 0\n"
             "if 'adafactor' in d.index:\n"
             "    print(f\"torch's Adafactor holds {d.loc['adafactor', 'state_bytes_per_param']:.3f} B/param, far below the documents' ~4: \"\n"
             "          'it keeps no first moment and factors the second into a row and a column vector per matrix.')\n"
             "print('8-bit AdamW needs bitsandbytes and CUDA:', 'measured above' if 'adamw_8bit' in d.index else 'not run here; the table in section 1 gives its 2 B/param')"),
        md("On this small model the optimizer step is a small share of the whole step, so fused vs foreach moves the "
           "total only a little (and on shared CPU cores that is within noise — compare repeated best-of-N times, not one run). "
           "On a GPU with hundreds of parameter tensors the fused kernel removes hundreds of launches per step. "
           "The memory side is exact: state bytes per parameter match the analytic figures.\n\n"
           "## Conclusion and exercise\n\n"
           "* Optimizer state is the biggest static line after the weights; 8 → 4 → 2 B/param is a real lever for large models, "
           "but the lighter optimizers also train differently — check the loss, not only the memory.\n"
           "* `fused=True` is free speed for AdamW.\n\n"
           "**Exercise:** the `loss_drop` column shows how far each optimizer got in the same few steps at the same lr. "
           "Which optimizer would need a different learning rate?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch07():
    return [
        md("# 07 · Matrix shapes: multiples, tiles, waves\n\n"
           "**Claim.** A GPU computes a GEMM's output in tiles, scheduled in waves over its SMs (108 on an A100). "
           "Dimensions that are not multiples of the tile (and of 8 to 64 elements for tensor cores: 64 on A100 for "
           "the case study) waste part of a tile; a tile count just above a multiple of the SM count adds an almost "
           "empty wave. Hence the sizing rules: vocab divisible by 64, `b·s`, `h/a`, `h/t` with many powers of 2, and "
           "a measured search for SwiGLU's `d_ff` near `8/3·h` — 10922 → 10944 was +46% on an H100."),
        code(SETUP + "\nimport pandas as pd\nfrom tunekit import bench, advisor"),
        md("## 1. Tile and wave quantization, on paper\n\n"
           "Model: an `(m, k) @ (k, n)` output split into 128×256 tiles, 108 SMs each taking one tile per wave "
           "(real kernels pick among several tile shapes, so treat this as the shape of the effect, not a prediction). "
           "Useful fraction = `m·n` / (tiles launched × tile area) × tiles / (waves × 108)."),
        code("def quantized_efficiency(m, n, tile=(128, 256), sms=108):\n"
             "    tm, tn = math.ceil(m / tile[0]), math.ceil(n / tile[1])\n"
             "    tile_eff = m * n / (tm * tile[0] * tn * tile[1])\n"
             "    tiles = tm * tn\n"
             "    wave_eff = tiles / (math.ceil(tiles / sms) * sms)\n"
             "    return tile_eff * wave_eff\n"
             "ns = list(range(1024, 8193, 64))\n"
             "eff = [quantized_efficiency(2048, n) for n in ns]\n"
             "assert quantized_efficiency(128 * 108, 256) == 1.0          # 108 full tiles: one full wave\n"
             "assert quantized_efficiency(128 * 109, 256) < 0.51          # 109 tiles: a second, nearly empty wave\n"
             "fig = go.Figure(go.Scatter(x=ns, y=eff, mode='lines'))\n"
             "fig.update_layout(title='modelled useful fraction, m = 2048, A100-like (108 SMs, 128x256 tiles)',\n"
             "                  xaxis_title='n', yaxis_title='useful fraction of the launched work')\n"
             "fig"),
        md("## 2. Measured: a matmul while one dimension sweeps\n\n"
           "`tunekit.bench.matmul_shape_sweep` times `(m, k) @ (k, n)` for each `n` (median of repeats). On a GPU "
           "expect the saw-tooth above; on a CPU the units are SIMD vectors (8–16 fp32 lanes) and cache lines, "
           "so misaligned sizes cost less but the direction is the same."),
        code("if GPU:\n"
             "    sweep = bench.matmul_shape_sweep('n', values=range(4032, 4161, 4), m=4096, k=4096, dtype='bf16')\n"
             "else:\n"
             "    sweep = bench.matmul_shape_sweep('n', values=range(496, 529), m=256, k=512, repeats=5)\n"
             "aligned = sweep[sweep.n % 16 == 0].tflops.median()\n"
             "odd = sweep[sweep.n % 2 == 1].tflops.median()\n"
             "assert (sweep.tflops > 0).all() and len(sweep) > 10\n"
             "bench.plot(sweep)"),
        code("print(f'median TFLOPS at n divisible by 16: {aligned:.4f}; at odd n: {odd:.4f} -> odd sizes run at {odd / aligned:.0%} of aligned')\n"
             "print('Same direction as the GPU rule, though far fainter.' if odd < 0.95 * aligned else\n"
             "      'No clear penalty here (within 5%): this CPU matmul library pads odd sizes internally, and the noise of shared cores is as large as the effect.')"),
        md("## 3. SwiGLU: search `d_ff` instead of taking 8/3·h\n\n"
           "The documents' H100 search at `h = 4096`: 10922 (=8/3·h) ran at 272.7 TFLOPS, 10944 at 398.4, 11008 "
           "(Llama-2-7B) at 395.0. tunekit proposes the multiples of 64/128/256 nearest to 8/3·h and "
           "`bench.swiglu_dff_search` times the three MLP GEMMs for every candidate."),
        code("doc = pd.DataFrame({'d_ff': [10922, 10944, 11008], 'tflops_H100': [272.73, 398.38, 395.01]})\n"
             "gain = doc.tflops_H100[1] / doc.tflops_H100[0] - 1\n"
             "c = advisor.swiglu_dff_candidates(4096)\n"
             "assert (c['x64'], c['x128'], c['x256']) == (10944, 10880, 11008) and round(gain, 2) == 0.46\n"
             "print(f'documents: 10944 is {gain:.0%} faster than 10922; candidates for h=4096: {c}')\n"
             "h = 4096 if GPU else 256\n"
             "runs_ = [bench.swiglu_dff_search(h, tokens=(4096 if GPU else 256), dtype=('bf16' if GPU else 'fp32'), repeats=5) for _ in range(2)]\n"
             "# best of two full searches per d_ff: a burst of contention on shared cores slows a few candidates, never speeds them up\n"
             "search = pd.concat(runs_).sort_values('tflops', ascending=False).drop_duplicates('d_ff').reset_index(drop=True)\n"
             "search.attrs.update(runs_[0].attrs)\n"
             "assert (search.tflops > 0).all()\n"
             "bench.plot(search)"),
        code("base = search[search.is_baseline].iloc[0]\n"
             "top = search.iloc[0]\n"
             "print(f'h={h}: baseline d_ff={int(base.d_ff)} at {base.tflops:.4f} TFLOPS; fastest d_ff={int(top.d_ff)} at {top.tflops:.4f} '\n"
             "      f'({top.tflops / base.tflops - 1:+.0%}).')\n"
             "print(f'on this {device} the spread over all candidates is {search.tflops.max() / search.tflops.min():.2f}x '\n"
             "      + ('(GPU: alignment dominates).' if GPU else '(CPU: small and partly noise; rerun to see which winners repeat).'))\n"
             "search.head(5)[['d_ff', 'tflops', 'median_s', 'is_baseline']]"),
        md("## 4. Vocabulary padding\n\n"
           "GPT-2's vocabulary of 50257 tokens is a GEMM dimension of the embedding and the output head; padding it to "
           "50304 (a multiple of 64) costs 47 unused rows and keeps the largest GEMM aligned."),
        code("assert advisor.padded_vocab(50257) == 50304\n"
             "hid, toks = (768, 2048) if GPU else (128, 256)\n"
             "dt = torch.bfloat16 if GPU else torch.float32\n"
             "xh = torch.randn(toks, hid, device=device, dtype=dt)\n"
             + "\n".join([]) +
             "times = {}\n"
             "ws = {V: torch.randn(hid, V, device=device, dtype=dt) for V in (50257, 50304)}\n"
             "for _ in range(3):   # alternate the two and keep each one's best median\n"
             "    for V, w in ws.items():\n"
             "        times[V] = min(times.get(V, math.inf), median_s(lambda: xh @ w, repeats=5))\n"
             "speed = {V: 2 * toks * hid * V / t / 1e12 for V, t in times.items()}\n"
             "print(f'lm_head GEMM: vocab 50257 {speed[50257]:.4f} TFLOPS, padded 50304 {speed[50304]:.4f} TFLOPS '\n"
             "      f'(padded does {50304/50257 - 1:.2%} more work and runs {times[50257] / times[50304]:.2f}x as fast)')\n"
             "ratio = times[50257] / times[50304]\n"
             "print('Padding paid off here.' if ratio > 1.05 else\n"
             "      'Within noise here (5%): the CPU has no tensor-core tiles to fill, so the padded GEMM is just 0.09% more work.' if ratio > 0.95 else\n"
             "      'The padded GEMM was slower here: on shared cores that is noise (it does only 0.09% more work); rerun the cell.')\n"
             "assert all(t > 0 for t in times.values())"
             .replace("times = {}", median_timer() + "\ntimes = {}")),
        md("## 5. The sizing rules as a checklist\n\n`tunekit.advise` checks a config against the documents' "
           "recommendations. GPT-2's real shapes pass; an awkward variant does not:"),
        code("good = tunekit.advise(tunekit.GPTConfig.preset('gpt2-124m'), micro_batch=8, seq_len=1024)\n"
             "awkward = dict(vocab_size=50257, n_layer=12, n_head=12, n_embd=780, block_size=1000, mlp='swiglu', d_ff=2080)\n"
             "bad = tunekit.advise(awkward, micro_batch=3, seq_len=1000)   # a plain dict works too\n"
             "print(f'gpt2-124m: {len(good.problems)} problems; awkward variant: {len(bad.problems)} problems')\n"
             "assert len(good.problems) == 0 and len(bad.problems) >= 3\n"
             "bad.to_frame()[['status', 'value', 'recommendation']]"),
        md("## Conclusion and exercise\n\n"
           "* Shape rules are GPU rules: tiles, waves and tensor-core multiples. The modelled saw-tooth and the "
           "published SwiGLU numbers show effects of 10–50%; a CPU shows at most a faint echo, so measure on the "
           "hardware you will train on.\n"
           "* Padding (vocab), rounding (`d_ff`) and choosing heads (`h/a`) cost almost no parameters — "
           "check them before training with `tunekit.advise`.\n\n"
           "**Exercise:** change `h` in section 3 to 384 and 320. Do the x64 candidates still win?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch08():
    return [
        md("# 08 · Attention: math vs SDPA vs flash\n\n"
           "**Claim.** Written out (`softmax(QKᵀ/√d)·V`), attention materializes a `B·heads·T×T` score matrix per "
           "layer and keeps it for backward: memory and memory traffic grow with `T²`. Fused kernels "
           "(`F.scaled_dot_product_attention`, FlashAttention) stream blocks of it through fast on-chip memory and "
           "recompute it in backward, so what they save grows only with `T`. In the documents' case study "
           "FlashAttention-2 alone doubled throughput (8,000 → 16,000 tokens/s)."),
        code(SETUP + "\nimport pandas as pd\nfrom plotly.subplots import make_subplots\n" + median_timer()),
        md("## 1. What the math path must store\n\nOne layer's score matrix in fp32 (bytes = `B·heads·T²·4`), before "
           "counting its masked and softmaxed copies:"),
        code("for T in (1024, 4096, 8192):\n"
             "    print(f'T={T:5d}: {8 * 32 * T * T * 4 / 2**30:7.2f} GiB per layer for B=8, 32 heads')\n"
             "assert 8 * 32 * 4096**2 * 4 == 17_179_869_184   # 16 GiB: one layer at T=4096 would fill a fifth of an 80 GB GPU"),
        md("## 2. Measured over the sequence length\n\n"
           "The same small GPT runs with `attention='math'` and `'sdpa'` (and `'flash'` where flash-attn and a GPU "
           "exist). For each length: activation bytes saved for backward (`tunekit.measure_memory`) and the median "
           "forward+backward time."),
        code("seqs = [256, 512, 1024, 2048] if GPU else [128, 256, 512, 1024]\n"
             "cfg = tunekit.GPTConfig(n_layer=2, n_head=8 if GPU else 4, n_embd=512 if GPU else 128, block_size=max(seqs))\n"
             "B = 8 if GPU else 2\n"
             "torch.manual_seed(0)\n"
             "net = tunekit.GPT(cfg).to(device)\n"
             "amp = torch.autocast('cuda', dtype=torch.bfloat16) if GPU else torch.autocast('cpu', enabled=False)\n"
             "impls = ['math', 'sdpa'] + (['flash'] if GPU else [])\n"
             "rows = []\n"
             "for T in seqs:\n"
             "    x = torch.randint(0, cfg.vocab_size, (B, T), device=device)\n"
             "    for impl in impls:\n"
             "        net.set_attention(impl)\n"
             "        saved = tunekit.measure_memory(net, (x, x), precision='bf16' if GPU else None, estimate=False).measured['activations']\n"
             "        def fb():\n"
             "            with amp:\n"
             "                loss = net(x, x)[1]\n"
             "            loss.backward(); net.zero_grad(set_to_none=True)\n"
             "        t = median_s(fb, repeats=3)\n"
             "        rows.append(dict(seq=T, impl=impl, ran=net.attention_ran, saved_MiB=saved / 2**20, fwd_bwd_ms=t * 1e3))\n"
             "df = pd.DataFrame(rows)\n"
             "assert (df.saved_MiB > 0).all() and (df.fwd_bwd_ms > 0).all()\n"
             "df.round(2)"),
        code("fig = make_subplots(rows=1, cols=2, subplot_titles=['activations saved for backward (MiB)', 'forward+backward (ms, median)'])\n"
             "for impl, g in df.groupby('impl', sort=False):\n"
             "    fig.add_scatter(x=g.seq, y=g.saved_MiB, name=impl, legendgroup=impl, row=1, col=1)\n"
             "    fig.add_scatter(x=g.seq, y=g.fwd_bwd_ms, name=impl, legendgroup=impl, showlegend=False, row=1, col=2)\n"
             "fig.update_xaxes(type='log', title_text='sequence length (log)'); fig.update_yaxes(type='log')   # log-log: slope = growth exponent\n"
             "fig.update_layout(title=f'attention implementations, B={B}, {cfg.n_layer} layers, {cfg.n_head} heads on {device}')\n"
             "fig"),
        code("def growth(impl, col):   # exponent p in value ~ T^p over the last doubling\n"
             "    g = df[df.impl == impl].set_index('seq')[col]\n"
             "    return math.log(g.iloc[-1] / g.iloc[-2], 2)\n"
             "T = seqs[-1]\n"
             "last = df[df.seq == T].set_index('impl')\n"
             "mem_x, time_x = last.loc['math', 'saved_MiB'] / last.loc['sdpa', 'saved_MiB'], last.loc['math', 'fwd_bwd_ms'] / last.loc['sdpa', 'fwd_bwd_ms']\n"
             "print(f\"memory grows like T^{growth('math', 'saved_MiB'):.2f} with math and T^{growth('sdpa', 'saved_MiB'):.2f} with sdpa\")\n"
             "print(f'at T={T}: math keeps {mem_x:.1f}x the activations of sdpa and takes {time_x:.2f}x its time')\n"
             "print('the model reports it ran:', last.loc['sdpa', 'ran'], '| on CPU torch uses its own flash-style kernel; flash-attn itself needs a GPU')\n"
             "assert last.loc['math', 'saved_MiB'] > last.loc['sdpa', 'saved_MiB']\n"
             "assert growth('math', 'saved_MiB') > growth('sdpa', 'saved_MiB')"),
        md("## Conclusion and exercise\n\n"
           "* The math path's memory bends upward (toward `T²`) while the fused path stays close to linear: at long "
           "sequences the score matrices dominate everything else the model saves.\n"
           "* Speed: on a GPU the fused kernel also wins big because attention is memory-bound; on a CPU the gain is "
           "smaller and can even flip at short lengths, since the CPU matmul is compute-bound and the fused kernel "
           "does extra recomputation in backward.\n"
           "* The case study's 2× from FlashAttention-2 came on A100s at long sequences, where both effects peak.\n\n"
           "**Exercise:** in the dashboard (`tunekit.Lab().dashboard()`), switch attention between math and sdpa at "
           "the longest sequence length: how do tokens/s and peak memory move?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch09():
    return [
        md("# 09 · Feeding the model: DataLoader workers, pinned memory, non-blocking copies\n\n"
           "**Claim.** With `num_workers=0` the training loop waits while every batch is loaded and transformed. "
           "Worker processes prepare the next batches while the model computes; the documents' run fell from 5.39 s "
           "(0 workers) to 0.84 s (3 workers), then stopped improving once the workers outpaced the consumer. On a "
           "GPU, `pin_memory=True` (page-locked host buffers) plus `.to(device, non_blocking=True)` lets the copy "
           "overlap compute: 0.646 s → 0.459 s in the documents' A100 test."),
        code(SETUP + "\nimport pandas as pd\nfrom tunekit import bench"),
        md("## 1. Workers\n\n`bench.dataloader_workers` passes over a dataset whose items take 10 ms each to "
           "“transform” (a sleep, like waiting on storage) with 0…4 workers; workers persist between passes, and "
           "the median pass time is reported."),
        code("doc = pd.Series([5.39, 3.90, 1.33, 0.84, 0.88], index=range(5), name='documents_s')\n"
             "w = bench.dataloader_workers(num_workers=(0, 1, 2, 3, 4), n_items=32, batch_size=4, transform_s=0.01, repeats=3)\n"
             "assert (w.median_s > 0).all() and list(w.num_workers) == [0, 1, 2, 3, 4]\n"
             "fig = go.Figure()\n"
             "fig.add_scatter(x=w.num_workers, y=w.speedup_vs_first, name='measured here', mode='lines+markers')\n"
             "fig.add_scatter(x=doc.index, y=doc.iloc[0] / doc, name='documents', mode='lines+markers', line_dash='dash')\n"
             "fig.add_scatter(x=w.num_workers, y=[max(1, n) for n in w.num_workers], name='ideal (n workers)', line_dash='dot')\n"
             "fig.update_layout(title='DataLoader speed-up over num_workers=0', xaxis_title='num_workers', yaxis_title='speed-up (x)')\n"
             "display(w[['num_workers', 'median_s', 'min_s', 'max_s', 'speedup_vs_first']].round(3))\n"
             "fig"),
        code("best = w.loc[w.median_s.idxmin()]\n"
             "print(f'measured: {w.median_s.iloc[0]:.3f} s with 0 workers -> {best.median_s:.3f} s with {int(best.num_workers)} '\n"
             "      f'({best.speedup_vs_first:.1f}x); documents: {doc.iloc[0]:.2f} s -> {doc.min():.2f} s ({doc.iloc[0] / doc.min():.1f}x)')\n"
             "print(f'this machine has {os.cpu_count()} CPUs: a sleeping (I/O-like) transform still overlaps across more workers than cores, '\n"
             "      'but a CPU-heavy transform would stop scaling at the core count, and workers compete with the training step for those cores.')\n"
             "one = w.set_index('num_workers').speedup_vs_first[1]\n"
             "print(f'1 worker: {one:.2f}x. This loop does no compute of its own, so a single worker has nothing to overlap with; '\n"
             "      'the gain comes from several items loading at once.')\n"
             "assert best.speedup_vs_first > 1.5   # sleeps need no CPU, so 4 workers overlap ~4x even on 2 busy cores".replace("print(f'this", "import os\nprint(f'this")),
        md("## 2. Pinned memory × non-blocking copies\n\n"
           "A copy from ordinary (pageable) host memory is staged through a pinned buffer by the driver and blocks the "
           "host; from pinned memory with `non_blocking=True` it is a DMA transfer that overlaps the GPU's work. "
           "The documents' A100 numbers (seconds to feed the same batches):"),
        code("doc_pin = pd.DataFrame({'pin_memory': [True, True, False, False], 'non_blocking': [True, False, True, False],\n"
             "                        'documents_s': [0.459, 0.522, 0.658, 0.646]})\n"
             "assert doc_pin.documents_s.idxmin() == 0   # pinned + non-blocking is fastest\n"
             "meas = bench.pin_memory_non_blocking(n_batches=32 if GPU else 4)\n"
             "doc_pin['measured_s'] = meas.median_s.values\n"
             "doc_pin['case'] = [f'pin={p}, nb={n}' for p, n in zip(doc_pin.pin_memory, doc_pin.non_blocking)]\n"
             "fig = go.Figure(go.Bar(x=doc_pin.case, y=doc_pin.documents_s, name='documents (A100)'))\n"
             "if GPU:\n"
             "    fig.add_bar(x=doc_pin.case, y=doc_pin.measured_s, name='measured here')\n"
             "fig.update_layout(barmode='group', title='pin_memory x non_blocking', yaxis_title='seconds')\n"
             "print('measurement notes:', meas.attrs.get('notes'))\n"
             "fig"),
        code("gain = doc_pin.documents_s.iloc[3] / doc_pin.documents_s.iloc[0]\n"
             "print(f'documents: pinned + non-blocking is {gain:.2f}x faster than neither; '\n"
             "      f'non_blocking without pinning gains nothing ({doc_pin.documents_s.iloc[2]:.3f} vs {doc_pin.documents_s.iloc[3]:.3f} s).')\n"
             "if GPU:\n"
             "    m = doc_pin.measured_s\n"
             "    print(f'measured here: {m.iloc[3] / m.iloc[0]:.2f}x for pinned + non-blocking over neither')\n"
             "else:\n"
             "    assert doc_pin.measured_s.isna().all()   # a figure that cannot be measured is NaN, never 0\n"
             "    print('no GPU here: there is no host-to-device copy to overlap, so the measured column is NaN.')"),
        md("## Conclusion and exercise\n\n"
           "* Workers hide waiting (storage, decoding) behind compute; the gain saturates once data is ready faster "
           "than the model consumes it — more workers then only cost memory and cores.\n"
           "* Pinned memory and non-blocking copies work as a pair; either alone does little.\n\n"
           "**Exercise:** make the transform CPU-bound (replace the sleep in a copy of `SlowDataset` by a busy loop) "
           "and rerun section 1: where does the speed-up stop now, and why?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch10():
    return [
        md("# 10 · Host-side tuning: NUMA affinity, Python's gc, `torch.compile`\n\n"
           "**Claim.** Three settings outside the model: (1) on a multi-socket server, bind each GPU's process to the "
           "CPU cores of the GPU's NUMA node, so host work and data never cross sockets; (2) Python's automatic "
           "garbage collection fires at arbitrary steps, which across hundreds of ranks makes stragglers — disable it "
           "and collect at the same step everywhere; (3) `torch.compile` fuses kernels, but pays a compile time up "
           "front and does not help every model."),
        code(SETUP + "\nimport os\nimport pandas as pd\nimport glob\nfrom tunekit import bench"),
        md("## 1. NUMA affinity\n\nIn the documents' 8-GPU server, GPUs 0–3 sit on NUMA node 0 with cores `0-51,104-155` "
           "and GPUs 4–7 on node 1. NVML reports that as a bitmask; `tunekit.bench.set_numa_affinity(gpu)` reads it "
           "and binds the process (call it before creating DataLoaders so workers inherit the binding)."),
        code("def cpus_from_mask(words):   # NVML's affinity mask: 64-bit words, word 0 = CPUs 0..63, bit i = CPU 64*w + i\n"
             "    return [64 * w + bit for w, word in enumerate(words) for bit in range(64) if (word >> bit) & 1]\n"
             "assert cpus_from_mask([0b1011]) == [0, 1, 3]\n"
             "node0 = list(range(0, 52)) + list(range(104, 156))   # the documents' GPU0-3 cores\n"
             "mask = [sum(1 << c for c in node0 if 64 * w <= c < 64 * (w + 1)) >> (64 * w) for w in range(4)]\n"
             "assert cpus_from_mask(mask) == node0\n"
             "nodes = len(glob.glob('/sys/devices/system/node/node[0-9]*'))   # Linux sysfs; 0 elsewhere\n"
             "before = sorted(os.sched_getaffinity(0))\n"
             "bound = bench.set_numa_affinity(0)\n"
             "print(f'this machine: {nodes} NUMA node(s), process allowed on {len(before)} CPUs')\n"
             "print('bound to', f'{len(bound)} CPUs local to cuda:0' if bound else 'nothing: one node or no NVML GPU, so there is nothing to gain here')\n"
             "fig = go.Figure(go.Bar(x=['GPU0-3 (node 0)', 'GPU4-7 (node 1)', 'this process'],\n"
             "                       y=[len(node0), len(node0), len(bound or before)]))\n"
             "fig.update_layout(title='CPU cores per binding (documents server vs here)', yaxis_title='logical CPUs')\n"
             "fig"),
        md("## 2. Garbage collection in the training loop\n\n"
           "`bench.gc_in_training_loop` trains a small MLP for 30 steps while creating 2000 reference cycles per step, "
           "once with automatic gc and once with gc disabled and a full `gc.collect()` every 10 steps."),
        code("g = bench.gc_in_training_loop(steps=30, garbage_per_step=2000, collect_every=10)\n"
             "assert (g.median_s > 0).all() and len(g) == 2\n"
             "display(g[['variant', 'median_s', 'max_s', 'total_s', 'max_over_median']].round(4))\n"
             "bench.plot(g)"),
        code("auto, manual = g.iloc[0], g.iloc[1]\n"
             "print(f'automatic gc: worst step {auto.max_over_median:.1f}x the median; manual: worst step {manual.max_over_median:.1f}x the median '\n"
             "      f'(the steps with the full collection), total {manual.total_s / auto.total_s:.2f}x the automatic total.')"),
        md("How to read it: the automatic collector mostly cleans young garbage, often and cheaply. A full "
           "`gc.collect()` walks every tracked object (torch's included), so it is expensive. Disabling gc does not make "
           "collection free, it makes it *predictable*: across many ranks every rank pays at the same step, instead of one "
           "random straggler holding up each all-reduce. Collect rarely, at the same step everywhere."),
        md("## 3. `torch.compile`: speed after a compile-time toll\n\n"
           "`bench.compile_on_off` times forward+backward of a small MLP eagerly and compiled (inductor), and records "
           "the first compiled call (tracing + code generation)."),
        code("c = bench.compile_on_off(width=(1024 if GPU else 128), tokens=(4096 if GPU else 256), repeats=7)\n"
             "print('notes:', c.attrs.get('notes'))\n"
             "display(c[['variant', 'median_s', 'compile_s', 'speedup']].round(4))\n"
             "assert c.median_s.iloc[0] > 0\n"
             "bench.plot(c)"),
        code("eager, comp = c.iloc[0], c.iloc[1]\n"
             "if math.isnan(comp.median_s):\n"
             "    print('compile did not run here:', c.attrs.get('notes'))\n"
             "else:\n"
             "    saved = eager.median_s - comp.median_s\n"
             "    print(f'compiled step {comp.speedup:.2f}x the eager speed; first call took {comp.compile_s:.2f} s')\n"
             "    print(f'break-even after {comp.compile_s / saved:,.0f} steps' if saved > 0 else\n"
             "          'no speed-up to amortize: this tiny MLP is two matmuls that eager already runs well; '\n"
             "          'compile pays off when many small elementwise ops can be fused (norms, activations, attention glue).')"),
        md("## Conclusion and exercise\n\n"
           "* NUMA binding matters only with several sockets and CPU-heavy host work; it is cheap to do, so do it on "
           "multi-socket GPU servers and skip it on one-node machines like this one.\n"
           "* gc: control *when* it happens, not whether — measured above, a full collection is far from free.\n"
           "* compile: measure the speed-up and the compile time on your model; the inductor cache makes the second "
           "launch much cheaper.\n\n"
           "**Exercise:** compile the tunekit GPT (`lab.run(compile=True)` in the dashboard) and compare with the MLP here."),
    ]


# ---------------------------------------------------------------------------------------------
def ch11():
    return [
        md("# 11 · Reproducibility: seeds, environment, and how many repeats a claim needs\n\n"
           "**Claim.** A performance experiment changes one variable and keeps everything else fixed. That takes "
           "three things: fixed seeds (same data order, same initial weights, same losses), a recorded environment "
           "(software versions, hardware, the settings that change kernels), and knowing the run-to-run spread of your "
           "timings, because the spread decides how many repeats it takes before a 3% speed-up is real rather than "
           "noise. The documents' team could not tune on a shared network until they got an isolated one; these 2 "
           "shared CPU cores are the same problem at a small scale."),
        code(SETUP + "\nimport os, platform, subprocess, sys, tempfile\nimport pandas as pd\n"
             "logdir = tempfile.mkdtemp()   # each Lab below gets its own run log"),
        md("## 1. Fixed seeds: identical runs\n\nTwo labs built with the same seed train three steps each; a third uses "
           "another seed."),
        code("def fresh(seed, name):\n"
             "    return tunekit.Lab(seed=seed, log_path=f'{logdir}/{name}.jsonl')\n"
             "r0a = fresh(0, 'a').run(steps=3, warmup=0)\n"
             "r0b = fresh(0, 'b').run(steps=3, warmup=0)\n"
             "r1 = fresh(1, 'c').run(steps=3, warmup=0)\n"
             "print(f'seed 0: loss {r0a.loss_first:.6f} -> {r0a.loss:.6f}; again: {r0b.loss_first:.6f} -> {r0b.loss:.6f}')\n"
             "print(f'seed 1: loss {r1.loss_first:.6f} -> {r1.loss:.6f}')\n"
             "assert (r0a.loss_first, r0a.loss) == (r0b.loss_first, r0b.loss)   # bitwise equal, not just close\n"
             "assert r1.loss != r0a.loss"),
        md("On a GPU, the same seed is not enough for bitwise equality: some kernels (atomics in backward, cuBLAS "
           "split-K) add in a different order each run. `torch.use_deterministic_algorithms(True)` with "
           "`CUBLAS_WORKSPACE_CONFIG=:4096:8` forces deterministic kernels, at some cost in speed — use it to debug, "
           "not to benchmark.\n\n## 2. Capture the environment\n\nEverything that can change a timing goes into the record:"),
        code("def capture_env():\n"
             "    def git(*args):   # stdout, or None when git (or the repository) is missing\n"
             "        try:\n"
             "            r = subprocess.run(['git', *args], capture_output=True, text=True, timeout=5)\n"
             "        except Exception:\n"
             "            return None\n"
             "        return r.stdout.strip() if r.returncode == 0 else None\n"
             "    status = git('status', '--porcelain')\n"
             "    env = {\n"
             "        'python': sys.version.split()[0], 'torch': torch.__version__, 'tunekit': tunekit.__version__,\n"
             "        'platform': platform.platform(), 'cpu': platform.processor() or platform.machine(),\n"
             "        'cpu_count': os.cpu_count(), 'torch_threads': torch.get_num_threads(),\n"
             "        'cuda': torch.version.cuda if GPU else None,\n"
             "        'gpu': torch.cuda.get_device_name() if GPU else None,\n"
             "        'cudnn': torch.backends.cudnn.version() if GPU else None,\n"
             "        'tf32_matmul': torch.backends.cuda.matmul.allow_tf32,\n"
             "        'git_commit': git('rev-parse', '--short', 'HEAD'), 'git_dirty': None if status is None else bool(status),\n"
             "    }\n"
             "    for var in ('OMP_NUM_THREADS', 'CUDA_VISIBLE_DEVICES', 'PYTORCH_CUDA_ALLOC_CONF', 'CUBLAS_WORKSPACE_CONFIG', 'NCCL_ALGO'):\n"
             "        env[var] = os.environ.get(var)\n"
             "    return env\n"
             "env = capture_env()\n"
             "assert env['torch'] == torch.__version__ and env['torch_threads'] >= 1\n"
             "pd.Series(env, name='value').to_frame()"),
        md("## 3. Run-to-run spread\n\nTime the same training step many times, in two blocks separated by a pause. Nothing "
           "changes between them, so any difference between the blocks is noise (an *A/A test*)."),
        code("lab = fresh(0, 'spread')\n"
             "x, y = lab.batch(4 if not GPU else 16, 128 if not GPU else 512)\n"
             "model, opt = lab.model, torch.optim.AdamW(lab.model.parameters(), lr=1e-3)\n"
             "def step():\n"
             "    _, loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)\n"
             "def block(n):\n"
             "    out = []\n"
             "    for _ in range(n):\n"
             "        if GPU: torch.cuda.synchronize()\n"
             "        t0 = time.perf_counter(); step()\n"
             "        if GPU: torch.cuda.synchronize()\n"
             "        out.append(time.perf_counter() - t0)\n"
             "    return out\n"
             "block(3)   # warm-up\n"
             "a = block(20); time.sleep(0.5); b = block(20)\n"
             "times = a + b\n"
             "mean, sd = statistics.mean(times), statistics.stdev(times)\n"
             "cv = sd / mean\n"
             "aa = statistics.median(a) / statistics.median(b) - 1\n"
             "print(f'{len(times)} steps: median {statistics.median(times) * 1e3:.1f} ms, mean {mean * 1e3:.1f} ms, '\n"
             "      f'coefficient of variation {cv:.1%}, min..max {min(times) * 1e3:.1f}..{max(times) * 1e3:.1f} ms')\n"
             "print(f'A/A test: block A vs block B medians differ by {aa:+.1%} with nothing changed')\n"
             "assert all(t > 0 for t in times)\n"
             "fig = go.Figure()\n"
             "fig.add_scatter(y=[t * 1e3 for t in times], mode='markers+lines', name='step time')\n"
             "fig.add_vline(x=len(a) - 0.5, line_dash='dot')\n"
             "fig.update_layout(title='the same step, 40 times (block A | block B)', xaxis_title='step', yaxis_title='ms')\n"
             "fig"),
        md("## 4. How many repeats does a claim need?\n\n"
           "To tell a real relative speed-up `d` from noise with spread `cv` (two-sided 5% error, 80% power, comparing two "
           "means), each side needs about `n = 2·(1.96 + 0.84)²·(cv/d)²` measurements."),
        code("def repeats_needed(cv, d, z_alpha=1.96, z_power=0.84):\n"
             "    return max(2, math.ceil(2 * (z_alpha + z_power) ** 2 * (cv / d) ** 2))   # a spread needs 2 samples at least\n"
             "assert repeats_needed(0.05, 0.05) == 16          # 2 * 2.8^2 = 15.68\n"
             "assert repeats_needed(0.05, 0.025) == 63         # half the effect: 4x the repeats\n"
             "effects = [0.01, 0.02, 0.03, 0.05, 0.10, 0.20]\n"
             "need = {d: repeats_needed(cv, d) for d in effects}\n"
             "fig = go.Figure(go.Bar(x=[f'{d:.0%}' for d in effects], y=list(need.values()), text=list(need.values())))\n"
             "fig.update_layout(title=f'repeats per side to detect a speed-up, at the measured cv = {cv:.1%}',\n"
             "                  xaxis_title='speed-up to detect', yaxis_title='timed steps per variant (log scale)', yaxis_type='log')\n"
             "fig"),
        code("print(f'With the spread measured here (cv {cv:.1%}), a 20% speed-up shows after {need[0.2]} steps per variant, '\n"
             "      f'a 5% one needs {need[0.05]}, and a 2% one {need[0.02]}.')\n"
             "print(f'The A/A difference of {abs(aa):.1%} is what noise alone produced: claims smaller than that from a '\n"
             "      'single pair of runs are not claims.')\n"
             "print('Medians and best-of-N resist the occasional slow step better than means, which is why the chapters use them.')"),
        md("## Conclusion and exercise\n\n"
           "* Same seed, same software, same machine → bitwise-equal losses on CPU. Record the environment with every result.\n"
           "* Measure the spread first; it sets how many repeats each comparison needs. On shared machines alternate the "
           "variants (A B A B …) so a burst of load hits both.\n\n"
           "**Exercise:** set `torch.set_num_threads(1)` and measure the spread again: is a single thread slower but steadier?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch12():
    return [
        md("# 12 · Parallelism: memory per GPU, the pipeline bubble, all-reduce bandwidth\n\n"
           "**Claim.** Plain data parallelism (DDP) keeps a full copy of weights, gradients and optimizer states on every "
           "GPU. ZeRO shards them over the `N` data-parallel ranks — stage 1 the optimizer states, stage 2 also the "
           "gradients, stage 3 (FSDP `FULL_SHARD`) also the weights — at the price of more communication: stage 3 "
           "all-gathers the weights in forward and backward. On a slow inter-node link that traffic dominates, which is "
           "why the documents' case study went from 1,500 tokens/s (FULL_SHARD over 2 nodes, 50 Gbps) to 24,000 "
           "(HYBRID_SHARD: shard inside a node, replicate across nodes). Pipeline parallelism idles `(p−1)/(m+p−1)` of "
           "the time with `p` stages and `m` micro-batches."),
        code(SETUP + "\nimport pandas as pd\nfrom tunekit import bench, advisor, formulas as F\nGB = 1e9"),
        md("## 1. Static memory per GPU: DDP vs ZeRO stages\n\nA 7B model in mixed precision with AdamW (18 B/param) on 8 GPUs:"),
        code("n, dp = 7e9, 8\n"
             "stages = {s: tunekit.estimate_memory(n, zero_stage=s, dp=dp, precision='mixed', optimizer='adamw') for s in range(4)}\n"
             "lines = ['weights', 'master_weights', 'gradients', 'optimizer_states']\n"
             "mem = pd.DataFrame({f'ZeRO-{s}' if s else 'DDP': {k: e[k] / GB for k in lines} for s, e in stages.items()}).T\n"
             "mem['total GB'] = mem.sum(axis=1)\n"
             "assert round(mem.loc['DDP', 'total GB']) == 126                      # 7e9 x 18 B\n"
             "assert abs(mem.loc['ZeRO-3', 'total GB'] - 126 / 8) < 1e-6            # everything sharded 8 ways\n"
             "assert abs(mem.loc['ZeRO-1', 'total GB'] - 7 * (2 + 4 / 8 + 4 + 8 / 8)) < 1e-6   # master copy and AdamW moments sharded: 52.5 GB\n"
             "fig = go.Figure([go.Bar(name=k, x=mem.index, y=mem[k]) for k in lines])\n"
             "fig.add_hline(y=80, line_dash='dot', annotation_text='80 GB GPU')\n"
             "fig.update_layout(barmode='stack', title=f'7B, mixed precision + AdamW, {dp} GPUs: static GB per GPU (activations extra)',\n"
             "                  yaxis_title='GB (1e9 bytes)')\n"
             "display(mem.round(2)); fig"),
        md("How tunekit's estimate shards the lines: stage 1 divides the optimizer states and the fp32 master copy by `N` "
           "(ZeRO counts the master copy as optimizer state) — check the table against that rule before you quote it."),
        code("fits = [k for k in mem.index if mem.loc[k, 'total GB'] < 80]\n"
             "print(f'DDP needs {mem.loc[\"DDP\", \"total GB\"]:.0f} GB per GPU before activations: it cannot hold a 7B model on 80 GB GPUs.')\n"
             "print(f'fits in 80 GB with room for activations: {fits}; ZeRO-3 leaves {80 - mem.loc[\"ZeRO-3\", \"total GB\"]:.0f} GB free per GPU.')"),
        md("## 2. The pipeline bubble\n\nWith `p` stages, the first micro-batch takes `p` steps to reach the last stage and "
           "the last one `p` steps to drain: `(p−1)` idle slots per stage out of `m + p − 1`."),
        code("def bubble(p, m):\n"
             "    return (p - 1) / (m + p - 1)\n"
             "assert bubble(4, 4) == 3 / 7 and bubble(1, 8) == 0\n"
             "ms = [1, 2, 4, 8, 16, 32, 64]\n"
             "fig = go.Figure([go.Scatter(x=ms, y=[bubble(p, m) * 100 for m in ms], name=f'p = {p} stages') for p in (2, 4, 8)])\n"
             "fig.update_layout(title='pipeline bubble vs micro-batches per step', xaxis_title='micro-batches m (= GAS)',\n"
             "                  yaxis_title='idle %', xaxis_type='log')\n"
             "fig"),
        code("need = {p: next(m for m in range(1, 10_000) if bubble(p, m) <= 0.05) for p in (2, 4, 8)}\n"
             "print('micro-batches per step for a bubble under 5%:', need, '-> m = 19(p-1): hence the large gradient accumulation that pipeline parallelism needs')\n"
             "assert need == {2: 19, 4: 57, 8: 133}   # (p-1)/(m+p-1) <= 0.05  <=>  m >= 19(p-1)"),
        md("## 3. All-reduce bandwidth, measured\n\n`bench.all_reduce_busbw` launches real ranks (NCCL on GPUs, gloo processes "
           "on CPU) and reports the nccl-tests figures: algbw = bytes / time and busbw = algbw · 2(n−1)/n, the traffic per "
           "link of a ring, comparable across rank counts."),
        code("assert advisor.allreduce_busbw(100, 8) == 175          # 100 * 2*7/8\n"
             "assert advisor.allreduce_busbw(100, 2) == 100\n"
             "sizes = (2**12, 2**16, 2**20, 2**22) if not GPU else (2**20, 2**24, 2**27)\n"
             "ar = bench.all_reduce_busbw(world_size=2, sizes_bytes=sizes)\n"
             "print('backend:', ar.attrs.get('backend'), '| notes:', ar.attrs.get('notes'))\n"
             "display(ar[['size_bytes', 'median_s', 'algbw_gb_per_s', 'busbw_gb_per_s', 'busbw_gbit_per_s']])\n"
             "bench.plot(ar)"),
        code("big = ar.iloc[-1]\n"
             "if math.isnan(big.busbw_gb_per_s):\n"
             "    print('the all-reduce did not run here:', ar.attrs.get('notes'))\n"
             "else:\n"
             "    small = ar.iloc[0]\n"
             "    print(f'{int(small.size_bytes):,} B: {small.busbw_gbit_per_s:.2f} Gbit/s; {int(big.size_bytes):,} B: {big.busbw_gbit_per_s:.2f} Gbit/s '\n"
             "          f'-> small messages are latency-bound ({small.median_s * 1e6:.0f} us each), so frameworks bucket gradients.')\n"
             "    where = ('two GPUs over NVLink/PCIe (NCCL)' if ar.attrs.get('backend') == 'nccl' else\n"
             "             'two CPU processes over the loopback interface (gloo)')\n"
             "    print(f'the documents recommend at least 400 Gbit/s between nodes; BLOOM trained on 50. Here, {where} '\n"
             "          f'reach {big.busbw_gbit_per_s:.1f} Gbit/s.')\n"
             "    assert big.busbw_gb_per_s > 0"),
        md("## 4. Why HYBRID_SHARD beats FULL_SHARD on slow links\n\n"
           "A traffic model for the case study (7B, bf16 weights and gradients = 14 GB, 2 nodes × 4 GPUs, 50 Gbit/s "
           "between nodes): count the bytes that must cross the inter-node link per optimizer step. FULL_SHARD over all 8 "
           "ranks runs its all-gathers (forward, backward) and its reduce-scatter (gradients) over a ring that crosses the "
           "slow link; HYBRID_SHARD keeps those inside each node and sends only the gradient all-reduce of each GPU's shard "
           "across. This ignores overlap with compute and latency; it is the shape of the argument, not a simulation."),
        code("S, n_all, per_node, link_GBps = 14e9, 8, 4, 50 / 8   # bytes; ranks; GPUs per node; 50 Gbit/s = 6.25 GB/s\n"
             "full = 3 * (n_all - 1) / n_all * S                       # 2 all-gathers + 1 reduce-scatter over the 8-rank ring\n"
             "hybrid = per_node * advisor.allreduce_busbw(S / per_node, 2)   # 4 shard all-reduces between the 2 nodes\n"
             "t_full, t_hybrid = full / 1e9 / link_GBps, hybrid / 1e9 / link_GBps\n"
             "fig = go.Figure(go.Bar(x=['FULL_SHARD (8 ranks)', 'HYBRID_SHARD (4 x 2)'], y=[t_full, t_hybrid],\n"
             "                       text=[f'{full / 1e9:.1f} GB', f'{hybrid / 1e9:.1f} GB']))\n"
             "fig.update_layout(title='inter-node traffic per step at 50 Gbit/s (model)', yaxis_title='seconds on the slow link')\n"
             "assert abs(full / 1e9 - 36.75) < 1e-9 and abs(hybrid / 1e9 - 14) < 1e-9\n"
             "fig"),
        code("print(f'FULL_SHARD pushes {full / 1e9:.2f} GB per step across the nodes ({t_full:.1f} s at 50 Gbit/s); HYBRID_SHARD {hybrid / 1e9:.1f} GB '\n"
             "      f'({t_hybrid:.1f} s): {full / hybrid:.1f}x less, and only once per step, late in backward, where it overlaps compute.')\n"
             "print('The case study: 1,500 tok/s FULL_SHARD on 2 nodes -> 8,000 on one node with checkpointing -> 16,000 with '\n"
             "      'FlashAttention-2 -> 24,000 with HYBRID_SHARD on 2 nodes: the slow link stopped being on the critical path.')"),
        md("## Conclusion and exercise\n\n"
           "* Sharding divides static memory by the data-parallel size; what you pay is communication volume, and "
           "where that volume flows (fast NVLink inside a node or a slow NIC between nodes) decides the speed.\n"
           "* Pipeline parallelism needs many micro-batches per step to hide its bubble.\n"
           "* Measure your links' busbw before choosing: the same plan can be compute-bound on one cluster and "
           "network-bound on another.\n\n"
           "**Exercise:** redo section 4 for 4 nodes × 8 GPUs at 400 Gbit/s. Is FULL_SHARD still the bottleneck?"),
    ]


# ---------------------------------------------------------------------------------------------
def ch13():
    return [
        md("# 13 · Case study: climbing the optimization ladder\n\n"
           "**Claim.** The documents' FSDP case study (Llama-2 7B, 2 × 4 A100s, 50 Gbit/s) went from ~1,500 to ~24,000 "
           "tokens/s by stacking changes. The ~1,500 was FULL_SHARD over both nodes *with bf16 mixed precision already on*; "
           "the write-up also pads the vocabulary to a multiple of 64 for tensor cores (no number given); activation "
           "checkpointing freed enough memory to move training to one node (8,000), FlashAttention-2 doubled that "
           "(16,000), and HYBRID_SHARD over 2 nodes reached 24,000. Here we climb the "
           "single-device part of that ladder on a small GPT with an awkward vocabulary (GPT-2's 50,257 on a GPU, 4,001 on a CPU) and read "
           "tokens/s and memory at every rung. Expect some rungs to behave differently on a CPU — that is the lesson."),
        code(SETUP + "\nimport tempfile\nimport pandas as pd\nfrom plotly.subplots import make_subplots\nlogdir = tempfile.mkdtemp()"),
        md("## The ladder\n\nEach rung keeps the previous rungs' changes. Rungs 1–2 use the unpadded model, rungs 3–6 the "
           "same model with its vocabulary padded to the next multiple of 64. The whole ladder runs twice and each rung keeps its faster "
           "run (contention on shared cores only adds time)."),
        code("# GPU: GPT-2's 50257-token vocabulary. CPU: a scaled-down awkward vocabulary (4001 -> 4032), because a 50k-wide\n"
             "# output layer alone would take seconds per step on 2 cores and the ladder must run in under a minute.\n"
             "vocab = 50257 if GPU else 4001\n"
             "base_cfg = dict(vocab_size=vocab, n_layer=(8 if GPU else 2), n_head=(8 if GPU else 4), n_embd=(512 if GPU else 128),\n"
             "                block_size=(1024 if GPU else 128), attention='math')\n"
             "labs = {pad: tunekit.Lab(config=tunekit.GPTConfig(**base_cfg, pad_vocab_multiple=pad), log_path=f'{logdir}/pad{pad}.jsonl')\n"
             "        for pad in (1, 64)}\n"
             "mb, seq = (8, 1024) if GPU else (4, 128)\n"
             "fast_attn = 'flash' if GPU else 'sdpa'    # flash-attn on GPU (falls back to SDPA if not installed), torch SDPA on CPU\n"
             "if GPU:\n"
             "    big_mb = labs[64].find_max_batch_size(limit=256, precision='bf16', checkpointing=True, attention=fast_attn, seq_len=seq).best\n"
             "else:\n"
             "    big_mb = 2 * mb    # on CPU: the micro-batch that checkpointing's saved memory pays for (see chapter 05)\n"
             "ladder = [\n"
             "    ('1 fp32',              1,  dict(precision='fp32', micro_batch=mb)),\n"
             "    ('2 + bf16',            1,  dict(precision='bf16', micro_batch=mb)),\n"
             "    (f'3 + vocab {-(-vocab // 64) * 64}', 64, dict(precision='bf16', micro_batch=mb)),\n"
             "    ('4 + checkpointing',   64, dict(precision='bf16', micro_batch=mb, checkpointing=True)),\n"
             "    (f'5 + {fast_attn}',    64, dict(precision='bf16', micro_batch=mb, checkpointing=True, attention=fast_attn)),\n"
             "    (f'6 + micro-batch {big_mb}', 64, dict(precision='bf16', micro_batch=big_mb, checkpointing=True, attention=fast_attn)),\n"
             "]\n"
             "best = {}\n"
             "for _ in range(2):\n"
             "    for name, pad, kw in ladder:\n"
             "        kw = {'attention': 'math', 'checkpointing': False, **kw}\n"
             "        r = labs[pad].run(steps=2, warmup=1, seq_len=seq, **kw)\n"
             "        if name not in best or r.tokens_per_s > best[name].tokens_per_s:\n"
             "            best[name] = r\n"
             "df = pd.DataFrame([dict(rung=k, tokens_per_s=r.tokens_per_s, saved_MiB=r.saved_bytes / 2**20, attention=r.attention_ran,\n"
             "                        precision=r.precision, micro_batch=r.micro_batch) for k, r in best.items()])\n"
             "df['vs fp32'] = df.tokens_per_s / df.tokens_per_s.iloc[0]\n"
             "df['vs previous'] = df.tokens_per_s / df.tokens_per_s.shift(1)\n"
             "assert (df.tokens_per_s > 0).all() and len(df) == 6\n"
             "df.round(2)"),
        code("doc = pd.DataFrame({'step': ['FULL_SHARD, 2 nodes', '+ checkpointing, 1 node', '+ FlashAttention-2', '+ HYBRID_SHARD, 2 nodes'],\n"
             "                    'tokens_per_s': [1500, 8000, 16000, 24000]})\n"
             "assert doc.tokens_per_s.iloc[-1] / doc.tokens_per_s.iloc[0] == 16\n"
             "fig = make_subplots(rows=1, cols=2, subplot_titles=[f'this run ({device}): tokens/s per rung', 'documents (Llama-2 7B, 4 or 8 A100s): tokens/s'],\n"
             "                    specs=[[{'secondary_y': True}, {}]])\n"
             "fig.add_bar(x=df.rung, y=df.tokens_per_s, name='tokens/s (best of 2)', row=1, col=1)\n"
             "fig.add_scatter(x=df.rung, y=df.saved_MiB, name='activations saved per micro-batch (MiB)', mode='lines+markers', row=1, col=1, secondary_y=True)\n"
             "fig.add_bar(x=doc.step, y=doc.tokens_per_s, name='documents', row=1, col=2)\n"
             "fig.update_yaxes(title_text='tokens/s (one device)', row=1, col=1, secondary_y=False)\n"
             "fig.update_yaxes(title_text='MiB (2^20 bytes)', row=1, col=1, secondary_y=True)\n"
             "fig.update_yaxes(title_text='tokens/s (whole cluster)', row=1, col=2)\n"
             "fig.update_layout(title='the optimization ladder (different scales: compare the steps, not the heights)', height=450)\n"
             "fig"),
        code("for i in range(1, len(df)):\n"
             "    r = df.iloc[i]\n"
             "    print(f'{r.rung:<22} {r[\"vs previous\"]:5.2f}x the previous rung, {r[\"vs fp32\"]:5.2f}x fp32, saved activations {r.saved_MiB:7.1f} MiB')\n"
             "top = df.loc[df.tokens_per_s.idxmax()]\n"
             "print(f'\\nbest rung here: {top.rung} at {top[\"vs fp32\"]:.2f}x the fp32 start; the documents climbed 16x, mostly from communication '\n"
             "      '(one node, then HYBRID_SHARD), which a single device cannot show, and from FlashAttention-2 (rung 5 here).')\n"
             "bf16_x = df['vs previous'].iloc[1]\n"
             "print('bf16 ' + (f'helped here ({bf16_x:.2f}x).' if bf16_x > 1.05 else\n"
             "      f'did not help here ({bf16_x:.2f}x): this model is too small to keep the tensor cores busy; launches and the fp32 parts dominate.' if GPU else\n"
             "      f'did not help here ({bf16_x:.2f}x): without bf16 matrix units (AMX / AVX512-BF16) a CPU converts and computes in fp32, '\n"
             "      'so bf16 adds casts; on a tensor-core GPU it is the largest single speed-up.'))\n"
             "pad_x = df['vs previous'].iloc[2]\n"
             "print(f'padding the vocabulary: {pad_x:.2f}x -> ' + ('faster, as tensor cores reward multiples of 64.' if pad_x > 1.1 else\n"
             "      'slower: padding adds only ' + f'{(-(-vocab // 64) * 64) / vocab - 1:.1%} work, so a drop this size is noise or a cache effect; rerun.' if pad_x < 0.9 else\n"
             "      'within noise (10%): ' + ('the effect on a GPU needs a vocabulary-sized GEMM that dominates the step.' if GPU else 'a CPU has no tensor-core tiles to fill.')))\n"
             "ck = df.iloc[3]\n"
             "drop = 1 - ck.saved_MiB / df.saved_MiB.iloc[2]\n"
             "print(f'checkpointing alone: {ck[\"vs previous\"]:.2f}x speed, activations {df.saved_MiB.iloc[2]:.1f} -> {ck.saved_MiB:.1f} MiB ({drop:.0%} less); '\n"
             "      f'what remains is mostly the logits (B x T x {-(-vocab // 64) * 64}) and the loss, outside the checkpointed blocks.')\n"
             "big = df.iloc[5]\n"
             "print(f'{big.rung}: {big[\"vs previous\"]:.2f}x -> ' + ('the freed memory turned into speed.' if big['vs previous'] > 1.1 else\n"
             "      'a small gain, within the noise of shared cores (10%).' if big['vs previous'] > 1.0 and not GPU else\n"
             "      'little or no gain: the GPU was already saturated at the smaller micro-batch for this model size.' if GPU else\n"
             "      'no gain: the CPU cores are already saturated at the smaller micro-batch (chapter 04). On a GPU this is the rung '\n"
             "      'where checkpointing pays back, because a bigger micro-batch fills the tensor cores.'))\n"
             "assert df.saved_MiB.iloc[3] < df.saved_MiB.iloc[2]"),
        md("## Conclusion and exercise\n\n"
           "* Every rung is a measurement, not a belief: bf16, padding and fused attention are large wins on GPUs and "
           "can be neutral or negative on a CPU; checkpointing is a loss on its own and a win only through the larger "
           "batch it allows.\n"
           "* The documents' biggest steps were about *where the bytes flow* (chapter 12), which is why measuring the "
           "network came first in their playbook.\n\n"
           "**Exercise:** in the dashboard (`labs[64].dashboard()`), try the rungs in a different order. Does the final "
           "throughput depend on the order? Does the *credit* each rung gets?"),
    ]


CHAPTERS = {"02_flops_mfu": ch02, "03_memory_anatomy": ch03, "04_batch_size": ch04,
            "05_checkpointing": ch05, "06_optimizers": ch06,
            "07_matrix_shapes": ch07, "08_attention": ch08,
            "09_dataloader": ch09, "10_numa_gc_compile": ch10,
            "11_reproducibility": ch11, "12_parallelism": ch12,
            "13_case_study": ch13}


def build(name: str) -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook(cells=CHAPTERS[name]())
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    return nb


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("chapters", nargs="*", help="numbers or names (default: all)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "notebooks"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in CHAPTERS:
        if args.chapters and not any(name.startswith(c) for c in args.chapters):
            continue
        path = out / f"{name}.ipynb"
        nbf.write(build(name), str(path))
        print("wrote", path)


if __name__ == "__main__":
    main()
