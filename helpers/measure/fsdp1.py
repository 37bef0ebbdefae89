"""torch FSDP1 (`FullyShardedDataParallel`, flat parameters) as the dry runs and the scaled runs wrap a decoder.

How it is wrapped, and why (torch 2.13 `torch/distributed/fsdp/fully_sharded_data_parallel.py`, `_flat_param.py`,
`_runtime_utils.py`, `api.py`):
- one FSDP unit per decoder layer (`transformer_auto_wrap_policy` with the model's decoder-layer class, what
  accelerate's and axolotl's `fsdp_transformer_layer_cls_to_wrap` make), the rest (embedding, final norm, output
  head) in the root unit; each unit's parameters are one FlatParameter, padded to a multiple of the world size and
  sharded 1/N (`FlatParamHandle.shard`);
- `ShardingStrategy.FULL_SHARD` (torch's default): a non-root unit is resharded after its forward, the root unit is
  not (`_post_forward_reshard` frees only when not root), so the root's unsharded parameters live from forward to the
  end of backward;
- `BackwardPrefetch.BACKWARD_PRE` and `limit_all_gathers=True` (torch's defaults): in backward the next unit's
  all-gather is issued before the current unit's gradients are computed, at most two all-gathers in flight;
- bf16-mixed: `MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)`, what accelerate's
  `FullyShardedDataParallelPlugin.set_mixed_precision` builds for mixed_precision="bf16" (huggingface/accelerate,
  src/accelerate/utils/dataclasses.py): fp32 shards kept, a bf16 copy of the shard (`_mp_shard`) made just before
  the all-gather into a bf16 unsharded buffer (`_full_param_padded`), gradients reduce-scattered in bf16 and the
  shard cast back to fp32 (`_cast_grad_to_param_dtype`);
- offload: `CPUOffload(offload_params=True)`, FSDP1's only offload: parameter shards and gradient shards (`_cpu_grad`)
  on the host, so the optimizer steps on the host too; there is no separate optimizer offload, hence
  offload_optimizer and offload_params go together;
- `use_orig_params=False` (torch's and accelerate's default; `TrainSetup.use_orig_params` sets True): no
  per-parameter alignment padding in the flat parameter;
- LoRA: peft's `fsdp_auto_wrap_policy` (what the HF Trainer sets for a peft model, transformers
  `distributed/fsdp.py` update_fsdp_plugin_peft): every adapter weight its own unit, each decoder layer's frozen
  weights another, and accelerate's autocast around the forward (as for every FSDP model under bf16-mixed).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from helpers.measure.tracker import Tracker
from helpers.training import TrainSetup


def decoder_layer_classes(model) -> set[type]:
    """The decoder-layer class(es) of a Hugging Face causal LM: the auto-wrap policy's unit."""
    return {type(layer) for layer in model.base_model.layers}


def wrap(model, setup: TrainSetup, device_id=None, process_group=None):
    """`model` wrapped in FSDP1 as described above; `device_id` the compute device (None: the parameters' own)."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    mp = None
    if setup.precision == "bf16-mixed":
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    if setup.lora_rank:
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
    else:
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=decoder_layer_classes(model))
    kw = {} if process_group is None else {"process_group": process_group}
    sharding = ShardingStrategy.FULL_SHARD if setup.reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP
    if setup.hybrid_shard:                    # `process_group`: (the node's group, the group across nodes)
        sharding = ShardingStrategy.HYBRID_SHARD if setup.reshard_after_forward else \
            ShardingStrategy._HYBRID_SHARD_ZERO2
    wrapped = FSDP(model, auto_wrap_policy=policy, sharding_strategy=sharding, mixed_precision=mp,
                   cpu_offload=CPUOffload(offload_params=setup.offload_params), device_id=device_id,
                   backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True,
                   use_orig_params=setup.use_orig_params,
                   sync_module_states=False, **kw)
    return wrapped


@contextlib.contextmanager
def pinned_host_memory():
    """FSDP1 pins its offloaded shards and gradient buffers with `Tensor.pin_memory()`, which needs an accelerator:
    on a CPU-only machine and on the fake host it is made a plain copy (same bytes, pageable)."""
    original = torch.Tensor.pin_memory

    def pin_memory(self, *args, **kwargs):
        return self.clone() if not torch.cuda.is_available() else original(self, *args, **kwargs)

    torch.Tensor.pin_memory = pin_memory
    try:
        yield
    finally:
        torch.Tensor.pin_memory = original


@contextlib.contextmanager
def no_stream_records():
    """FSDP1 calls `Tensor.record_stream` on its buffers for the caching allocator of a real device; a fake tensor
    on the fake GPU's do-nothing stream refuses it ('unknown parameter type'). It holds no memory: made a no-op."""
    from torch.distributed.fsdp import _flat_param, _runtime_utils

    originals = _flat_param._no_dispatch_record_stream, _runtime_utils._no_dispatch_record_stream
    _flat_param._no_dispatch_record_stream = _runtime_utils._no_dispatch_record_stream = lambda tensor, stream: None
    try:
        yield
    finally:
        _flat_param._no_dispatch_record_stream, _runtime_utils._no_dispatch_record_stream = originals


