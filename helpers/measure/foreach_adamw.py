"""torch AdamW's step, measured with whichever torch runs this file: how many temporaries the size of the parameters it
holds at its peak, beyond the parameters, their gradients and the two states.

Run by path, so that an old torch in a virtual environment of its own runs it without this package's imports:

    python helpers/measure/foreach_adamw.py                 # the installed torch: one JSON line
    /tmp/venv-2.0.1/bin/python helpers/measure/foreach_adamw.py --count 8 --numel 33554432

How: `count` parameters of `numel` values each get random gradients; a first step makes exp_avg and exp_avg_sq; then
the process's peak resident set is reset (writing 5 to /proc/self/clear_refs resets VmHWM to VmRSS, Linux 4.0+),
a second step runs, and VmHWM - VmRSS before it is what the step held above the rest. glibc serves blocks above its
mmap threshold (at most 32 MiB) with mmap and returns them to the kernel when freed, so with parameters of 32 MiB and
more the resident set follows the live tensors. On this CPU torch runs the same Python step as on CUDA
(`_multi_tensor_adamw` for foreach=True, `_single_tensor_adamw` for foreach=False); which one ran is recorded.

The figures in data/results/torch_foreach_adamw_versions.json came from this file under the PyPI wheels of torch
2.0.1, 2.1.0, 2.1.2 and 2.2.0 (Linux, Python 3.11) and the installed torch; the rule they check is
helpers.versions 'foreach_adamw_two_lists'. Linux only (/proc)."""

from __future__ import annotations

import argparse
import gc
import json
import sys


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024          # the kernel prints kB
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(count: int = 4, numel: int = 8 * 2**20, dtype: str = "fp32", foreach: bool = True,
            weight_decay: float = 0.01) -> dict:
    """The second step's peak above what was resident before it, in bytes and as a multiple of the parameters'."""
    import torch
    import torch.optim.adam as adam
    import torch.optim.adamw as adamw

    called = []                 # which step ran (torch 2.5+ steps AdamW with adam.py's functions)
    for module, name in ((adamw, "_multi_tensor_adamw"), (adamw, "_single_tensor_adamw"),
                         (adam, "_multi_tensor_adam"), (adam, "_single_tensor_adam")):
        if hasattr(module, name):
            real = getattr(module, name)

            def spy(*a, _real=real, _name=name, **k):
                called.append(_name)
                return _real(*a, **k)

            setattr(module, name, spy)
    torch.manual_seed(0)
    kind = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    params = [torch.nn.Parameter(torch.randn(numel, dtype=kind)) for _ in range(count)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=weight_decay, foreach=foreach)
    opt.step()                                              # the states, made at the first step
    gc.collect()
    spike = torch.ones(2 * numel, dtype=kind)               # the reset must bring the peak back to the resident set
    del spike
    _reset_peak()
    reset_works = _status()["VmHWM"] <= _status()["VmRSS"] + 2**20
    _reset_peak()
    before = _status()["VmRSS"]
    opt.step()
    peak = _status()["VmHWM"]
    param_bytes = count * numel * params[0].element_size()
    return {"torch": torch.__version__, "python": sys.version.split()[0], "foreach": foreach, "dtype": dtype,
            "count": count, "numel": numel, "param_bytes": param_bytes, "step_ran": sorted(set(called)),
            "reset_works": reset_works, "resident_before": before, "peak": peak, "held_bytes": peak - before,
            "temporaries": round((peak - before) / param_bytes, 3)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--numel", type=int, default=8 * 2**20)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--for-loop", action="store_true", help="foreach=False (torch's single-tensor step)")
    a = p.parse_args(argv)
    print(json.dumps(measure(a.count, a.numel, a.dtype, not a.for_loop)))


if __name__ == "__main__":
    main()
