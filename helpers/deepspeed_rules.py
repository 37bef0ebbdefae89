"""DeepSpeed's placement rules that the estimate and the measurements both apply: how ZeRO-3 groups one rank's
optimizer partition into sub-groups, and which of them a partial offload (`offload_optimizer.ratio`) puts on the host.
Read in DeepSpeed 0.19.8's `deepspeed/runtime/zero/stage3.py`. The estimate counts buffers with them; a scaled run or
a resume places the engine's own sub-groups with them (evidence "placed by rule"): one rule, in one place, beside
neither of the two that it serves.
"""

from __future__ import annotations

from helpers.degrees import ceil_div


def zero3_sub_groups(m, setup) -> list[int]:
    """Element counts of DeepSpeed ZeRO-3's optimizer sub-groups on one rank (`_create_fp16_sub_groups`): the
    partitions of `m`'s tensors (a helpers.models.ModelSpec) in order, a group closed once it reaches
    `setup.sub_group_size` elements (a helpers.training.TrainSetup)."""
    groups, current = [], 0
    G = setup.degrees.shard
    for t in m.tensors:
        current += ceil_div(t.numel, G)
        if current >= setup.sub_group_size:
            groups.append(current)
            current = 0
    if current:
        groups.append(current)
    return groups


def first_host_group(n_groups: int, ratio: float) -> int:
    """DeepSpeed's partial-offload rule (stage3.py, `_create_fp32_partitions`): of `n_groups` optimizer sub-groups,
    those with index i < int((1 - ratio) * n_groups) stay on the GPU and the rest go to the host; the first host
    index is returned (n_groups when nothing is offloaded). The one place this project writes the rule."""
    return int((1 - ratio) * n_groups)
