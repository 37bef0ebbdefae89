"""One rank of a scaled FSDP2 or FSDP1 run (started by `scaled.run` under torchrun); rank 0 writes the Result."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from helpers import models
from helpers.measure import children, scaled
from helpers.measure.tracker import Tracker
from helpers.training import TrainSetup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--twin", required=True)
    p.add_argument("--setup", required=True)
    p.add_argument("--steps", type=int, default=scaled.STEPS)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    children.watch_owner()                  # exit with the process that started torchrun, however it ends
    s = TrainSetup(**json.loads(a.setup))
    dist.init_process_group("gloo")
    started = time.perf_counter()
    torch.manual_seed(0)
    net = scaled.build_twin(a.twin, s)
    tracker = Tracker(default_device="gpu")
    with tracker:
        engine = scaled.engine_class(s)(net, s, tracker)
        tracker.label(list(net.buffers()), "parameters")
        tracker.restart_peak("setup")
        losses, rss, times = scaled.train(engine, tracker, s, models.spec(a.twin).vocab, a.steps)
    if dist.get_rank() == 0:
        r = scaled.result_from_census(a.twin, s, tracker, losses, rss, time.perf_counter() - started, engine.describe,
                           ranks=s.ranks_per_node, times=times)
        r.save(a.out)
    dist.barrier()                          # every rank done (and gloo's own threads idle) before the teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
