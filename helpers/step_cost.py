"""What a change of set-up costs in step time, as far as it can be computed honestly: recomputed FLOPs at a stated GPU
throughput, bytes moved over PCIe at a stated bandwidth, and the host's Adam at a rate measured on this machine.

Each figure is a lower-bound style account of one mechanism, never a prediction of the step time:
- recomputation (activation checkpointing): the forward FLOPs of what backward recomputes, 2 x tokens x the weights
  of the recomputed matmuls, plus attention's two s x s products (4 x batch x seq^2 x query width per layer, counted
  without the causal half), at the A100's BF16 dense peak (data/published.json, a peak: the time is a lower bound);
- optimizer offload (ZeRO-Offload, Ren et al. arXiv 2101.06840: fp16 gradients down, fp16 parameters up): each step the gradient partition goes
  to the host and the updated parameters come back, both in the compute dtype (2 x 2 bytes per parameter in bf16);
  DeepSpeed ZeRO-1/2 with accumulation also copies gradients to the host after every micro batch; the host runs Adam
  on the partition, its rate shared by the node's ranks;
- parameter offload (ZeRO-3 offload_param, FSDP2 CPUOffloadPolicy): the parameter partition comes to the GPU for the
  forward and again for the backward (2 x the compute dtype's bytes per parameter);
- copies at the A100's measured PCIe Gen4 peak for pinned memory, and at the published pageable/pinned ratio without
  pinning (data/published.json). Copies and the host's Adam are counted as not overlapped with GPU work.
The CPU Adam rate is measured here (`python -m helpers.step_cost`, helpers.measure.throughput.adam_rate) and saved in
data/results/cpu_adam_rate.json with its machine; a server's many-core host is faster than this one.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from helpers import models, published
from helpers.degrees import ceil_div
from helpers.models import DATA_DIR
from helpers.training import TrainSetup
from helpers.units import to_gib

RATE_FILE = DATA_DIR / "results" / "cpu_adam_rate.json"
GPU_ROW = "GPU matrix throughput, A100"
PCIE_ROW = "host-to-device copy, A100"
PAGEABLE_ROW = "host-to-device copy, pinned vs pageable"


@dataclass(frozen=True)
class Rates:
    """The rates every cost is computed at, each with where it comes from."""

    gpu_flops: float
    pcie_pinned: float         # bytes per second
    pcie_pageable: float
    adam_params_per_s: float | None
    sources: str
    adam: str = ""
    """How the host Adam rate was measured: optimizer, machine, threads, date."""

    def rate(self, term: str, setup: TrainSetup | None = None) -> str:
        """The rate a term is computed at, with a short source: 'GPU 312 TFLOPS (A100 BF16 dense peak, ...)'."""
        if term == "recompute":
            return f"GPU {self.gpu_flops / 1e12:.0f} TFLOPS ({GPU_ROW}, a peak; data/published.json)"
        if term == "pcie":
            pinned = setup is None or setup.pin_memory
            bw = self.pcie_pinned if pinned else self.pcie_pageable
            return (f"PCIe {bw / 1e9:.1f} GB/s {'pinned' if pinned else 'pageable'} ({PCIE_ROW} measured peak"
                    + ("" if pinned else f" x {self.pcie_pageable / self.pcie_pinned:.2f}, the published pageable/pinned "
                                         f"ratio") + "; data/published.json)")
        if self.adam_params_per_s is None:
            return f"host Adam: no measured rate ({RATE_FILE.name} missing: run python -m helpers.step_cost)"
        return (f"host Adam {self.adam_params_per_s / 1e6:.0f} M params/s per node ({self.adam}; "
                f"data/results/{RATE_FILE.name}){'' if setup is None or setup.ranks_per_node == 1 else f' shared by {setup.ranks_per_node} ranks'}")


@functools.lru_cache(maxsize=1)
def rates() -> Rates:
    """The rates: GPU and PCIe from data/published.json, the host's Adam from data/results/cpu_adam_rate.json."""
    gpu, pcie, old = published.speed(GPU_ROW), published.speed(PCIE_ROW), published.speed(PAGEABLE_ROW)
    pinned = pcie["pinned"] * 1e9
    adam = json.loads(RATE_FILE.read_text()) if RATE_FILE.is_file() else None
    sources = (f"GPU {gpu['peak']} TFLOPS BF16 dense peak ({gpu['source']}); PCIe {pcie['pinned']} GB/s pinned "
               f"({pcie['source']}), pageable x {old['pageable'] / old['pinned']:.2f} ({old['source']}); "
               + (f"host Adam {adam['optimizer']} {adam['params_per_s'] / 1e6:.0f} M params/s measured on "
                  f"{adam['device']}, {adam['threads']} threads, {adam['date']} ({RATE_FILE.name})" if adam
                  else f"host Adam: no measured rate ({RATE_FILE.name} missing: run python -m helpers.step_cost)"))
    how = f"{adam['optimizer']} measured on {adam['device']}, {adam['threads']} threads, {adam['date']}" if adam else ""
    return Rates(gpu["peak"] * 1e12, pinned, pinned * old["pageable"] / old["pinned"],
                 adam["params_per_s"] if adam else None, sources, how)