@contextlib.contextmanager
def fake_data_ptrs_told_apart():
    """FSDP1's end of backward reshards what no post-backward hook resharded (a frozen unit whose inputs need no
    gradient: the root, the first layer under LoRA) unless `flat_param.data_ptr() == _local_shard.data_ptr()`
    (`_runtime_utils.py` _catch_all_reshard); every fake tensor's data_ptr() is 0, so a dry run would skip that
    reshard and keep those units unsharded through the step. Made to compare storages instead, which fake tensors
    tell apart (a real GPU's pointers do)."""
    from torch.distributed.fsdp import _runtime_utils

    original = _runtime_utils._catch_all_reshard

    def catch_all_reshard(state):
        handle = state._handle
        if handle is None:
            return
        same = handle.flat_param.untyped_storage()._cdata == handle.flat_param._local_shard.untyped_storage()._cdata
        if not same or handle._skipped_use_sharded_views:
            _runtime_utils._reshard(state, handle, _runtime_utils._should_free_in_backward(state, handle))

    _runtime_utils._catch_all_reshard = catch_all_reshard
    try:
        yield
    finally:
        _runtime_utils._catch_all_reshard = original


def handles(wrapped) -> list:
    """The FlatParamHandle of every FSDP unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in FSDP.fsdp_modules(wrapped) if m._handle is not None]


def label_buffers(tracker: Tracker, wrapped, offload: bool) -> None:
    """Settle the categories of FSDP1's own buffers (made at its lazy initialisation, in the first forward): the
    unsharded and low-precision buffers are temporaries, the shards parameters, the host gradient buffer gradients."""
    host = "host" if offload else None
    for h in handles(wrapped):
        fp = h.flat_param
        tracker.label([fp._local_shard], "parameters", host)
        for name in ("_full_param_padded", "_mp_shard", "_full_prec_full_param_padded"):
            t = getattr(fp, name, None)
            if isinstance(t, torch.Tensor):
                tracker.label([t], "temporaries", "gpu" if offload else None)
        cpu_grad = getattr(fp, "_cpu_grad", None)
        if isinstance(cpu_grad, torch.Tensor):
            tracker.label([cpu_grad], "gradients", "host")


@contextlib.contextmanager
def reduce_scatter_counted(tracker: Tracker):
    """Count what FSDP1's gradient reduction makes (the reduce-scatter's padded input and output) as communication
    buffers, as fsdp_buffers_counted does for FSDP2."""
    from torch.distributed.fsdp import _runtime_utils

    original = _runtime_utils._get_reduce_scatter_tensors

    def counted(*args, **kwargs):
        with tracker.made_as("comm_buffers"):
            return original(*args, **kwargs)

    _runtime_utils._get_reduce_scatter_tensors = counted
    try:
        yield
    finally:
        _runtime_utils._get_reduce_scatter_tensors = original


@contextlib.contextmanager
def cpu_streams_synchronizable():
    """With CPUOffload, FSDP1's end of backward calls `current_stream().synchronize()` to wait for the copies of the
    gradients to the host (`_post_backward_final_callback`); torch's CPU Stream has no `synchronize` (torch 2.13
    `torch/cpu/__init__.py`). CPU work is synchronous, so on a CPU-only run it is given one that returns at once."""
    stream = torch.cpu.Stream
    had = "synchronize" in vars(stream)
    if not had:
        stream.synchronize = lambda self: None
    try:
        yield
    finally:
        if not had:
            del stream.synchronize
