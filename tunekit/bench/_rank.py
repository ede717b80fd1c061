"""Entry point of one all-reduce rank: `python -m tunekit.bench._rank RANK JSON` (see allreduce)."""
import json
import sys

from tunekit.bench.allreduce import _worker

if __name__ == "__main__":
    rank, cfg = int(sys.argv[1]), json.loads(sys.argv[2])
    times = _worker(rank, cfg["world"], cfg["port"], cfg["sizes"], cfg["warmup"], cfg["repeats"],
                    cfg["backend"], cfg["timeout_s"])
    if rank == 0:
        print(json.dumps({"times": times}))
