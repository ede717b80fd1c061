"""lab.expect's answer times (issue 42, item 2: a new answer within 1 s for the built-in GPT and
within 3 s for a 100M-parameter transformers model on this 2-core CPU): the first answer (the plan's
device figures read), a new shape, the same shape again, for the built-in GPT presets and GPT-2
small's config (random init).

    .venv/bin/python benchmarks/bench_expect_speed.py   # (or bench_expect.py --speed)
"""
import argparse
import tempfile
import time
import warnings
from pathlib import Path

import tunekit

warnings.filterwarnings("ignore")


def speed(log_path: str) -> None:
    """Seconds per lab.expect answer: the first (device figures read), a new shape, the same again."""
    from transformers import GPT2Config, GPT2LMHeadModel

    models = [("GPT cpu-tiny", lambda: tunekit.Lab(log_path=log_path)),
              ("GPT cpu-small", lambda: tunekit.Lab(preset="cpu-small", log_path=log_path)),
              ("GPT gpt2-124m", lambda: tunekit.Lab(preset="gpt2-124m", micro_batch=1, seq_len=128,
                                                    log_path=log_path)),
              ("HF GPT-2 124M (random init)", lambda: tunekit.Lab(GPT2LMHeadModel(GPT2Config()), micro_batch=1,
                                                                  seq_len=128, log_path=log_path))]
    print(f"{'model':<30}{'first s':>9}{'new shape s':>13}{'again s':>9}  (target: new shape <= 1 s GPT, <= 3 s 100M)")
    for name, make in models:
        lab = make()
        mb = lab.resolve().micro_batch
        times = []
        for changes in ({}, {"micro_batch": mb * 2}, {"micro_batch": mb * 2, "lr": 1e-4}):
            t0 = time.perf_counter()
            lab.expect(**changes)
            times.append(time.perf_counter() - t0)
        print(f"{name:<30}{times[0]:>9.2f}{times[1]:>13.2f}{times[2]:>9.3f}", flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()   # no options: --help, or refused
    with tempfile.TemporaryDirectory(prefix="bench_expect_speed-") as folder:
        speed(str(Path(folder) / "runs.jsonl"))
