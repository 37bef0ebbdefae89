"""Host-side effects no model-state count shows: pinned-memory rounding, and the resume transient.

Pinned memory: PyTorch's pinned host caching allocator (`at::CachingHostAllocator`, used by `Tensor.pin_memory()` and
non-blocking device-to-host copies) rounds every block up to the next power of two and keeps freed blocks cached,
so page-locked buffers cost their rounded size from first use on, and cannot be swapped out.
Resume: DeepSpeed's `load_checkpoint` reads each rank's optimizer shard (`*_optim_states.pt`) with
`map_location='cpu'`: the fp32 master partition and both Adam states land in host RAM beside the live buffers, and
`optimizer.load_state_dict` then creates (or, on the host, adopts) the states. torch strategies load the same way.
Left out: the page cache of checkpoint files, other processes of the job (inference engines, data loaders). The
model's own loading is helpers.estimate.loading.
"""

from __future__ import annotations

from helpers.estimate.items import MOMENTS, Item
from helpers.estimate.states import Builder, dtype_bytes
from helpers.models import ModelSpec
from helpers.units import next_power_of_2


def add_pinned_overhead(b: Builder) -> None:
    """For each pinned item: the rounding on top of its bytes while alive, and its whole rounded size once freed."""
    for item in [i for i in b.items if i.pinned]:
        rounded = sum(next_power_of_2(x) for x in item.blocks)
        first = min(MOMENTS.index(mo) for mo in item.moments)
        later = {mo for mo in MOMENTS[first:] if mo not in item.moments}
        why = "pinned caching allocator: blocks rounded up to powers of two"
        if rounded > item.nbytes:
            b.items.append(Item(f"rounding of {item.name}", "pinned_overhead", "host", rounded - item.nbytes,
                                item.moments, why))
        if later:
            b.items.append(Item(f"cached pinned blocks of {item.name}", "pinned_overhead", "host", rounded,
                                frozenset(later), "freed pinned blocks stay cached, never returned to the OS"))


def add_resume(b: Builder, m: ModelSpec) -> None:
    """The resume moment: the loaded optimizer shard on the host; states on the GPU are created as it loads."""
    s = b.setup
    _, storage = dtype_bytes(s)
    shard = s.degrees.split(m.params) if "optimizer_states" in s.strat.shards else m.params
    master = 4 if s.strat.master_in_checkpoint else 0     # torch strategies keep the weights in the model file
    per_rank = shard * (master + 2 * storage)
    b.host("optimizer checkpoint loaded from disk", "checkpoint", per_rank, {"resume"},
           "torch.load(map_location='cpu') of this rank's master weights and Adam states")
    for i, item in enumerate(b.items):
        if item.category == "optimizer_states" and item.device == "gpu":
            b.items[i] = Item(item.name, item.category, item.device, item.nbytes, item.moments | {"resume"}, item.why,
                              item.blocks)