def _layer_matmuls(m: models.ModelSpec) -> list[int]:
    """FLOP-weights of one decoder layer's matmuls in forward order: 2-D weights in full, MoE experts' 3-D weights
    by the share of experts a token visits."""
    share = m.experts_active / m.experts if m.experts else 1.0
    return [t.numel * (share if t.ndim == 3 else 1) for t in m.tensors
            if t.group == "layer.0" and t.ndim >= 2]


def recompute_flops(model, setup: TrainSetup) -> float:
    """Forward FLOPs per optimizer step per GPU that backward recomputes under the set-up's checkpointing: 'full'
    recomputes each layer's forward; 'selective' (torchtitan's op policy, helpers.measure.checkpointing) recomputes
    every second matmul of each layer and keeps the attention kernel's output; 'none' recomputes nothing; with
    checkpoint_every N only every Nth layer is recomputed. Tensor and
    context parallelism split each layer's work over tp x cp GPUs."""
    m = models.spec(model)
    if setup.checkpointing == "none":
        return 0.0
    split = setup.degrees.model_parallel                             # each GPU's share
    tokens = setup.batch * setup.seq * setup.grad_accum
    mm = _layer_matmuls(m)
    if setup.checkpointing == "selective":
        return 2.0 * tokens * sum(mm[1::2]) * m.layers / split
    attention = 4.0 * setup.batch * setup.seq ** 2 * m.q_width * setup.grad_accum
    recomputed = m.layers // setup.checkpoint_every                 # every Nth layer only (1: each of them)
    return (2.0 * tokens * sum(mm) + attention) * recomputed / split


def _trainable(m: models.ModelSpec, setup: TrainSetup) -> int:
    from helpers.estimate.adapters import trained_params

    return trained_params(m, setup)


def host_sub_groups(m: models.ModelSpec, setup: TrainSetup) -> tuple[list[int], int]:
    """ZeRO-3's optimizer sub-groups of one rank (element counts, helpers.deepspeed_rules: LoRA's adapters where they
    are what trains) and the first index DeepSpeed's rule puts on the host for the set-up's offload ratio."""
    from helpers.deepspeed_rules import first_host_group, zero3_sub_groups
    from helpers.estimate import adapters
    from helpers.estimate.states import lora_adapters

    trained = lora_adapters(m, setup.lora_rank, setup.lora_targets, adapters.converted(m, setup)) \
        if setup.lora_rank else m
    groups = zero3_sub_groups(trained, setup)
    return groups, first_host_group(len(groups), setup.ratio)


def host_share(m: models.ModelSpec, setup: TrainSetup) -> float:
    """The fraction of the optimizer's elements whose Adam runs on the host: under ZeRO-3 with an offload ratio, the
    elements of the sub-groups DeepSpeed's rule puts there (whole sub-groups, as the estimate places them), not the
    ratio itself; else all of them (1.0), or none without offload."""
    if setup.strategy != "zero3" or setup.offload_ratio is None or not setup.offload_optimizer:
        return setup.ratio
    groups, first = host_sub_groups(m, setup)
    return sum(groups[first:]) / sum(groups)


