"""Benchmarks that print figures: `python -m helpers.bench estimate` (speed of one estimate, target < 10 ms) and
`python -m helpers.bench dryrun` (the dry run against torch's MemTracker and its own untracked step, Qwen2.5-72B's
time, FSDP2's GPU/host split, and the estimate against the dry run on a grid of set-ups, saved to data/results/)
and `python -m helpers.bench allocator` (the allocator model: allocated, modelled reserved and fragmentation for the
cases and the grid, expandable segments beside, the replay's speed, PEFT's published reserved figure) and
`python -m helpers.bench published` (published runs' peaks beside the estimate and the dry run, like with like, saved
to data/results/) and `python -m helpers.bench fit` (the largest batch and sequence for each case, the estimates each
search took, and the ways out of cases 1 and 2)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import time
from pathlib import Path

from helpers import estimate, gpus, models
from helpers.results import Result
from helpers.training import TrainSetup as T
from helpers.units import to_gib

SPEED = {
    "single bf16": T(precision="bf16", seq=4096),
    "zero2 offload": T(strategy="zero2", offload_optimizer=True, seq=128),
    "zero3 ratio 0.9, 8 GPUs": T(strategy="zero3", gpus=8, offload_optimizer=True, offload_ratio=0.9),
    "fsdp2 cpu offload, 2 GPUs": T(strategy="fsdp2", gpus=2, offload_optimizer=True, offload_params=True),
}

OFF = dict(offload_optimizer=True, pin_memory=False)          # a dry run's host is pageable
GRID = [
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", seq=128)),
    ("llama-3-8b", T(precision="bf16", adam_impl="foreach", seq=128)),
    ("llama-3-8b", T(precision="bf16-mixed", adam_impl="fused", seq=512)),
    ("llama-3-8b", T(precision="bf16", adam_impl="for-loop", batch=2, seq=1024, attention="eager")),
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", seq=4096, checkpointing="full", attention="flash")),
    ("llama-3-8b", T(precision="fp32", adam_impl="foreach", seq=256)),
    ("llama-3-8b", T(strategy="ddp", gpus=4, precision="bf16", adam_impl="fused", seq=1024)),
    ("llama-3-8b", T(strategy="zero2", seq=128, attention="flash", checkpointing="full")),
    ("llama-3-8b", T(strategy="zero2", seq=128, attention="flash", checkpointing="full", **OFF)),
    ("llama-3-8b", T(strategy="zero1", gpus=4, seq=512, checkpointing="full")),
    ("llama-3-8b", T(strategy="zero2", gpus=4, seq=2048, overlap_comm=True)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, adam_impl="fused", seq=128)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, adam_impl="fused", seq=128, offload_params=True, **OFF)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, batch=4, seq=2048, checkpointing="full",
                     attention="flash", offload_params=True, **OFF)),
    ("llama-3.2-3b", T(precision="bf16", adam_impl="fused", batch=4, seq=4096, checkpointing="full")),
    ("llama-3.2-3b", T(precision="bf16-mixed", adam_impl="for-loop", batch=2, seq=2048, checkpointing="full")),
    ("llama-3.2-3b", T(precision="fp32", adam_impl="foreach", seq=1024)),
    ("llama-3.2-3b", T(strategy="fsdp2", gpus=8, batch=4, seq=4096, checkpointing="full")),
    ("qwen2.5-32b", T(precision="bf16", adam_impl="fused", seq=512, attention="eager")),
    ("qwen2.5-32b", T(strategy="zero2", gpus=8, seq=1024, checkpointing="full", **OFF)),
    ("qwen2.5-72b", T(precision="bf16", adam_impl="foreach", seq=128)),
    ("qwen2.5-72b", T(strategy="fsdp2", gpus=8, seq=2048, checkpointing="full")),
    ("deepseek-v2-lite", T(precision="bf16", adam_impl="fused", seq=2048)),
    ("deepseek-v2-lite", T(strategy="fsdp2", gpus=4, gpus_per_node=4, batch=2, seq=1024, checkpointing="full")),
    ("deepseek-v2-lite", T(precision="bf16-mixed", adam_impl="fused", seq=1024)),
    ("deepseek-v2-lite", T(precision="fp32", adam_impl="fused", seq=512)),
    ("mixtral-8x7b", T(precision="bf16", adam_impl="fused", batch=2, seq=2048, attention="flash")),
    ("qwen1.5-moe-a2.7b", T(precision="bf16-mixed", adam_impl="fused", seq=2048)),
    ("qwen3-30b-a3b", T(precision="bf16", adam_impl="fused", batch=2, seq=2048, checkpointing="full")),
    ("qwen3-30b-a3b", T(strategy="fsdp2", gpus=8, seq=2048, checkpointing="full")),
    # FSDP2 with more ranks than experts: each rank keeps (and gathers) a whole expert, padded (fsdp2_shard)
    ("mixtral-8x7b", T(strategy="fsdp2", gpus=16, seq=256)),
    ("qwen1.5-moe-a2.7b", T(strategy="fsdp2", gpus=64, seq=256)),
    # LoRA on all-linear of an MoE: peft 0.20+ also adapts the 3-D experts, merging each weight with its delta
    ("mixtral-8x7b", T(precision="bf16", lora_rank=16, seq=256)),
    ("mixtral-8x7b", T(strategy="fsdp2", gpus=16, lora_rank=16, seq=256)),
    ("qwen3-30b-a3b", T(strategy="fsdp2", gpus=8, lora_rank=16, seq=512, checkpointing="full")),
    ("deepseek-v2-lite", T(lora_rank=16, seq=512)),
    # LoRA on target lists peft converts: every linear name (axolotl, LLaMA-Factory; DeepSeek's dense MLP names its
    # experts), one expert weight alone, and the fused pair beside attention
    ("deepseek-v2-lite", T(lora_rank=8, lora_targets="all-linear-names", seq=256)),
    ("qwen3-30b-a3b", T(lora_rank=8, lora_targets="q,k,v,o,down_proj", seq=256)),
    ("mixtral-8x7b", T(lora_rank=8, lora_targets="q,w1,w3", seq=256, checkpointing="full")),
    ("gemma-2-9b", T(precision="bf16", adam_impl="fused", seq=2048)),
    ("gemma-2-2b", T(precision="bf16-mixed", adam_impl="fused", seq=1024)),
    ("gemma-3-4b", T(precision="fp32", adam_impl="fused", seq=512)),
    ("qwen3-8b", T(precision="bf16", adam_impl="fused", batch=2, seq=4096, checkpointing="full")),
    ("phi-3-mini", T(precision="bf16-mixed", adam_impl="fused", seq=2048)),
    ("llama-3-8b", T(lora_rank=16, lora_targets="q,v", seq=2048)),
    ("qwen3-8b", T(strategy="zero2", lora_rank=16, lora_targets="q,k,v,o", seq=1024, attention="flash")),
    # gradient accumulation and selective (op-level) activation checkpointing
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", seq=1024, grad_accum=4)),
    ("llama-3-8b", T(strategy="ddp", gpus=4, seq=512, grad_accum=8, checkpointing="selective")),
    ("llama-3-8b", T(strategy="zero1", gpus=4, seq=512, grad_accum=4)),
    ("llama-3-8b", T(strategy="zero2", seq=512, grad_accum=4, **OFF)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=8, batch=2, seq=8192, checkpointing="selective")),
    ("llama-3.2-3b", T(precision="fp32", seq=1024, checkpointing="selective")),
    ("qwen2.5-32b", T(precision="bf16", adam_impl="fused", seq=1024, checkpointing="selective")),
    # FSDP2 with a tied embedding: its group (embedding and head) stays unsharded through forward and backward
    ("llama-3.2-1b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, precision="bf16", seq=128)),
    ("qwen2.5-0.5b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, seq=2048, checkpointing="full", offload_params=True,
                       **OFF)),
    # layer-level selective checkpointing: full checkpointing of every Nth layer (torchtitan's selective_ac_option)
    ("llama-3.2-3b", T(precision="bf16", adam_impl="fused", batch=2, seq=4096, checkpointing="full", checkpoint_every=2,
                       fused_ce=True, attention="flash")),
    ("llama-3-8b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, seq=2048, checkpointing="full", checkpoint_every=2)),
    ("qwen3-8b", T(precision="bf16-mixed", adam_impl="fused", seq=1024, checkpointing="full", checkpoint_every=3)),
    # tensor parallelism (torchtitan's plan; DTensor on a 2-D fake mesh); context parallelism has no dry run
    ("llama-3-8b", T(strategy="fsdp2", gpus=4, gpus_per_node=4, tensor_parallel=2, adam_impl="fused", seq=256)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=4, gpus_per_node=4, tensor_parallel=2, precision="bf16", adam_impl="fused",
                     seq=1024)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=4, gpus_per_node=4, tensor_parallel=4, seq=2048, checkpointing="full")),
    ("llama-3-8b", T(strategy="ddp", gpus=2, tensor_parallel=2, precision="bf16", adam_impl="fused", seq=512)),
    # FSDP1 (FullyShardedDataParallel, FULL_SHARD): untied and tied root units, each precision, accumulation
    ("llama-3-8b", T(strategy="fsdp1", gpus=8, seq=1024)),
    ("llama-3.2-1b", T(strategy="fsdp1", gpus=2, gpus_per_node=2, adam_impl="fused", seq=128)),
    ("qwen2.5-7b", T(strategy="fsdp1", gpus=4, gpus_per_node=4, precision="bf16", adam_impl="fused", seq=512)),
    ("llama-3.2-1b", T(strategy="fsdp1", gpus=2, precision="fp32", seq=256, checkpointing="full")),
    ("llama-3.2-1b", T(strategy="fsdp1", gpus=2, gpus_per_node=2, seq=256, grad_accum=2)),
    # LoRA under FSDP1 (peft's fsdp_auto_wrap_policy, as the HF Trainer wraps it): the first iteration's input copies
    # (use_orig_params False) and every iteration's (True), pure bf16, an MoE with attention adapters only
    ("llama-3-8b", T(strategy="fsdp1", gpus=8, lora_rank=16, seq=1024)),
    ("llama-3.2-1b", T(strategy="fsdp1", gpus=4, gpus_per_node=4, lora_rank=16, lora_dropout=0.05, seq=512,
                       use_orig_params=True)),
    ("qwen2.5-7b", T(strategy="fsdp1", gpus=4, precision="bf16", lora_rank=32, seq=1024, checkpointing="full")),
    ("mixtral-8x7b", T(strategy="fsdp1", gpus=8, lora_rank=16, lora_targets="q,v", seq=512, checkpointing="full")),
    # FSDP1 SHARD_GRAD_OP (reshard_after_forward False): every unit unsharded from its forward to its backward
    ("qwen2.5-7b", T(strategy="fsdp1", gpus=8, reshard_after_forward=False, seq=512, checkpointing="full")),
    # hybrid sharding: FSDP1's HYBRID_SHARD within 8-GPU nodes, FSDP2's HSDP (with CPU offload: the reduce-scatter
    # outputs held on the GPU), and FSDP2 keeping every group gathered from forward to backward
    ("llama-3-8b", T(strategy="fsdp1", gpus=16, hybrid_shard=True, seq=1024, checkpointing="full")),
    ("llama-3-8b", T(strategy="fsdp2", gpus=32, dp_replicate=4, seq=1024, checkpointing="full")),
    ("llama-3.2-3b", T(strategy="fsdp2", gpus=8, dp_replicate=2, seq=512, offload_params=True, **OFF)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=8, reshard_after_forward=False, seq=1024, checkpointing="full")),
    # FSDP2 accumulating under no_sync (the HF Trainer's way: unsharded fp32 gradients kept between micro batches)
    # and reduce-scattering every micro batch (torchtitan's, torchtune's: sharded gradients kept)
    ("tinyllama-1.1b", T(strategy="fsdp2", gpus=4, gpus_per_node=4, seq=512, grad_accum=2)),
    ("tinyllama-1.1b", T(strategy="fsdp2", gpus=4, gpus_per_node=4, seq=512, grad_accum=2, sync_each_batch=True)),
    # LoRA under FSDP2 (peft before fully_shard): untied and tied embeddings, bf16 and bf16-mixed, CPU offload
    ("llama-3-8b", T(strategy="fsdp2", gpus=8, precision="bf16", adam_impl="fused", lora_rank=32, seq=2048,
                     checkpointing="full", attention="flash")),
    ("llama-3.2-3b", T(strategy="fsdp2", gpus=4, gpus_per_node=4, lora_rank=32, lora_targets="q,v", seq=1024)),
    ("llama-3-8b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, lora_rank=32, seq=512, checkpointing="full",
                     offload_params=True, **OFF)),
    # QLoRA: bitsandbytes' NF4 base on fake tensors (its own quantize_4bit and default 4-bit matmul), with and
    # without double quantisation, and bitsandbytes 0.42's matmul (its input kept) re-enacted
    ("llama-3-8b", T(precision="bf16", lora_rank=16, base_weights="nf4", seq=2048)),
    ("qwen2.5-7b", T(lora_rank=16, lora_targets="q,k,v,o", base_weights="nf4-dq", batch=2, seq=1024,
                     checkpointing="full", attention="flash")),
    ("llama-3-8b", T(precision="bf16", lora_rank=16, lora_targets="q,v", lora_dropout=0.05, base_weights="nf4",
                     batch=2, seq=1024, attention="flash", versions="bitsandbytes=0.42.0")),
    # fp16 mixed precision (autocast in fp16, torch's GradScaler): QLoRA as a T4 runs it
    ("llama-3.2-3b", T(precision="fp16-mixed", lora_rank=16, base_weights="nf4-dq", batch=2, seq=1024,
                       checkpointing="full")),
    # LoRA on a float32 base under bf16 autocast (TRL's default dtype): autocast's per-matmul copies of frozen weights
    ("llama-3-8b", T(lora_rank=16, lora_dropout=0.05, base_weights="fp32", seq=1024, attention="flash")),
    ("qwen2.5-7b", T(strategy="ddp", gpus=2, lora_rank=16, lora_targets="q,v", base_weights="fp32", batch=2, seq=1024,
                     checkpointing="full")),
    # keys and values expanded to every query head before the kernel (torchtune's and LitGPT's attention)
    ("llama-3.2-1b", T(precision="bf16", lora_rank=32, lora_targets="q,v", lora_dropout=0.05, adapter_dtype="bf16",
                       batch=2, seq=512, attention="flash", kv_expanded=True)),
    ("qwen2.5-7b", T(strategy="fsdp2", gpus=4, precision="bf16", batch=2, seq=2048, checkpointing="full",
                     attention="flash", kv_expanded=True)),
    # LitGPT's fit loop: each micro batch's logits (and graph) held until the next forward returns
    ("llama-3.2-1b", T(precision="bf16", lora_rank=32, lora_targets="q,v", lora_dropout=0.05, adapter_dtype="bf16",
                       base_weights="nf4", versions="bitsandbytes=0.42.0", batch=2, seq=512, grad_accum=4,
                       attention="flash", kv_expanded=True, outputs_held=True)),
    ("qwen2.5-0.5b", T(precision="bf16", batch=2, seq=512, attention="flash", outputs_held=True)),
    # GRPO as TRL trains it (TRL 1.10 GRPOTrainer): the completion's logits alone (logits_to_keep), the entropy's copy; a reference copy
    ("qwen2.5-1.5b", T(run="grpo", batch=8, seq=1024, completion=768, checkpointing="full", attention="flash")),
    ("llama-3.2-1b", T(run="grpo", strategy="ddp", gpus=4, reference="copy", batch=4, seq=1024, grad_accum=2,
                       checkpointing="full")),
    # GRPO under DeepSpeed ZeRO-2: bf16 logits, TRL's 16-bit log_softmax per sequence, CopySlices' backward
    ("qwen2.5-1.5b", T(run="grpo", strategy="zero2", gpus=8, batch=8, seq=1536, completion=1024,
                       checkpointing="full")),
    # OpenRLHF's actor (train_ppo_ray): every position's logits in fp32, held through the step; flash-attn's Triton
    # cross-entropy, or gather less a chunked logsumexp; the entropy's softmax with --actor.entropy_coef
    ("qwen2.5-1.5b", T(run="grpo", dpo_logps="openrlhf", strategy="zero2", gpus=8, batch=2, seq=2048, completion=1536,
                       checkpointing="full", attention="flash", reference="copy")),
    ("llama-3.2-1b", T(run="grpo", dpo_logps="openrlhf", strategy="zero1", gpus=4, batch=4, seq=1024, completion=768,
                       grad_accum=2, attention="sdpa", entropy_kept=True)),
    # reward models as TRL's RewardTrainer trains them: a score head of one output, chosen and rejected in one forward
    ("qwen2.5-7b", T(run="rm", lora_rank=16, batch=2, seq=2048, checkpointing="full", attention="flash")),
    ("llama-3.2-1b", T(run="rm", strategy="ddp", gpus=4, batch=4, seq=1024, attention="flash")),
    ("qwen2.5-1.5b", T(run="rm", strategy="zero2", gpus=8, batch=4, seq=2048, attention="flash")),
    # DPO as TRL's DPOTrainer trains it: chosen and rejected in one forward, the reference's forward beside the policy's
    # logits (a frozen copy in fp32 on one GPU; in bf16 stage 0 under ZeRO-2, with bf16 logits; LoRA's base unadapted)
    ("llama-3.2-1b", T(run="dpo", batch=2, seq=1024, checkpointing="full", attention="flash")),
    ("qwen2.5-1.5b", T(run="dpo", strategy="zero2", gpus=8, batch=2, seq=2048, checkpointing="full", attention="flash")),
    ("qwen2.5-7b", T(run="dpo", strategy="zero1", gpus=4, lora_rank=16, batch=1, seq=2048, checkpointing="full",
                     attention="flash")),
    # KTO as TRL's KTOTrainer trains it: unpaired sequences, the KL batch through policy and reference under no_grad
    ("llama-3.2-1b", T(run="kto", batch=4, seq=1024, checkpointing="full", attention="flash")),
    ("qwen2.5-1.5b", T(run="kto", strategy="zero2", gpus=8, batch=4, seq=2048, lora_rank=16, checkpointing="full",
                       attention="flash")),
]


def bench_estimate() -> None:
    print(f"{'model':18s}{'set-up':28s}{'median ms':>10s}{'max ms':>9s}")
    for name in models.catalogue():
        models.spec(name)                      # the one-time meta build is not what a slider pays
        for label, setup in SPEED.items():
            times = []
            for _ in range(50):
                t = time.perf_counter()
                estimate.run(name, setup)
                times.append((time.perf_counter() - t) * 1e3)
            print(f"{name:18s}{label:28s}{statistics.median(times):10.3f}{max(times):9.3f}")


def _label(name: str, s: T) -> str:
    opts = [s.strategy + (f"x{s.gpus}" if s.gpus > 1 else ""), s.precision, s.adam, f"b{s.batch}", f"s{s.seq}", s.attention]
    opts += [f"tp{s.tensor_parallel}"] * (s.tensor_parallel > 1) + [f"cp{s.context_parallel}"] * (s.context_parallel > 1)
    opts += [{"none": "", "full": "ckpt", "selective": "sac"}[s.checkpointing]] * (s.checkpointing != "none")
    opts += [f"every{s.checkpoint_every}"] * (s.checkpoint_every > 1)
    opts += [f"accum{s.grad_accum}"] * (s.grad_accum > 1)
    opts += ["sync-each"] * (s.sync_each_batch and s.grad_accum > 1 and s.strategy in ("fsdp1", "fsdp2"))
    opts += [("offload-opt+params" if s.offload_params and not s.strat.offload_together else "offload")] * s.offload_optimizer
    opts += [f"ratio{s.offload_ratio}"] * (s.offload_ratio is not None)
    opts += [f"lora{s.lora_rank}" + ("" if s.lora_targets == "all-linear" else f"[{s.lora_targets}]")] * bool(s.lora_rank)
    opts += [s.base_weights] * bool(s.base_weights)
    opts += ["kv-expanded"] * s.kv_expanded + ["outputs-held"] * s.outputs_held
    opts += ["orig-params"] * s.use_orig_params
    opts += [("shard-grad-op" if s.strategy == "fsdp1" else "no-reshard")] * (not s.reshard_after_forward)
    opts += ["hybrid-shard"] * s.hybrid_shard + [f"hsdp{s.dp_replicate}"] * (s.dp_replicate > 1)
    opts += [s.run] * (s.run != "sft") + [f"completion{s.completion_tokens}"] * (s.run == "grpo")
    opts += [f"ref-{s.ref}"] * (s.ref not in (None, "none"))
    opts += ["openrlhf"] * (s.dpo_logps == "openrlhf") + ["entropy"] * s.entropy_kept
    return f"{name} " + " ".join(opts)


FLOOR = 16 * 2**20   # below 16 MiB a difference is scalars (optimizer step counters, losses), not a buffer


def compare(est: Result, dry: Result) -> tuple[float, float]:
    """(largest relative difference of a peak, of a phase), over GPU and host; differences under FLOOR count 0."""
    peak, phase = 0.0, 0.0
    for dev in ("gpu", "host"):
        e, d = est.device(dev), dry.device(dev)
        rel = lambda a, b: abs(a - b) / max(a, b) if abs(a - b) > FLOOR else 0.0
        peak = max(peak, rel(e.peak_bytes, d.peak_bytes))
        phase = max([phase] + [rel(e.phases[p], d.phases[p]) for p in d.phases])
    return peak, phase


def selected(rows: list, only: str | None) -> list:
    """The rows with a word of their printed label starting with `only` (e.g. 'tp', 'fsdp1'); all when None."""
    return [(n, s) for n, s in rows if only is None or any(w.startswith(only) for w in _label(n, s).split())]


def bench_dryrun(save: bool = True, only: str | None = None) -> None:
    """The dry-run benchmark; `only`: just the GRID rows whose label contains it (e.g. 'tp'), nothing saved."""
    from helpers.measure import dryrun

    if only is not None:
        _grid_rows(selected(GRID, only), save, merge=True)
        return
    print("1. Llama-3-8B, bf16, fused AdamW, batch 1, seq 128, sdpa: our tracker against torch's MemTracker")
    s = T(precision="bf16", adam_impl="fused", seq=128)
    untracked = dryrun.run("llama-3-8b", s, progress=False, track=False).meta["step_s"]
    ours = dryrun.run("llama-3-8b", s, progress=False)
    mt_peak, mt_s = _memtracker_peak("llama-3-8b", s)
    print(f"   peak: ours {to_gib(ours.gpu.peak_bytes):.2f} GiB, MemTracker {to_gib(mt_peak):.2f} GiB, "
          f"difference {abs(ours.gpu.peak_bytes - mt_peak) / mt_peak:.2%}")
    print(f"   time of the steps: untracked {untracked:.1f} s, ours {ours.meta['step_s']:.1f} s "
          f"({ours.meta['step_s'] / untracked:.1f}x), MemTracker {mt_s:.1f} s")
    print("2. Qwen2.5-72B dry run (bf16, foreach AdamW, batch 1, seq 128)")
    q = dryrun.run("qwen2.5-72b", T(precision="bf16", seq=128), progress=False)
    print(f"   wall {q.meta['wall_s']:.1f} s (build + steps), peak {to_gib(q.gpu.peak_bytes):.2f} GiB")
    print("3. FSDP2 with CPU offload, Llama-3-8B on 2 GPUs (bf16-mixed, fused AdamW, batch 1, seq 128)")
    f = dryrun.run("llama-3-8b", GRID[12][1], progress=False)
    print(f"   per GPU {to_gib(f.gpu.peak_bytes):.2f} GiB; host {to_gib(f.host.peak_bytes) / 2:.2f} GiB per rank "
          f"({to_gib(f.host.peak_bytes):.2f} GiB per node of 2)")
    print("4. Estimate against dry run (peaks per device; worst phase), GiB")
    _grid_rows(GRID, save, ours.meta)


def _grid_rows(grid, save: bool, meta=None, merge: bool = False) -> None:
    """Estimate and dry-run each set-up of `grid`, print the table, save it (`merge`: these rows replace their
    own set-ups' rows in the saved file, the others are kept)."""
    from helpers.measure import dryrun

    print(f"   {'set-up':72s}{'GPU est':>9s}{'GPU dry':>9s}{'host est':>9s}{'host dry':>9s}{'peak':>7s}{'phase':>7s}")
    rows, worst = [], 0.0
    for name, setup in grid:
        e, d = estimate.run(name, setup, lifecycle=False), dryrun.run(name, setup, progress=False)
        peak, phase = compare(e, d)
        worst = max(worst, phase)
        print(f"   {_label(name, setup):72s}{to_gib(e.gpu.peak_bytes):9.2f}{to_gib(d.gpu.peak_bytes):9.2f}"
              f"{to_gib(e.host.peak_bytes):9.2f}{to_gib(d.host.peak_bytes):9.2f}{peak:7.1%}{phase:7.1%}")
        rows.append({"model": name, "setup": d.setup, "estimate": e.to_dict(), "dry_run": d.to_dict(),
                     "peak_rel_diff": peak, "worst_phase_rel_diff": phase})
    print(f"   {len(grid)} set-ups; largest difference of any phase: {worst:.2%} (target: within 3%; "
          f"differences under 16 MiB count as none)")
    if save:
        path = _save(rows, meta or rows[-1]["dry_run"]["meta"], merge)
        print(f"   saved {path}")


def _save(rows, meta, merge: bool = False) -> str:
    import json

    from helpers.files import write_text_atomically

    out = models.DATA_DIR / "results" / "dryrun_vs_estimate.json"
    if merge and out.exists():
        # keyed on the whole set-up, defaults filled in: a row written before a field existed is the same set-up
        key = lambda r: (r["model"], json.dumps(dataclasses.asdict(T(**r["setup"])), sort_keys=True))
        new = {key(r) for r in rows}
        rows = [r for r in json.loads(out.read_text())["rows"] if key(r) not in new] + rows
    doc = {"about": "python -m helpers.bench dryrun: estimate and dry run of each set-up (GiB = 2^30 bytes)",
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": meta["versions"],
           "device": meta["device"], "machine": meta["machine"], "rows": rows}
    write_text_atomically(out, json.dumps(doc, indent=1))
    return str(out.relative_to(models.DATA_DIR.parent))


def _memtracker_peak(name: str, setup: T) -> tuple[int, float]:
    """torch's own MemTracker on the same fake step (one iteration): its peak bytes on the GPU, and its time."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from helpers.measure import dryrun, fakegpu

    m, dev = models.spec(name), fakegpu.device()
    with FakeTensorMode(allow_non_fake_inputs=True):
        net = dryrun.build_model(m, setup, dev)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=setup.adam == "fused", foreach=setup.adam == "foreach")
        ids = torch.randint(0, m.vocab, (setup.batch, setup.seq), device=dev)
        mt = MemTracker()
        mt.track_external(net, opt)
        t = time.perf_counter()
        with mt:
            net(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        elapsed = time.perf_counter() - t
    peak = sum(v for d, cats in mt.get_tracker_snapshot("peak").items() if d.type != "cpu"
               for k, v in cats.items() if k == "Total")
    return peak, elapsed


SCALED = [
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", batch=2, seq=128)),
    ("llama-3-8b", T(strategy="ddp", precision="bf16-mixed", adam_impl="foreach", batch=2, seq=128)),
    ("llama-3-8b", T(strategy="zero2", batch=2, seq=128, attention="flash", checkpointing="full")),
    ("llama-3-8b", T(strategy="zero2", batch=2, seq=128, attention="flash", checkpointing="full",
                     offload_optimizer=True)),
    ("qwen2.5-72b", T(strategy="zero3", batch=2, seq=128, offload_optimizer=True, offload_ratio=0.9,
                      sub_group_size=50_000_000)),
    ("qwen2.5-72b", T(strategy="zero3", batch=2, seq=128, offload_optimizer=True, offload_params=True)),
    ("llama-3.2-3b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, batch=2, seq=256, checkpointing="full")),
    ("llama-3-8b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, batch=2, seq=128, offload_optimizer=True,
                     offload_params=True)),
    ("mixtral-8x7b", T(precision="bf16", batch=2, seq=128)),
    ("qwen1.5-moe-a2.7b", T(precision="bf16-mixed", batch=2, seq=128)),
    ("qwen3-30b-a3b", T(precision="bf16", batch=2, seq=128)),
    ("deepseek-v2-lite", T(precision="fp32", batch=2, seq=128)),
    ("gemma-2-2b", T(precision="bf16", batch=2, seq=128)),
    ("gemma-3-1b", T(precision="bf16-mixed", batch=2, seq=128)),
    ("llama-3-8b", T(lora_rank=8, lora_targets="q,v", batch=2, seq=128)),
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", batch=2, seq=128, grad_accum=4)),
    ("llama-3-8b", T(strategy="ddp", precision="bf16-mixed", batch=2, seq=128, grad_accum=4)),
    ("llama-3-8b", T(strategy="zero2", batch=2, seq=128, grad_accum=4)),
    ("llama-3-8b", T(strategy="zero2", batch=2, seq=128, grad_accum=4, offload_optimizer=True)),
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", batch=2, seq=256, checkpointing="selective")),
    ("llama-3-8b", T(strategy="zero2", batch=2, seq=256, checkpointing="selective")),
    ("llama-3.2-3b", T(strategy="fsdp2", gpus=2, gpus_per_node=2, batch=2, seq=256, grad_accum=2,
                       checkpointing="selective")),
    ("llama-3.2-3b", T(strategy="fsdp1", gpus=2, gpus_per_node=2, batch=2, seq=256, checkpointing="full")),
    ("llama-3-8b", T(strategy="fsdp1", gpus=2, gpus_per_node=2, batch=2, seq=128, offload_optimizer=True,
                     offload_params=True)),
    ("llama-3.2-1b", T(strategy="fsdp1", gpus=2, gpus_per_node=2, batch=2, seq=128, grad_accum=2)),
    # QLoRA: bitsandbytes' NF4 base, quantised and multiplied for real on this CPU (helpers.measure.nf4)
    ("llama-3-8b", T(precision="bf16", lora_rank=8, base_weights="nf4", batch=2, seq=128)),
    ("qwen3-8b", T(lora_rank=8, base_weights="nf4-dq", batch=2, seq=128, checkpointing="full")),
    ("llama-3.2-3b", T(strategy="ddp", precision="bf16", lora_rank=8, lora_targets="q,v", base_weights="nf4",
                       batch=2, seq=128)),
]


SCALED_FLOOR = 8 * 2**10    # a twin's phase with only the model's buffers (rotary inv_freq, a few KiB, not modelled)


def bench_scaled(only: str | None = None) -> None:
    """Each engine trains its tiny twin for real here (`only`: the rows `selected` keeps); the estimate of the same
    twin beside it."""
    from helpers.measure import scaled

    print("Scaled runs on this CPU (placement by role), MiB = 2^20 bytes; estimate of the same twin and set-up")
    print(f"   {'set-up':64s}{'GPU est':>9s}{'GPU meas':>9s}{'host est':>9s}{'host meas':>10s}{'peak':>7s}{'phase':>7s}"
          f"{'loss first->last':>18s}{'RSS MiB':>9s}{'s':>6s}")
    worst_all = worst_phase = 0.0
    for name, setup in selected(SCALED, only):
        r = scaled.run(name, setup)
        twin, s = scaled.scaled_setup(name, setup)
        e = estimate.run(str(twin), s, lifecycle=False)
        worst = max(abs(e.device(d).peak_bytes - r.device(d).peak_bytes) / max(r.device(d).peak_bytes, 1)
                    for d in ("gpu", "host") if r.device(d).peak_bytes or e.device(d).peak_bytes)
        phase = max(abs(e.device(d).phases[p] - v) / max(v, 1) if abs(e.device(d).phases[p] - v) > SCALED_FLOOR else 0.0
                    for d in ("gpu", "host") for p, v in r.device(d).phases.items() if v or e.device(d).phases[p])
        worst_all, worst_phase = max(worst_all, worst), max(worst_phase, phase)
        mib = lambda b: b / 2**20
        losses = r.meta["losses"]
        print(f"   {_label(name, setup):64s}{mib(e.gpu.peak_bytes):9.2f}{mib(r.gpu.peak_bytes):9.2f}"
              f"{mib(e.host.peak_bytes):9.2f}{mib(r.host.peak_bytes):10.2f}{worst:7.1%}{phase:7.1%}"
              f"{f'{losses[0]:.3f}->{losses[-1]:.3f}':>18s}{max(r.meta['rss_bytes'].values()) / 2**20:9.0f}"
              f"{r.meta['wall_s']:6.1f}")
    print(f"   largest difference of a peak: {worst_all:.1%} (target: within 10%); of any phase: {worst_phase:.1%} "
          f"(differences under {SCALED_FLOOR // 1024} KiB count as none)")


def bench_explorer() -> None:
    """Median time of one explorer update: the estimate, the figure's update, and a full redraw (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    from helpers import explore

    e = explore.explorer(case=1)
    moves = [dict(batch=b) for b in (2, 4, 8, 16, 1)] + [dict(seq=q) for q in (256, 1024, 4096, 128)]
    moves += [dict(offload_optimizer=v) for v in (True, False)] + [dict(checkpointing=v) for v in ("none", "full")]
    moves += [dict(strategy="zero3", gpus=8), dict(offload_ratio=1.0), dict(offload_ratio=0.5), dict(offload_ratio=None)]
    times = []
    for _ in range(3):
        for move in moves:
            t = time.perf_counter()
            e.set(**move)                     # Agg's draw_idle draws at once: this is estimate + update + redraw
            times.append((time.perf_counter() - t) * 1e3)
    print(f"explorer update (estimate + figure update + full redraw), {len(times)} moves: median "
          f"{statistics.median(times):.1f} ms, max {max(times):.1f} ms (target: median under 100 ms)")


def bench_allocator() -> None:
    """Allocated, modelled reserved (default and expandable segments) and fragmentation per set-up, GiB."""
    from helpers import cases, published
    from helpers.measure import dryrun

    print("1. The caching-allocator model against a published reserved figure")
    row = published.reserved("llama-3.2-3b")
    s = T(**row["setup"])
    d = dryrun.run("llama-3.2-3b", s, progress=False)
    got, want = max(d.gpu.reserved.values()), row["accelerator_memory_max"]
    print(f"   Llama-3.2-3B, {_label('llama-3.2-3b', s)}: allocated {to_gib(d.gpu.peak_bytes):.2f} GiB, modelled "
          f"reserved {to_gib(got):.2f} GiB, PEFT reports {to_gib(want):.2f} GiB reserved ({got / want - 1:+.1%})")
    print("2. Replay speed: Qwen2.5-72B, bf16, foreach AdamW, batch 1, seq 128")
    q = dryrun.run("qwen2.5-72b", T(precision="bf16", seq=128), progress=False)
    a = q.meta["allocator"]
    print(f"   {a['events']} events replayed in {a['replay_s']:.2f} s (the dry run's steps: {q.meta['step_s']:.1f} s; "
          f"wall {q.meta['wall_s']:.1f} s); reserved {to_gib(max(q.gpu.reserved.values())):.2f} GiB for "
          f"{to_gib(q.gpu.peak_bytes):.2f} GiB allocated")
    print("3. Each case's GPU verdict re-checked on the device total (reserved + CUDA context + NCCL), GiB")
    print(f"   {'case':10s}{'allocated':>10s}{'reserved':>10s}{'frag':>7s}{'+context':>10s}{'capacity':>10s}  verdict "
          f"(allocated -> device total)")
    for n in range(1, 7):
        c = cases.case(n)
        for fixed in (False, True):
            x = dryrun.recheck(c["model"], cases.setup(n, fixed=fixed))
            res = (f"{to_gib(x['reserved']):10.2f}{to_gib(x['reserved'] - x['allocated']):7.2f}"
                   if x["reserved"] is not None else f"{'-':>10s}{'-':>7s}")
            word = {True: "fits", False: "OOM"}
            print(f"   {n} {'fixed' if fixed else 'as run':8s}{to_gib(x['allocated']):10.2f}{res}"
                  f"{to_gib(x['device_total']):10.2f}{to_gib(x['capacity'] or 0):10.1f}  {word[x['fits_allocated']]} -> "
                  f"{word[x['fits_device']]}{' (FLIPS: ' + x['part'] + ')' if x['flipped'] else ''}"
                  f"{'' if x['reserved'] is not None else ' [estimate: no dry run]'}")
    print("4. The grid: allocated (tensors), modelled reserved, fragmentation (reserved - allocated) at the peaks, and "
          "the reserve under expandable_segments:True, GiB")
    print(f"   {'set-up':72s}{'alloc':>8s}{'reserved':>9s}{'frag':>7s}{'expand.':>9s}{'replay s':>9s}")
    for name, setup in GRID:
        d = dryrun.run(name, setup, progress=False)
        r, e = max(d.gpu.reserved.values()), max(d.meta["allocator"]["reserved_expandable"].values())
        print(f"   {_label(name, setup):72s}{to_gib(d.gpu.peak_bytes):8.2f}{to_gib(r):9.2f}"
              f"{to_gib(r - d.gpu.peak_bytes):7.2f}"
              f"{to_gib(e):9.2f}{d.meta['allocator']['replay_s']:9.3f}")


def bench_fit() -> None:
    """For each case's set-up as run and with its fix: the largest micro batch and sequence that fit, how many
    estimates each search took and its wall time; then the ways out of case 1 and their count and time."""
    from helpers import cases, fit, fixes

    print("fit: the largest micro batch / sequence (multiples of 64) that fits each case's capacities; estimates = "
          "how many the search ran")
    print(f"   {'case':10s}{'vary':6s}{'answer':>8s}{'next':>8s}{'estimates':>10s}{'ms':>8s}{'ms/estimate':>12s}  "
          f"what stops the next")
    times = []
    for n in range(1, 7):
        c = cases.case(n)
        models.spec(c["model"])                # the one-time model build (transformers' meta model) is not timed
        for fixed in (False, True):
            setup = cases.setup(n, fixed=fixed)
            for vary in ("batch", "seq"):
                f = fit.largest(c["model"], setup, vary)
                times.append(f.seconds / f.estimates)
                print(f"   {n} {'fixed' if fixed else 'as run':8s}{vary:6s}{f.value:8d}{str(f.next_value):>8s}"
                      f"{f.estimates:10d}{f.seconds * 1000:8.1f}{f.seconds / f.estimates * 1000:12.2f}  "
                      f"{f.why[:90]}")
    print(f"   per estimate: median {statistics.median(times) * 1000:.2f} ms, max {max(times) * 1000:.2f} ms")
    for n in (1, 2):
        c = cases.case(n)
        started = time.perf_counter()
        ways = fixes.ways_out(c["model"], cases.setup(n))
        took = time.perf_counter() - started
        print(f"fixes, case {n} ({c['model']}): {len(ways)} ways out, {sum(w.fits for w in ways)} fit, "
              f"{took * 1000:.0f} ms; first: " + "; ".join(f"{w.name} ({w.peak_gib:.1f} GiB per GPU, host "
                                                            f"{w.host_gib_added:+.1f} GiB)" for w in ways[:3]))


def bench_published(save: bool = True) -> None:
    """Published runs' peaks beside ours, like with like (helpers.published_runs), GiB; recorded in data/results/."""
    from helpers import published, published_runs
    from helpers.measure import dryrun

    print("Published peaks beside ours, like with like (GiB = 2^30 bytes; a published GB is 10^9 bytes, converted)")
    print(f"   {'run':30s}{'view':>10s}{'published':>10s}{'est alloc':>10s}{'dry alloc':>10s}{'dry rsvd':>10s}"
          f"{'like for like':>24s}{'tensors alone':>15s}")
    rows, meta = [], None
    for row in published.peaks():
        d = dryrun.run(row["model"], published_runs.setup(row), progress=False)
        c, meta = published_runs.compare(row["id"], dry=d), d.meta
        o = c["ours"]
        short = {"estimate_allocated": "est", "dry_run_allocated_blocks": "dry", "dry_run_reserved": "dry reserved"}
        like = ", ".join(f"{short[k]} {v:+.1%}" for k, v in c["like_for_like"].items())
        unlike = f"{c['tensors_vs_published']['dry_run_allocated']:+.1%}" if c["tensors_vs_published"] else "-"
        print(f"   {row['id']:30s}{row['view']:>10s}{to_gib(row['bytes']):10.2f}{to_gib(o['estimate_allocated']):10.2f}"
              f"{to_gib(o['dry_run_allocated_blocks']):10.2f}{to_gib(o['dry_run_reserved']):10.2f}{like:>24s}{unlike:>15s}")
        print(f"      {_label(row.get('model_file', row['model']), published_runs.setup(row))}; published "
              f"{row['figure']} {row['unit']} "
              f"({row['stat'].split(' ')[0]}) on {row['gpu']}")
        print(f"      source: {row['source']} ({row['url']})")
        for why in row["not_modelled"]:
            print(f"      not modelled: {why}")
        rows.append(c)
    like = [(c["id"], c["like_for_like"].get("estimate_allocated", c["like_for_like"].get("dry_run_reserved")))
            for c in rows]
    under = [f"{i} ({v:+.0%})" for i, v in like if v < -0.10]
    sources = {published.peak(c["id"])["url"].split("/")[4] for c in rows}
    print(f"   like with like (the estimate against allocated peaks, the dry run's modelled reserve against reserved "
          f"ones): {sum(abs(v) <= 0.10 for _, v in like)} of {len(like)} within 10%, from {len(sources)} sources; "
          f"under by more than 10%: {', '.join(under) or 'none'}")
    if save:
        import json

        from helpers.files import write_text_atomically

        out = models.DATA_DIR / "results" / published_runs.RESULTS_FILE
        doc = {"about": "python -m helpers.bench published: published peaks (data/published.json 'peaks') beside the "
                        "estimate and the dry run of the same set-up, like with like (bytes; GiB = 2^30 bytes)",
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": meta["versions"],
               "device": meta["device"], "machine": meta["machine"], "rows": rows}
        write_text_atomically(out, json.dumps(doc, indent=1))
        print(f"   saved {out.relative_to(models.DATA_DIR.parent)}")


GPU_GRID = [          # one process each, in this order (the cheap and the telling first); (model, set-up, alloc conf)
    ("qwen2.5-0.5b", T(precision="bf16", batch=2, seq=512, attention="flash", outputs_held=True), None),
    ("llama-3.2-3b", T(precision="bf16", adam_impl="fused", batch=4, seq=4096, checkpointing="full", attention="flash"),
     None),
    ("llama-3-8b", T(lora_rank=16, lora_targets="q,v", seq=2048), None),
    ("llama-3-8b", T(precision="bf16", adam_impl="fused", seq=128), None),
    ("llama-3.2-1b", T(precision="bf16-mixed", batch=8, seq=2048), None),
    ("llama-3.2-1b", T(precision="bf16-mixed", batch=8, seq=2048), "expandable_segments:True"),
    ("llama-3-8b", T(precision="bf16", adam_impl="foreach", seq=128), None),
    ("llama-3-8b", T(precision="bf16-mixed", adam_impl="fused", seq=512), None),
    ("llama-3.2-3b", T(precision="fp32", adam_impl="foreach", seq=1024), None),
    ("gemma-2-2b", T(precision="bf16-mixed", adam_impl="fused", seq=1024), None),
    ("llama-3-8b", T(lora_rank=16, lora_dropout=0.05, base_weights="fp32", seq=1024, attention="flash"), None),
    ("qwen3-8b", T(precision="bf16", adam_impl="fused", batch=2, seq=4096, checkpointing="full", attention="flash"),
     None),
    ("llama-3.2-3b", T(precision="bf16-mixed", adam_impl="for-loop", batch=2, seq=2048, checkpointing="full"), None),
    # QLoRA on bitsandbytes' CUDA kernels, the preference and reward runs with their reference, OpenRLHF's actor at
    # case 7's 26,048 tokens (its per-GPU logits: the sharding does not change them), fp16 with its GradScaler
    ("llama-3-8b", T(lora_rank=16, base_weights="nf4-dq", seq=2048, checkpointing="full"), None),
    ("llama-3-8b", T(lora_rank=64, base_weights="nf4", batch=2, seq=1024), None),
    ("llama-3.2-1b", T(run="dpo", batch=2, seq=1024), None),
    ("llama-3-8b", T(run="dpo", lora_rank=16, batch=2, seq=1024, checkpointing="full"), None),
    ("llama-3.2-1b", T(run="kto", precision="bf16", adam_impl="fused", batch=4, seq=1024), None),
    ("qwen2.5-1.5b", T(run="rm", batch=4, seq=1024), None),
    ("qwen2.5-7b", T(run="grpo", dpo_logps="openrlhf", precision="bf16", adam_impl="fused", seq=26048, completion=13024,
                     attention="flash", checkpointing="full"), None),
    ("qwen2.5-1.5b", T(run="grpo", dpo_logps="openrlhf", precision="bf16", adam_impl="fused", batch=2, seq=26048,
                       completion=13024, attention="flash", checkpointing="full"), None),
    ("llama-3.2-1b", T(precision="fp16-mixed", batch=4, seq=2048), None),
]


def grid_rows(spec: str | None) -> list[int]:
    """GPU_GRID's row numbers from '13-21,0-12' (ranges and single numbers, in the order given); None: all, in order.
    InputError naming the part that is not a row number of the grid."""
    from helpers.errors import InputError

    if spec is None:
        return list(range(len(GPU_GRID)))
    out = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            got = range(int(lo), int(hi or lo) + 1)
        except ValueError:
            got = range(0)
        if not got or got[0] < 0 or got[-1] >= len(GPU_GRID):
            raise InputError(f"--rows: {part.strip()!r} is not a row or range of rows of the GPU grid (0 to "
                             f"{len(GPU_GRID) - 1}, e.g. '13-21,0-12')")
        out.extend(got)
    return out


def bench_gpu(out: str | None = None, rows: str | None = None, row_timeout: int = 240) -> int:
    """The GPU_GRID set-ups `rows` names (grid_rows; all by default) for real on this CUDA GPU (`helpers.measure.gpu`:
    torch.cuda's peaks per phase, the device's used bytes, the tracker's census, an OOM caught), one process per
    set-up so each starts from an empty device; the rows are written after each run to `out` (default
    data/results/gpu_runs_<preset>.json, gpus.runs_file), each with its grid row. 2 without CUDA."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    import torch

    from helpers.files import write_text_atomically
    from helpers.measure.fakegpu import CUDA_PROCESS_ENV

    order = grid_rows(rows)
    if not torch.cuda.is_available():
        print(f"bench gpu: needs a CUDA GPU and this machine has none (torch {torch.__version__}); the recorded runs "
              f"are compared here with `python -m helpers.bench gpu-compare`")
        return 2
    path = models.DATA_DIR / "results" / gpus.runs_file(torch.cuda.get_device_name()) if out is None else Path(out)
    doc = {"about": "python -m helpers.bench gpu: full-size training steps for real on one GPU (helpers.measure.gpu), "
                    "one process per set-up; bytes (GiB = 2^30 bytes)",
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "versions": _versions(), "rows": []}
    kept = _kept_rows(path, doc["device"], order)
    if kept:
        print(f"bench gpu: keeping {len(kept)} recorded row(s) of {path.name} that this run does not repeat")
    for i in order:
        name, setup, conf = GPU_GRID[i]
        env = dict(os.environ, **{CUDA_PROCESS_ENV: "1"}, **({"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}))
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            got = Path(tmp) / "result.json"
            try:
                proc = subprocess.run([sys.executable, "-m", "helpers.bench", "gpu-row", "--row", str(i), "--out",
                                       str(got)], env=env, capture_output=True, text=True, timeout=row_timeout)
                err = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
                tail = None if proc.returncode == 0 else proc.stderr.strip().splitlines()[-40:]
            except subprocess.TimeoutExpired:
                err, tail = f"timed out after {row_timeout} s", None
            result = json.loads(got.read_text()) if got.exists() else None
        row = {"grid_row": i, "model": name, "setup": dataclasses.asdict(setup), "alloc_conf": conf, "result": result,
               "error": err, "process_s": round(time.perf_counter() - started, 1)} | ({"stderr_tail": tail} if tail else {})
        doc["rows"].append(row)
        write_text_atomically(path, json.dumps(doc | {"rows": sorted(kept + doc["rows"], key=lambda r: r["grid_row"])},
                                               indent=1))
        if result is None:
            print(f"{_label(name, setup):72s} failed: {err}", flush=True)
            continue
        m = gpu_measured(result)
        print(f"{_label(name, setup) + (' ' + conf if conf else ''):72s} allocated {to_gib(m['allocated']):6.2f} "
              f"reserved {to_gib(m['reserved']):6.2f} census {to_gib(Result.from_dict(result).gpu.peak_bytes):6.2f} GiB"
              f"{' OOM in ' + m['oom_phase'] if m['oom_phase'] else ''} ({row['process_s']} s)", flush=True)
    print(f"saved {path}")
    return 0


def _kept_rows(path: Path, device: str, order: list[int]) -> list[dict]:
    """The rows of an earlier record at `path` on the same GPU that a run of the grid rows `order` does not repeat
    (each with its grid row: the position in the file where an older record has none), so that a subset run adds to
    the record instead of replacing it."""
    import json

    if not path.exists():
        return []
    old = json.loads(path.read_text())
    if old.get("device") != device:
        return []
    rows = [r if "grid_row" in r else {"grid_row": i, **r} for i, r in enumerate(old["rows"])]
    return [r for r in rows if r["grid_row"] not in order]


def gpu_list() -> None:
    """The GPU grid's rows, numbered as --rows takes them."""
    for i, (name, setup, conf) in enumerate(GPU_GRID):
        print(f"{i:3d}  {_label(name, setup)}{' ' + conf if conf else ''}")


def _versions() -> dict:
    """The libraries a GPU run went through (a missing one left out), CUDA's version and the driver's."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from helpers import provenance

    out = provenance.versions()
    for name in ("peft", "accelerate", "bitsandbytes"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    try:
        import subprocess
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        driver = None
    return out | {"cuda": torch.version.cuda, "driver": driver}


def gpu_row(i: int, out: str) -> None:
    """One GPU_GRID row measured on this GPU, its Result written to `out` (JSON)."""
    import json

    from helpers.files import write_text_atomically
    from helpers.measure import gpu

    name, setup, _ = GPU_GRID[i]
    write_text_atomically(Path(out), json.dumps(gpu.run(name, setup).to_dict()))


def gpu_measured(result: dict) -> dict:
    """What a recorded GPU run measured (bytes): torch.cuda's peak allocated over its training phases (setup's apart:
    the model built from its config on the GPU, whose transients are the builder's, not a user's loading: see
    helpers.measure.gpu._build) and reserved over all, the bytes outside the allocator (CUDA context and the rest), the
    device's capacity, the phase an OOM happened in (None: it ran), and 'builder_peak': setup's peak above every
    training phase's, so that the reserved bytes hold the builder's cached segments."""
    stats = result["meta"]["cuda_stats"]
    oom = result["meta"].get("oom_observed")
    training = [v for p, v in stats.items() if p != "setup"] or list(stats.values())
    allocated = max(v.get("max_allocated", 0) for v in training)
    setup = stats.get("setup", {}).get("max_allocated", 0)
    return {"allocated": allocated, "setup_allocated": setup, "builder_peak": setup > allocated,
            "reserved": max(v.get("max_reserved", 0) for v in stats.values()),
            "outside_allocator": max(v.get("outside_allocator", 0) for v in stats.values()),
            "oom_phase": oom["phase"] if oom else None, "capacity": result["gpu"]["capacity_bytes"]}


def bench_gpu_compare() -> None:
    """Each GPU's recorded runs (data/results/gpu_runs*.json) beside the estimate and the dry run of the same set-ups
    on the same GPU preset: allocated, reserved, the device total (what nvidia-smi shows) and the verdicts, GiB."""
    import json

    for path in gpus.run_files():
        compare_gpu_runs(json.loads(path.read_text()))


def compare_gpu_runs(doc: dict) -> None:
    """One GPU's recorded runs (a gpu_runs*.json document) beside the estimate and the dry run (bench_gpu_compare)."""
    from helpers.measure import dryrun
    from helpers.units import GiB

    preset = gpus.preset_of(doc["device"])
    cap_gib = gpus.preset(preset)["gib"]
    print(f"GPU runs on {doc['device']} ({doc['date']}, torch {doc['versions']['torch']}; preset {preset}, "
          f"{cap_gib:.2f} GiB) beside the estimate and the dry run of the same set-up; GiB = 2^30 bytes. Measured: "
          f"torch.cuda's peaks, and the device total = reserved + the bytes outside the allocator (mem_get_info)")
    print(f"   {'set-up':64s}{'alloc':>7s}{'est':>7s}{'diff':>7s}{'rsvd':>7s}{'dry':>7s}{'diff':>7s}{'total':>7s}"
          f"{'dry':>7s}{'diff':>7s}  verdicts (ran / dry run's device total)")
    diffs = {"allocated": [], "reserved": [], "total": []}
    for row in doc["rows"]:
        setup = T(**row["setup"])
        label = _label(row["model"], setup) + (" expandable" if row["alloc_conf"] else "")
        if row["result"] is None:
            print(f"   {label:64s} no result: {row['error']}")
            continue
        m = gpu_measured(row["result"])
        e = estimate.run(row["model"], setup)
        x = dryrun.recheck(row["model"], setup.replace(gpu_gib=cap_gib), gpu=preset, alloc_conf=row["alloc_conf"])
        total = m["reserved"] + m["outside_allocator"]
        ran = "OOM in " + m["oom_phase"] if m["oom_phase"] else "ran"
        dry = "fits" if x["fits_device"] else f"OOM ({x['part']})"
        cells = [(m["allocated"], e.gpu.peak_bytes, "allocated"), (m["reserved"], x["reserved"], "reserved"),
                 (total, x["device_total"], "total")]
        line = ""
        for got, ours, key in cells:
            if m["oom_phase"] or (m["builder_peak"] and key != "allocated"):
                line += f"{to_gib(got):7.2f}{to_gib(ours):7.2f}{'-':>7s}"
                continue
            diffs[key].append(ours / got - 1)
            line += f"{to_gib(got):7.2f}{to_gib(ours):7.2f}{ours / got - 1:+7.1%}"
        print(f"   {label:64s}{line}  {ran} / {dry}")
        if m["builder_peak"]:
            print(f"      setup peaked at {to_gib(m['setup_allocated']):.2f} GiB: the model made whole in 16 bits on the "
                  f"GPU before bitsandbytes quantised it (the builder's, not a user's loading); the reserved bytes "
                  f"keep its segments, so reserved and total are not compared")
    print("   columns: alloc/rsvd/total = the GPU's allocated peak over the training phases, reserved peak and device "
          "total; est = the estimate; dry = the dry run (allocator model; its total adds the context and cuBLAS's "
          "workspaces); diff = ours / the GPU's - 1")
    died = sum(1 for r in doc["rows"] if r["result"] and gpu_measured(r["result"])["oom_phase"])
    for key, v in diffs.items():
        if v:
            left = ("the one that died left out" if died == 1 else f"{died} that died left out" if died else
                    "none died")
            print(f"   {key}: ours against the GPU's, {len(v)} runs ({left}): median "
                  f"{statistics.median(v):+.2%}, lowest {min(v):+.2%}, highest {max(v):+.2%}")
    print(f"   context outside the allocator: {gpus.cuda_context(preset)['mib']:.0f} MiB, the largest these same runs "
          f"measured (so the totals' agreement is partly built in: the reserved column is the independent check); "
          f"cuBLAS workspaces {gpus.cublas_workspaces(preset)['bytes'] / GiB * 1024:.0f} MiB "
          f"({gpus.cublas_workspaces(preset)['detail']})")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.bench")
    p.add_argument("which", choices=["estimate", "explorer", "dryrun", "scaled", "allocator", "published", "fit", "gpu",
                                     "gpu-compare", "gpu-row"],
                   nargs="?",
                   default="estimate")
    p.add_argument("--no-save", action="store_true", help="dryrun, published: do not write data/results/")
    p.add_argument("--only", default=None, metavar="WORD",
                   help="dryrun, scaled: only the grid rows with a word of their label starting so (e.g. tp, fsdp1); "
                        "dryrun's rows replace their own in data/results/ (--no-save: not at all)")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="gpu: where the runs are written (default data/results/gpu_runs_<preset>.json); gpu-row: its "
                        "result")
    p.add_argument("--rows", default=None, metavar="SPEC",
                   help="gpu: the grid rows to run, in this order (e.g. '13-21,0-12'; default all)")
    p.add_argument("--row", type=int, default=None, help=argparse.SUPPRESS)      # gpu-row: which GPU_GRID row
    p.add_argument("--list", action="store_true", help="gpu: list the grid's rows with their numbers and stop")
    a = p.parse_args()
    if a.rows is not None and a.which != "gpu":
        print(f"bench {a.which}: --rows is for `bench gpu` (the GPU grid's rows), not for {a.which}")
        return 2
    if a.which == "gpu-row":
        if a.row is None or not 0 <= a.row < len(GPU_GRID) or not a.out:
            print(f"bench gpu-row: runs one GPU grid row for `bench gpu`: needs --row 0 to {len(GPU_GRID) - 1} and "
                  f"--out PATH, got --row {a.row} --out {a.out}")
            return 2
        gpu_row(a.row, a.out)
        return 0
    if a.which == "gpu" and a.list:
        gpu_list()
        return 0
    if a.which == "gpu":
        from helpers.errors import InputError
        try:
            return bench_gpu(a.out, a.rows)
        except InputError as e:
            print(f"bench gpu: {e}")
            return 2
    {"estimate": bench_estimate, "scaled": lambda: bench_scaled(a.only), "explorer": bench_explorer,
     "allocator": bench_allocator, "published": lambda: bench_published(save=not a.no_save), "fit": bench_fit,
     "gpu-compare": bench_gpu_compare}.get(a.which, lambda: bench_dryrun(save=not a.no_save, only=a.only))()
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
