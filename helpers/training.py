"""TrainSetup: one training set-up (precision, optimizer, strategy, offload, sizes), and its validation.

Every option has one owner here; the estimator, the runners and the command line all take a TrainSetup.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from helpers.errors import InputError

PRECISIONS = ("bf16", "bf16-mixed", "fp32")
ADAM_IMPLS = ("foreach", "fused", "for-loop")
OPTIMIZERS = ("adamw", "adamw-8bit")
STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp2")
ATTENTIONS = ("eager", "sdpa", "flash")
ZERO = ("zero1", "zero2", "zero3")

# Limits beyond which no real training run goes; past them a figure would be meaningless (or overflow 64-bit sizes
# in a dry run), so they are refused with the allowed range in the message.
MAX_TOKENS = 2**24            # batch x seq per micro batch (16,777,216 tokens; real runs stay well under 2**21)
MAX_GPUS = 2**20              # world size (1,048,576; the largest clusters have a few 10**5 GPUs)
MAX_GPUS_PER_NODE = 1024      # GPUs sharing one host (8 on most servers, 72 on an NVL72 rack)
MIN_GIB, MAX_GIB = 2**-10, 2**20   # a capacity of 1 MiB to 1 PiB per GPU or per node (less rounds to no bytes)
MAX_ELEMENTS = 2**40          # DeepSpeed bucket and sub-group sizes, in elements
FLAGS = ("offload_optimizer", "offload_params", "pin_memory", "grad_checkpointing", "fused_ce", "resume")


@dataclass(frozen=True)
class TrainSetup:
    """A training set-up. Sizes are per GPU (micro batch); capacities in GiB (2**30 bytes)."""

    batch: int = 1
    """Micro batch per GPU (sequences)."""
    seq: int = 2048
    """Sequence length (tokens)."""
    precision: str = "bf16-mixed"
    """bf16: weights, grads, AdamW states all bf16; bf16-mixed: fp32 master weights and states, bf16 compute; fp32."""
    adam_impl: str | None = None
    """torch AdamW implementation for single/ddp/fsdp2 (default foreach, torch's GPU default); not for ZeRO."""
    optimizer: str = "adamw"
    """adamw: two states in the weights' dtype; adamw-8bit: bitsandbytes' AdamW8bit, block-quantised 8-bit states
    (single and ddp only: torch strategies with a client optimizer)."""
    lora_rank: int | None = None
    """LoRA adapters of this rank on every linear layer but the output head (peft's "all-linear"); the base model is
    frozen and kept in the compute dtype. None: full fine-tuning."""
    strategy: str = "single"
    gpus: int = 1
    """World size (data-parallel GPUs in all)."""
    gpus_per_node: int = 8
    """GPUs sharing one host; host memory is reported per node."""
    offload_optimizer: bool = False
    """ZeRO: optimizer states and fp32 master weights on the host. FSDP2: together with offload_params."""
    offload_params: bool = False
    """ZeRO-3: parameter partitions on the host. FSDP2: CPUOffloadPolicy (params, grads, optimizer states)."""
    offload_ratio: float | None = None
    """DeepSpeed offload_optimizer.ratio: fraction of optimizer sub-groups on the host (ZeRO-3 only)."""
    pin_memory: bool = True
    """Offloaded buffers page-locked (DeepSpeed >= 0.19.5 and torchtitan default) or pageable."""
    grad_checkpointing: bool = False
    fused_ce: bool = False
    """A fused/chunked linear cross-entropy (Liger, torch's linear_cross_entropy): full logits never exist."""
    attention: str = "sdpa"
    gpu_gib: float | None = None
    """Capacity of one GPU in GiB, for the out-of-memory verdict."""
    host_gib: float | None = None
    """Host RAM of one node in GiB, for the out-of-memory verdict."""
    resume: bool = False
    """Add the resume phase: optimizer states loaded from a checkpoint beside the live buffers."""
    reduce_bucket_size: int = 500_000_000
    """DeepSpeed reduce_bucket_size (elements); DeepSpeed's default."""
    sub_group_size: int = 1_000_000_000
    """DeepSpeed ZeRO-3 sub_group_size (elements); DeepSpeed's default."""
    prefetch_bucket_size: int = 50_000_000
    """DeepSpeed ZeRO-3 stage3_prefetch_bucket_size (elements); DeepSpeed's default."""
    overlap_comm: bool | None = None
    """DeepSpeed overlap_comm (double reduce buckets); None = DeepSpeed's default (on for ZeRO-3 only)."""

    @property
    def adam(self) -> str:
        """The optimizer implementation in effect ('deepspeed' for ZeRO strategies, 'bitsandbytes' for 8-bit)."""
        if self.strategy in ZERO:
            return "deepspeed"
        if self.optimizer == "adamw-8bit":
            return "bitsandbytes"
        return self.adam_impl or "foreach"

    @property
    def overlap(self) -> bool:
        return self.strategy == "zero3" if self.overlap_comm is None else self.overlap_comm

    @property
    def ratio(self) -> float:
        """Fraction of optimizer state offloaded (1.0 = all, DeepSpeed's meaning of no ratio)."""
        if not self.offload_optimizer:
            return 0.0
        return 1.0 if self.offload_ratio is None else self.offload_ratio

    @property
    def ranks_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    def replace(self, **changes) -> "TrainSetup":
        """A copy with some fields changed (validated)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise InputError(f"unknown set-up option {unknown[0]!r}: allowed are "
                             f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> "TrainSetup":
        """Raise InputError naming the bad value and what is allowed; return self when all is well.

        Types first (an int where an int is meant, a bool for a switch, a finite number for a capacity), then the
        ranges in MAX_*, then the combinations."""
        _choice("precision", self.precision, PRECISIONS)
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("attention", self.attention, ATTENTIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.adam_impl is not None:
            _choice("adam_impl", self.adam_impl, ADAM_IMPLS)
        for name in FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.overlap_comm is not None and not isinstance(self.overlap_comm, bool):
            raise InputError(f"overlap_comm must be True, False or None (DeepSpeed's default), got {self.overlap_comm!r}")
        for name, most in (("batch", MAX_TOKENS), ("seq", MAX_TOKENS), ("gpus", MAX_GPUS),
                           ("gpus_per_node", MAX_GPUS_PER_NODE), ("reduce_bucket_size", MAX_ELEMENTS),
                           ("sub_group_size", MAX_ELEMENTS), ("prefetch_bucket_size", MAX_ELEMENTS)):
            _integer(name, getattr(self, name), most)
        if self.batch * self.seq > MAX_TOKENS:
            raise InputError(f"batch x seq must be at most {MAX_TOKENS:,} tokens per micro batch (2^24; no real run "
                             f"comes near it), got {self.batch} x {self.seq} = {self.batch * self.seq:,}")
        for name in ("gpu_gib", "host_gib"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or not MIN_GIB <= value <= MAX_GIB):
                raise InputError(f"{name} must be a positive, finite number of GiB, from 1/1024 (1 MiB) to "
                                 f"{MAX_GIB:,} (None for no capacity), got {value!r}")
        if self.lora_rank is not None and (isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int)
                                           or self.lora_rank < 1):
            raise InputError(f"lora_rank must be a positive integer (or None for full fine-tuning), got {self.lora_rank!r}")
        s = self.strategy
        if self.lora_rank is not None and s in ("zero3", "fsdp2"):
            raise InputError(f"lora_rank is modelled with strategies single, ddp, zero1 and zero2, got {s!r} "
                             f"(sharding a frozen base is not modelled here)")
        if self.optimizer == "adamw-8bit":
            if s not in ("single", "ddp"):
                raise InputError(f"optimizer 'adamw-8bit' (bitsandbytes) is modelled with strategies single and ddp, "
                                 f"got {s!r}: DeepSpeed uses its own Adam, FSDP2 shards are not modelled with it")
            if self.adam_impl is not None:
                raise InputError(f"adam_impl {self.adam_impl!r} chooses torch AdamW's implementation; optimizer "
                                 f"'adamw-8bit' has its own kernel: leave adam_impl unset")
        if s == "single" and self.gpus != 1:
            raise InputError(f"strategy 'single' runs on one GPU, got gpus={self.gpus}: use ddp, zero1-3 or fsdp2")
        if s in ZERO and self.adam_impl is not None:
            raise InputError(
                f"adam_impl {self.adam_impl!r} is for torch's AdamW (strategies single, ddp, fsdp2); "
                f"strategy {s!r} uses DeepSpeed's FusedAdam / DeepSpeedCPUAdam"
            )
        if s in ZERO and self.precision == "bf16":
            raise InputError(
                f"precision 'bf16' (everything in bf16) is not how DeepSpeed trains: its bf16 mode keeps fp32 master "
                f"weights and states; use precision 'bf16-mixed' or 'fp32' with strategy {s!r}"
            )
        if s in ("single", "ddp") and (self.offload_optimizer or self.offload_params):
            raise InputError(f"strategy {s!r} cannot offload: offload needs zero1, zero2, zero3 or fsdp2")
        if self.offload_params and s in ("zero1", "zero2"):
            raise InputError(f"offload_params needs zero3 (DeepSpeed offloads parameters only in stage 3), got {s!r}")
        if s == "fsdp2" and self.offload_optimizer != self.offload_params:
            raise InputError(
                "FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer states together: "
                "set both offload_optimizer and offload_params, or neither"
            )
        if self.offload_ratio is not None:
            r = self.offload_ratio
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
                raise InputError(f"offload_ratio must be a number in [0, 1], got {r!r}")
            if s != "zero3":
                raise InputError(
                    f"offload_ratio is honoured only by DeepSpeed ZeRO-3 (partial offload), got strategy {s!r}"
                )
            if not self.offload_optimizer:
                raise InputError("offload_ratio needs offload_optimizer (it splits the offloaded optimizer states)")
        return self


def _choice(name: str, value, allowed: tuple) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"unknown {name} {value!r}: allowed are {', '.join(allowed)}")


def _integer(name: str, value, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    if value > most:
        raise InputError(f"{name} must be at most {most:,}, got {value:,}")


def checked(setup) -> TrainSetup:
    """`setup` validated; InputError if it is not a TrainSetup at all (the runners' and the estimator's entry)."""
    if not isinstance(setup, TrainSetup):
        raise InputError(f"setup must be a helpers.training.TrainSetup, got {type(setup).__name__} {setup!r}")
    return setup.validate()
