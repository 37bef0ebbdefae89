"""Benchmark: `python -m helpers.bench` prints the median time of one estimate (target: under 10 ms)."""

from __future__ import annotations

import statistics
import time

from helpers import estimate, models
from helpers.training import TrainSetup

SETUPS = {
    "single bf16": TrainSetup(precision="bf16", seq=4096),
    "zero2 offload": TrainSetup(strategy="zero2", offload_optimizer=True, seq=128),
    "zero3 ratio 0.9, 8 GPUs": TrainSetup(strategy="zero3", gpus=8, offload_optimizer=True, offload_ratio=0.9),
    "fsdp2 cpu offload, 2 GPUs": TrainSetup(strategy="fsdp2", gpus=2, offload_optimizer=True, offload_params=True),
}


def main() -> None:
    print(f"{'model':18s}{'set-up':28s}{'median ms':>10s}{'max ms':>9s}")
    for name in models.catalogue():
        models.spec(name)                      # the one-time meta build is not what a slider pays
        for label, setup in SETUPS.items():
            times = []
            for _ in range(50):
                t = time.perf_counter()
                estimate.run(name, setup)
                times.append((time.perf_counter() - t) * 1e3)
            print(f"{name:18s}{label:28s}{statistics.median(times):10.3f}{max(times):9.3f}")


if __name__ == "__main__":
    main()
