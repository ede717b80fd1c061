"""Writes notebooks/00_tour.ipynb (outputs stripped). Run: python tools/make_tour.py"""
import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("# tunekit tour\n\nProfile a real training step cell by cell, then flip optimizations on the "
       "same live model from a dashboard. Everything here runs on a laptop CPU in well under a minute; "
       "on a GPU the same cells report GPU memory, NVML and spec-sheet MFU."),
    code("%load_ext tunekit\nimport torch, tunekit\n\nlab = tunekit.Lab()          # the built-in byte-level GPT, preset 'cpu-tiny'\n"
         "model = lab.model\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
         "print(model.config)\nprint(f'{model.num_params():,} non-embedding parameters')"),
    md("## 1. Profile a training step\n\n`%%gpuprofile` measures wall time, CPU and GPU memory and counts FLOPs. "
       "Counting slows the run it counts, so the **first** run of a cell reports FLOPs but no TFLOPS; "
       "a re-run reuses the count and reports TFLOPS, MFU and HFU from a clean clock."),
    code("batch_size, seq_len = 8, 128\nx, y = lab.batch(batch_size, seq_len)\n\n"
         "def train_step():\n    _, loss = model(x, y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad(set_to_none=True)\n    return loss.item()\n\n"
         "train_step()  # warm-up: the first step allocates optimizer state and picks kernels"),
    code("%%gpuprofile -n train_step\nfor _ in range(3):\n    loss = train_step()"),
    code("%%gpuprofile -n train_step\nfor _ in range(3):\n    loss = train_step()"),
    md("The second run says `cached`: same cell, same input shapes. Double the batch in another cell and "
       "the count is redone (FLOPs double) instead of silently reusing a stale number:"),
    code("batch_size = 16\nx, y = lab.batch(batch_size, seq_len)"),
    code("%%gpuprofile -n train_step\nfor _ in range(3):\n    loss = train_step()"),
    code("h = tunekit.history()\nassert h.flops.iloc[-1] == 2 * h.flops.iloc[-2]   # the recount saw the bigger batch\n"
         "h[['name', 'wall_s', 'flops', 'flops_source', 'tflops', 'mfu', 'cpu_peak_delta_bytes', 'device']]"),
    code("tunekit.plot_history()"),
    md("On CPU the peak behind MFU is a **measured** one: the best matmul TFLOPS this machine reached "
       "(`tunekit.calibrate`). On a known GPU it is the dense spec-sheet figure:"),
    code("print('H100 SXM bf16 peak:', tunekit.peak_tflops('NVIDIA H100 80GB HBM3', 'bf16'), 'TFLOPS')\n"
         "print('this machine:', h.peak_source.dropna().iloc[-1])"),
    md("## 2. Flip optimizations on the live model\n\n`lab.run(**toggles)` applies toggles to the same model "
       "and measures steady-state steps (warm-up excluded, FLOPs counted on a separate step). The dashboard "
       "below drives the same lab: change a control, press **Run**."),
    code("base = lab.run(steps=4, warmup=1)\nckpt = lab.run(steps=4, warmup=1, checkpointing=True)\n"
         "bf16 = lab.run(steps=4, warmup=1, precision='bf16')\n"
         "lab.results()[['label', 'tokens_per_s', 'tflops', 'mfu', 'hfu', 'peak_mem_bytes', 'loss']]"),
    code("lab.compare()"),
    md("Checkpointing recomputes activations in the backward pass: HFU counts that extra work, MFU does not, "
       "so with checkpointing on HFU > MFU. Saved activation memory is what it buys:"),
    code("print(f'saved activations: {base.saved_bytes/2**20:.1f} MiB -> {ckpt.saved_bytes/2**20:.1f} MiB with checkpointing')\n"
         "print(f'HFU/MFU with checkpointing: {ckpt.hfu/ckpt.mfu:.2f}')\nassert ckpt.saved_bytes < base.saved_bytes"),
    code("lab.dashboard()"),
]
nb = nbf.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
nbf.write(nb, "notebooks/00_tour.ipynb")
