"""The strategies: one object each, saying what it shards, which engine runs it for real, which dry run it has and
which options it accepts. The CLI's choices, the explorer's options and the validation messages are generated from
REGISTRY. Other layers dispatch on three of its keys, each through one table that tests/test_strategies.py checks
against every entry: `family` (memory items, `helpers.estimate.states.MODEL_STATES`; dry-run steps,
`helpers.measure.dryrun.STEPS` / `TP_STEPS`) and `engine` (the real engine, `helpers.measure.scaled.REAL_ENGINES`).

This module is pure data: it imports nothing of the package but the error type.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.errors import InputError

SHARDABLE = ("optimizer_states", "gradients", "parameters")


@dataclass(frozen=True)
class Strategy:
    """One way of spreading a training step over GPUs."""

    name: str
    """The option's value (`--strategy NAME`)."""
    title: str
    """What it is, in a few words, for help texts and figure titles."""
    shards: tuple = ()
    """Which model states it splits 1/N over the GPUs (a subset of SHARDABLE, in that order)."""
    engine: str = "torch"
    """The engine that runs it for real: 'torch' (in this process), 'deepspeed' (in this process, gloo, no launcher)
    or 'fsdp2' / 'fsdp1' (one process per rank under torchrun)."""
    family: str = "replicated"
    """Its family: how the model states are laid out ('replicated', 'zero12', 'zero3', 'fsdp2', 'fsdp1'), the key of
    its memory items (`helpers.estimate.states.MODEL_STATES`) and of its dry-run step (`helpers.measure.dryrun.STEPS`,
    `TP_STEPS` where `model_parallel`)."""
    dry_run: str | None = None
    """What its dry run runs (None: no dry run, `no_dry_run` says why)."""
    dry_run_evidence: str = "measured"
    """'measured' (the engine itself on fake tensors) or 're-enacted' (rebuilt in torch from its source)."""
    no_dry_run: str = ""
    dry_run_offload: bool = True
    """Its CPU offload runs in the dry run (False: FSDP1 moves flat parameters by swapping `.data`, which fake tensors
    on the fake GPU refuse)."""
    fake_process_group: bool = False
    """Its dry run runs the engine on a fake process group (rank 0 of `gpus`); its time grows with the world size."""
    multi_gpu: bool = True
    """False: one GPU only."""
    offload: tuple = ()
    """Offload options it honours: 'offload_optimizer', 'offload_params', 'offload_ratio'."""
    offload_together: bool = False
    """Parameters, gradients and optimizer states are offloaded together or not at all (FSDP2's CPUOffloadPolicy,
    FSDP1's CPUOffload(offload_params=True))."""
    torch_optimizer: bool = True
    """The optimizer is torch's (adam_impl applies); False: the engine brings its own (DeepSpeed's Adam)."""
    client_optimizer: bool = False
    """The engine also takes a client optimizer in place of its own: the HF Trainer hands DeepSpeed its `optim` (torch
    AdamW, bitsandbytes AdamW8bit) when the DeepSpeed JSON has no `optimizer` block (transformers
    `integrations/deepspeed.py` deepspeed_optim_sched sets zero_allow_untested_optimizer), and it then steps over
    DeepSpeed's flat fp32 partitions (ZeRO-1/2) or sub-groups (ZeRO-3). Not with optimizer offload: accelerate swaps it
    for DeepSpeedCPUAdam there (`accelerate/utils/deepspeed.py` map_pytorch_optim_to_deepspeed)."""
    optimizer_8bit: bool = False
    """bitsandbytes' AdamW8bit can be the client optimizer."""
    precisions: tuple = ("bf16", "bf16-mixed", "fp32")
    lora: bool = False
    """LoRA adapters are modelled with it."""
    qlora: bool = False
    """A bitsandbytes NF4 base (QLoRA, base_weights 'nf4') is modelled with it: the 4-bit weights and their
    quantisation state held whole on each GPU (no engine shards or re-casts them)."""
    autocast: bool = False
    """bf16-mixed means an fp32 model under torch.autocast (not a mixed-precision policy of the engine)."""
    adapter_dtype: bool = False
    """LoRA adapters keep the dtype peft gives them (fp32 by default on a bf16 base: `adapter_dtype`); no engine
    re-casts them."""
    gradient_buckets: bool = False
    """A gradient-sized reducer bucket buffer (DDP)."""
    master_in_checkpoint: bool = False
    """Its optimizer checkpoint holds fp32 master weights beside the Adam states (DeepSpeed)."""
    overlap_comm_default: bool = False
    """DeepSpeed's default for overlap_comm (double reduce buckets): on for ZeRO-3 only."""
    fused_ce_modes: tuple = ()
    """Measuring modes in which a fused linear cross-entropy runs with it ('dry', 'scaled', 'gpu')."""
    model_parallel: bool = False
    """Tensor and context parallelism (`tensor_parallel`, `context_parallel` > 1) are modelled with it: DTensor's
    plans compose with torch's own data parallelism (FSDP2 as a 2-D mesh, DDP over the data-parallel ranks), not
    with DeepSpeed's ZeRO, which partitions the whole flat model itself."""

    @property
    def sharded(self) -> bool:
        return bool(self.shards)

    @property
    def deepspeed(self) -> bool:
        return self.engine == "deepspeed"

    @property
    def one_process_per_gpu(self) -> bool:
        """A scaled run starts one process per GPU (torchrun); otherwise one process stands for rank 0."""
        return self.engine in ("fsdp2", "fsdp1")

    @property
    def launcher(self) -> str:
        """How a multi-GPU run of it is started, one process per GPU."""
        return "deepspeed --num_gpus N --module" if self.deepspeed else "torchrun --nproc_per_node N -m"


