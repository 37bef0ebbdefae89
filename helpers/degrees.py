"""The parallel degrees of a run, computed once (after torchtitan's `ParallelDims`, torchtitan/distributed/
parallel_dims.py: one object holding dp_replicate, dp_shard, cp and tp whose product is the world size, which every
component asks instead of dividing the world size itself).

world = tp x cp x dp. Tensor parallelism splits each weight over `tp` ranks; context parallelism splits each sequence
over `cp` ranks; the remaining `dp` ranks see different batches. A sharding strategy (ZeRO, FSDP) splits the model
states it shards over the data- and context-parallel ranks together (FSDP2's `dp_shard_cp` mesh), `shard` of them; a
replicating one (DDP) keeps a copy on each of those, `replicate` of them. Hybrid sharding (FSDP2's HSDP over a
(dp_replicate, dp_shard) mesh, FSDP1's HYBRID_SHARD) splits the data-parallel ranks into `dp_replicate` groups, each
sharding the states over its own ranks and all-reducing the sharded gradients with the other groups: dp = dp_replicate
x dp_shard, and shard = dp_shard x cp.

This module is pure arithmetic: it imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass


def ceil_div(n: int, d: int) -> int:
    """ceil(n / d) in integers (exact at any size, unlike math.ceil(n / d) in floating point)."""
    return -(-n // d)


@dataclass(frozen=True)
class Degrees:
    """The degrees of one run (TrainSetup.degrees; TrainSetup.validate checks that tp x cp divides world)."""

    world: int
    """Every GPU of the run."""
    tp: int = 1
    """Tensor-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    sharded: bool = False
    """The strategy shards some model state (ZeRO, FSDP); False: it replicates every state (single, DDP)."""
    dp_replicate: int = 1
    """Hybrid sharding: groups of data-parallel ranks that each hold a whole sharded copy (TrainSetup.validate checks
    that it divides dp); 1: one group, every data-parallel rank shares the shards."""

    @property
    def dp(self) -> int:
        """Data-parallel degree: world // (tp x cp)."""
        return self.world // (self.tp * self.cp)

    @property
    def shard(self) -> int:
        """Ranks each (tensor-parallel-local) sharded state is split over: dp_shard x cp for a sharding strategy
        (dp x cp without hybrid sharding), else 1."""
        return self.dp // self.dp_replicate * self.cp if self.sharded else 1

    @property
    def replicate(self) -> int:
        """Ranks holding the same copy of each state: dp x cp for a replicating strategy, dp_replicate for a
        sharding one."""
        return self.dp_replicate if self.sharded else self.dp * self.cp

    @property
    def model_parallel(self) -> int:
        """Ranks that together hold one model replica's work (tp x cp): a world size is a multiple of it."""
        return self.tp * self.cp

    def split(self, n: int) -> int:
        """One rank's share of `n` sharded elements: ceil(n / shard)."""
        return ceil_div(n, self.shard)

    def describe(self) -> str:
        """' (TP 2 x CP 1 x DP 4)' where tensor or context parallelism is on, ' (HSDP: 2 groups x 8 GPUs sharding)'
        (with the TP/CP degrees where they are on) under hybrid sharding, else ''."""
        hybrid = f"{self.dp_replicate} groups x {self.shard} GPU{'s' * (self.shard > 1)} sharding" \
            if self.dp_replicate > 1 else ""
        if self.model_parallel > 1:
            split = f" = {self.dp_replicate} replicas x {self.dp // self.dp_replicate}" if hybrid else ""
            dp = f"DP {self.dp}{split}"
            return f" (TP {self.tp} x CP {self.cp} x {dp})"
        return f" (HSDP: {hybrid})" if hybrid else ""
