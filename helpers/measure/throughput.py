"""Optimizer throughput on this machine's CPU: how many parameters per second an Adam step updates.

What an optimizer offload costs in step time is mostly the host's Adam (DeepSpeedCPUAdam, AVX kernels over the
fp32 master weights and states) plus the copies between GPU and host. The copies need a GPU to measure; the host's
Adam runs here for real, on one flat fp32 parameter, and its rate scales to a full model's partition.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time

import torch

from helpers.errors import InputError

OPTIMIZERS = ("deepspeed-cpu-adam", "torch-adamw-foreach", "torch-adamw-fused")


def adam_rate(kind: str = "deepspeed-cpu-adam", elements: int = 1 << 24, steps: int = 5) -> dict:
    """Median parameters updated per second by one Adam step of `kind` on a flat fp32 tensor of `elements`
    (the first step, which creates the states, is not timed). A dict with the rate, the machine and versions."""
    if kind not in OPTIMIZERS:
        raise InputError(f"unknown optimizer {kind!r}: allowed are {', '.join(OPTIMIZERS)}")
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 1:
        raise InputError(f"elements must be a positive integer, got {elements!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be a positive integer, got {steps!r}")
    param = torch.nn.Parameter(torch.randn(elements))
    param.grad = torch.randn(elements)
    if kind == "deepspeed-cpu-adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        from helpers import deepspeed_ops

        if deepspeed_ops.torch_path(offload=True):
            raise InputError("deepspeed-cpu-adam needs DeepSpeed's cpu_adam, a C++ op, which is not built here and will "
                             "not be (no compiler, or OOM_DEEPSPEED_OPS=torch): measure 'torch-adamw-fused' instead")
        deepspeed_ops.ensure("cpu_adam")

        opt = DeepSpeedCPUAdam([param], lr=1e-3, adamw_mode=True)
    else:
        opt = torch.optim.AdamW([param], lr=1e-3, fused=kind.endswith("fused"), foreach=kind.endswith("foreach"))
    opt.step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    from importlib.metadata import version

    return {"optimizer": kind, "elements": elements, "steps": steps, "median_step_s": median, "params_per_s": elements / median,
            "threads": torch.get_num_threads(), "device": f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
            "versions": {"torch": torch.__version__, "deepspeed": version("deepspeed")},
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