_ZERO = dict(engine="deepspeed", torch_optimizer=False, client_optimizer=True,
             precisions=("bf16-mixed", "fp32"), master_in_checkpoint=True, dry_run_evidence="re-enacted")
REGISTRY: dict[str, Strategy] = {s.name: s for s in (
    Strategy("single", "one GPU, torch", multi_gpu=False, dry_run="torch AdamW on one GPU", optimizer_8bit=True,
             lora=True, qlora=True, autocast=True, adapter_dtype=True, fused_ce_modes=("dry", "scaled", "gpu"),
             precisions=("bf16", "bf16-mixed", "fp16-mixed", "fp32")),
    Strategy("ddp", "torch DistributedDataParallel", dry_run="torch AdamW, plus one gradient-sized DDP bucket buffer "
             "(DDP itself not run)", dry_run_evidence="re-enacted", optimizer_8bit=True, lora=True, qlora=True,
             autocast=True, adapter_dtype=True, precisions=("bf16", "bf16-mixed", "fp16-mixed", "fp32"),
             gradient_buckets=True, fused_ce_modes=("dry", "scaled", "gpu"), model_parallel=True),
    Strategy("zero1", "DeepSpeed ZeRO-1", shards=("optimizer_states",), family="zero12",
             dry_run="DeepSpeed ZeRO-1 re-enacted in torch (DeepSpeed cannot run on fake tensors)", optimizer_8bit=True,
             offload=("offload_optimizer",), lora=True, qlora=True, fused_ce_modes=("dry",), **_ZERO),
    Strategy("zero2", "DeepSpeed ZeRO-2", shards=("optimizer_states", "gradients"), family="zero12",
             dry_run="DeepSpeed ZeRO-2 re-enacted in torch (DeepSpeed cannot run on fake tensors)", optimizer_8bit=True,
             offload=("offload_optimizer",), lora=True, qlora=True, fused_ce_modes=("dry",), **_ZERO),
    Strategy("zero3", "DeepSpeed ZeRO-3", shards=SHARDABLE, family="zero3", overlap_comm_default=True,
             no_dry_run="DeepSpeed cannot run on fake tensors, and ZeRO-3's gathering has no faithful torch "
                        "re-enactment here",
             offload=("offload_optimizer", "offload_params", "offload_ratio"), lora=True, **_ZERO),
    Strategy("fsdp2", "torch FSDP2 fully_shard", shards=SHARDABLE, engine="fsdp2", family="fsdp2",
             dry_run="FSDP2 fully_shard on a fake process group, rank 0's view",
             offload=("offload_optimizer", "offload_params"), offload_together=True, fake_process_group=True,
             model_parallel=True, lora=True),
    Strategy("fsdp1", "torch FSDP1 FullyShardedDataParallel, FULL_SHARD", shards=SHARDABLE, engine="fsdp1",
             family="fsdp1", dry_run="FSDP1 FullyShardedDataParallel (FULL_SHARD, a unit per decoder layer) on a fake "
             "process group, rank 0's view", offload=("offload_optimizer", "offload_params"), offload_together=True,
             fake_process_group=True, dry_run_offload=False, lora=True),
)}
NAMES = tuple(REGISTRY)


def get(name) -> Strategy:
    """The strategy called `name`; InputError naming the ones there are otherwise."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise InputError(f"unknown strategy {name!r}: allowed are {', '.join(NAMES)}")
    return REGISTRY[name]


def names(test=lambda s: True) -> tuple[str, ...]:
    """The names of the strategies for which `test(strategy)` holds, in registry order."""
    return tuple(n for n, s in REGISTRY.items() if test(s))


def listing(test=lambda s: True, conjunction: str = "or") -> str:
    """Those names as prose: 'zero1, zero2, zero3 or fsdp2'."""
    n = names(test)
    return n[0] if len(n) == 1 else ", ".join(n[:-1]) + f" {conjunction} " + n[-1]


def help_text() -> str:
    """One line per strategy for `--help`."""
    return "; ".join(f"{s.name}: {s.title}" for s in REGISTRY.values())