def offload_traffic(model, setup: TrainSetup) -> tuple[float, float]:
    """(bytes over PCIe per optimizer step per GPU, parameters the host's Adam updates per step per GPU)."""
    m = models.spec(model)
    word = 4 if setup.precision == "fp32" else 2
    trainable = _trainable(m, setup)
    ways = setup.degrees.shard * setup.degrees.tp              # the GPUs one copy of the states is split over
    opt_shard = ceil_div(trainable, ways) if "optimizer_states" in setup.strat.shards else trainable
    param_shard = ceil_div(m.params, ways) if "parameters" in setup.strat.shards else m.params
    moved, adam = 0.0, 0.0
    if setup.offload_optimizer:
        share = host_share(m, setup)
        moved += share * opt_shard * 2 * word
        if setup.strat.family == "zero12":
            moved += (setup.grad_accum - 1) * opt_shard * word       # accumulated_grads_in_cpu, per micro batch
        adam = share * opt_shard
    if setup.offload_params:
        moved += 2 * param_shard * word * setup.grad_accum
    return moved, adam


def seconds(model, setup: TrainSetup) -> dict:
    """The step-time terms of a set-up (seconds per optimizer step, per GPU): recompute, pcie, host_adam (None
    without a measured rate, when the host runs Adam)."""
    r = rates()
    moved, adam = offload_traffic(model, setup)
    bw = r.pcie_pinned if setup.pin_memory else r.pcie_pageable
    host_adam = 0.0 if not adam else (None if r.adam_params_per_s is None
                                      else adam * setup.ranks_per_node / r.adam_params_per_s)
    return {"recompute": recompute_flops(model, setup) / r.gpu_flops, "pcie": moved / bw, "host_adam": host_adam,
            "recompute_flops": recompute_flops(model, setup), "pcie_bytes": moved, "host_adam_params": adam}


def added(model, before: TrainSetup, after: TrainSetup) -> tuple[float | None, str]:
    """(seconds per step added going from `before` to `after`, how: each nonzero term with its figures and rates)."""
    a, b = seconds(model, before), seconds(model, after)
    r = rates()
    parts, total = [], 0.0
    for key, what, amount in (("recompute", "recomputed forward", lambda x: f"{x['recompute_flops'] / 1e12:.1f} TFLOP"),
                              ("pcie", "PCIe copies", lambda x: f"{to_gib(x['pcie_bytes']):.2f} GiB"),
                              ("host_adam", "host Adam", lambda x: f"{x['host_adam_params'] / 1e9:.2f} G params")):
        if a[key] is None or b[key] is None:
            if a[key] != b[key]:
                return None, r.rate(key)
            continue
        if b[key] != a[key]:
            parts.append(f"{what} {amount(a)} -> {amount(b)} ({b[key] - a[key]:+.3f} s at {r.rate(key, after)})")
            total += b[key] - a[key]
    if not parts:
        return 0.0, "the same FLOPs, no recomputation, PCIe traffic or host Adam added (kernel speeds not modelled)"
    return total, "; ".join(parts) + " [per optimizer step per GPU, copies and host Adam not overlapped]"


def measure(save: bool = True) -> dict:
    """Measure the host's Adam rate here (DeepSpeedCPUAdam where its op is built, else torch's fused AdamW on the
    CPU) and save it to data/results/cpu_adam_rate.json."""
    from helpers import deepspeed_ops
    from helpers.files import write_text_atomically
    from helpers.measure import throughput

    kind = "torch-adamw-fused" if deepspeed_ops.torch_path(offload=True) else "deepspeed-cpu-adam"
    row = throughput.adam_rate(kind, elements=1 << 24, steps=5)
    if save:
        write_text_atomically(RATE_FILE, json.dumps(row, indent=1) + "\n")
        rates.cache_clear()
    return row


if __name__ == "__main__":
    got = measure()
    print(f"{got['optimizer']}: {got['params_per_s'] / 1e6:.1f} M params/s ({got['median_step_s']:.3f} s per step of "
          f"{got['elements']:,} fp32 parameters, {got['threads']} threads, {got['device']}) -> {RATE_FILE}")
