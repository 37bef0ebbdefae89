"""DeepSpeed's placement rules that the estimate and the measurements both apply: how ZeRO-3 groups one rank's
optimizer partition into sub-groups, which of them a partial offload (`offload_optimizer.ratio`) puts on the host, and
the largest piece of a gradient a ZeRO-1/2 rank's partition holds. Read in DeepSpeed 0.19.8's
`deepspeed/runtime/zero/stage3.py` and `stage_1_and_2.py`. The estimate counts buffers with them; a scaled run or
a resume places the engine's own sub-groups with them (evidence "placed by rule"): one rule, in one place, beside
neither of the two that it serves.
"""

from __future__ import annotations

from helpers.degrees import ceil_div


def zero3_sub_groups(m, setup) -> list[int]:
    """Element counts of DeepSpeed ZeRO-3's optimizer sub-groups on one rank, in order: each of the optimizer's
    parameter groups (`optimizer_param_groups`) split by `_create_fp16_sub_groups` (DeepSpeed 0.19.8 stage3.py): the
    partitions of its tensors in order, a sub-group closed once it reaches `setup.sub_group_size` elements or at the
    group's last tensor (`m`: a helpers.models.ModelSpec; `setup`: a helpers.training.TrainSetup)."""
    G = setup.degrees.shard
    groups = []
    for tensors in optimizer_param_groups(m, setup):
        current = 0
        for t in tensors:
            current += ceil_div(t.numel, G)
            if current >= setup.sub_group_size:
                groups.append(current)
                current = 0
        if current:
            groups.append(current)
    return groups


def optimizer_param_groups(m, setup) -> list[list]:
    """The optimizer's parameter groups as lists of `m`'s tensors, in the order DeepSpeed receives them: 'decay' (the
    HF Trainer's create_optimizer, OpenRLHF's get_optimizer_grouped_parameters) the matrices first, then the 1-D
    tensors (biases and norm weights, weight decay 0) where there are any; 'one' every tensor in one group."""
    if setup.optimizer_groups == "one":
        return [list(m.tensors)]
    return [g for g in ([t for t in m.tensors if decays(t.ndim)], [t for t in m.tensors if not decays(t.ndim)]) if g]


def decays(ndim: int) -> bool:
    """Whether a parameter of `ndim` dimensions is in the weight-decay group: the matrices (embeddings, linears, MoE
    routers); the 1-D biases and norm weights are in the no-decay group (the HF Trainer's get_decay_parameter_names,
    OpenRLHF's no_decay_name_list). The one place the split is written (the scaled runs group torch's parameters by it)."""
    return ndim >= 2


def first_host_group(n_groups: int, ratio: float) -> int:
    """DeepSpeed's partial-offload rule (stage3.py, `_create_fp32_partitions`): of `n_groups` optimizer sub-groups,
    those with index i < int((1 - ratio) * n_groups) stay on the GPU and the rest go to the host; the first host
    index is returned (n_groups when nothing is offloaded). The one place this project writes the rule."""
    return int((1 - ratio) * n_groups)


def largest_partition_piece(numels, partition: int) -> int:
    """ZeRO-1/2's flat partitions: the parameters laid end to end in their order (`bit16_groups_flat`), rank r holding
    elements [r x partition, (r + 1) x partition); each rank's `averaged_gradients` is one piece per parameter it
    touches (a whole tensor, or the part of one that crosses a boundary). The largest piece on any rank, in elements
    (alignment padding left out)."""
    largest, start = 0, 0
    for n in numels:
        a, end = start, start + n
        while a < end:
            b = min(end, (a // partition + 1) * partition)
            largest, a = max(largest, b - a), b
        start = end
    return largest
