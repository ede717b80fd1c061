"""Entry point of one all-reduce rank under the elastic agent:
`python -m tunekit.bench.rank JSON` (see allreduce); RANK and WORLD_SIZE come from the agent."""
import json
import os
import sys
from pathlib import Path

from tunekit.bench.allreduce import time_all_reduce

if __name__ == "__main__":
    rank, world, cfg = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), json.loads(sys.argv[1])
    times = time_all_reduce(rank, world, cfg["sizes"], cfg["warmup"], cfg["repeats"], cfg["backend"],
                           cfg["timeout_s"])
    if rank == 0:
        Path(cfg["out"]).write_text(json.dumps({"times": times}))
