"""Loading the model: what each rank holds while `from_pretrained` reads the checkpoint and the engine takes it, before
the first step (the `load` moment of the set-up phase).

Read from transformers 5.23, DeepSpeed 0.19.8 and accelerate 1.15 (the releases installed here), and measured by
`helpers.measure.loading` on a saved twin:

- **Host, a copy per rank when the dtype changes.** `from_pretrained` builds the model on the meta device and
  attaches each tensor of the safetensors files as a view of the memory-mapped file (`_load_pretrained_model`:
  `safe_open(..., backend="mmap")` and `get_slice`; `core_model_loading._materialize_copy` calls `.to(dtype)`, a no-op
  when the dtypes agree). Loaded in the checkpoint's own dtype, the weights are page-cache pages shared by every rank
  of the node, which the kernel can drop: nothing is counted. Loaded in another dtype (a bf16 checkpoint as float32
  for fp32 master weights), every tensor is converted into private memory: the whole model in the loaded dtype, on
  every rank of the node, until the engine or the Trainer moves it to the GPU (`model.to(device)` frees it).
  `low_cpu_mem_usage` is accepted and ignored (`from_pretrained` pops it: "Not used anymore").
- **FSDP's `cpu_ram_efficient_loading` does not lower it.** accelerate sets ACCELERATE_USE_FSDP and
  FSDP_CPU_RAM_EFFICIENT_LOADING, and transformers 4 then left every rank's weights but local rank 0's on the meta
  device; transformers 5.23 reads the variables only for buffers and initialisation (`modeling_utils.py`
  `_move_missing_keys_from_meta_to_device`, `_initialize_missing_keys`) and converts the whole checkpoint on every
  rank. Measured (`helpers.measure.loading`, two ranks under torchrun with both variables set): rank 1's private copy
  equals rank 0's and the one-rank load's. Under `--versions transformers=4.x` this rule still counts a copy per
  rank (higher than such a run, not lower).
- **ZeRO-3 under zero.Init** (transformers builds the model inside `deepspeed.zero.Init` whenever a stage-3
  HfDeepSpeedConfig exists): parameters are partitioned as each module is built, and only global rank 0 reads the
  checkpoint (`map_location="cpu" if rank == 0 else "meta"`), copying it in module by module under
  `GatheredParameters(modifier_rank=0)`: no per-rank host copy.
- **ZeRO-3 without zero.Init** (`zero3_init` False): the model arrives whole, and DeepSpeed's engine casts it to the
  compute dtype and moves all of it to the GPU (`DeepSpeedEngine._configure_distributed_model`: `self.module.to(
  self.device)`) before the optimizer's `DeepSpeedZeRoOffload` converts and partitions it parameter by parameter: the
  whole model in the compute dtype on every GPU. The caching allocator keeps those segments reserved afterwards
  (until `empty_cache`): that reserve is not modelled here.

Which dtype the model is loaded in: the dtype the engine trains its weights in where the engine takes the model as it
is (torch strategies: float32 for bf16-mixed, fp16-mixed and fp32 master weights; a LoRA base in its own dtype); the
compute dtype under DeepSpeed, which casts the module itself (LLaMA-Factory, axolotl and OpenRLHF load in it), unless
`load_dtype` names the dtype the script loads in: TRL loads in float32 unless its `dtype` says otherwise (trl 1.x
`trainer/utils.py` create_model_from_path: `kwargs.get("dtype", "float32")`; `ModelConfig.dtype`), so under ZeRO-1/2
every rank converts a bf16 checkpoint to float32 on its host before DeepSpeed casts it back. A 4-bit base
(QLoRA) is quantised as it is loaded onto the GPU (`device_map`): no host copy is counted.
- **Sharded load** (`sharded_load`, torchtitan's way: train.py builds the model under `torch.device("meta")`, then
  `to_empty` and `init_weights`, and `checkpoint.load` reads each rank's own shards through torch.distributed.checkpoint,
  slice by slice): no whole copy on any rank; nothing is counted. Read, not measured.
- **Tensor parallelism** (a `tp_plan`): `from_pretrained` shards each tensor as it reads it
  (core_model_loading.py `spawn_materialize` with a `DtensorShardOperation`), so a rank converts its own share only,
  and onto its GPU; the rule counts that share (the tensor-parallel rank's parameters) on the host, an upper bound.
Left out: accelerate's FSDP2 preparation, which upcasts
trainable parameters to float32 on every rank's host (the same 4 bytes a float32 load counts); a checkpoint read
without mmap (`disable_mmap=True`, a FUSE mount), which holds the file's bytes in private memory too.
"""

from __future__ import annotations

from helpers.estimate.items import LOAD
from helpers.estimate.states import Builder
from helpers.models import ModelSpec
from helpers.units import fmt

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def ram_efficient_words(on: bool) -> str:
    """What a file's FSDP cpu_ram_efficient_loading sets, for the readers' "sets" column (35 characters): nothing
    either way with transformers 5.23 (the module's docstring)."""
    return "no change: every rank converts" if on else "off: every rank converts"


def compute_dtype(setup) -> str:
    """The compute dtype's name: 'fp32' under precision fp32, else the 16-bit one."""
    return "fp32" if setup.precision == "fp32" else setup.half


def loaded_dtype(setup, m: ModelSpec | None = None) -> str | None:
    """The dtype the model is loaded in for `setup` ('bf16', 'fp16', 'fp32'); None for a 4-bit (QLoRA) base. A
    `load_dtype` 'auto' is `m`'s checkpoint dtype (fp32 where its config.json names none, as transformers does)."""
    if setup.quantized:
        return None
    if setup.load_dtype == "auto":
        return (m.checkpoint_dtype if m is not None else None) or "fp32"
    if setup.load_dtype is not None:
        return setup.load_dtype
    compute = compute_dtype(setup)
    if setup.lora_rank is not None:
        return "fp32" if setup.base_fp32 else compute
    if setup.strat.deepspeed or setup.precision == "bf16":
        return compute
    return "fp32"


def host_copy(setup, m: ModelSpec) -> int:
    """Bytes each rank converts into private host memory while loading (0 when it reads the mmap-ed file as is)."""
    dtype = loaded_dtype(setup, m)
    if (dtype is None or (setup.strat.family == "zero3" and setup.zero3_init) or dtype == m.checkpoint_dtype
            or setup.sharded_load):
        return 0
    return m.params * BYTES[dtype]


def words(setup, m: ModelSpec) -> str:
    """How the model is loaded for `setup`, in a clause: the dtype assumed and what it holds where nothing is counted."""
    dtype = loaded_dtype(setup, m)
    if dtype is None:
        return "a 4-bit base is quantised as it is loaded onto the GPU (device_map): no host copy counted"
    if setup.sharded_load:
        return ("built on the meta device; each rank reads only its own shards of the checkpoint "
                "(torch.distributed.checkpoint, as torchtitan loads): no whole copy on any rank")
    if setup.strat.family == "zero3" and setup.zero3_init:
        return ("built already partitioned under deepspeed.zero.Init; global rank 0 reads the checkpoint through its "
                "memory-mapped files (the page cache), the others read nothing")
    compute = compute_dtype(setup)
    if setup.load_dtype is not None:
        why = "the dtype the training script asks for, load_dtype; " + (
            f"DeepSpeed casts the module to {compute} afterwards" if dtype != compute else "DeepSpeed's compute dtype")
    elif setup.strat.deepspeed:
        why = "DeepSpeed casts the module itself"
    elif setup.lora_rank is not None:
        why = "the frozen base's dtype" + (": base_weights fp32" if setup.base_fp32 else ", the compute dtype")
    else:
        why = "the dtype the engine trains its weights in"
    assumed = f"loaded as {dtype} ({why})"
    if host_copy(setup, m):
        source = f"{m.checkpoint_dtype} checkpoint" if m.checkpoint_dtype else "checkpoint whose config.json names no dtype"
        return f"{assumed} from a {source}: converted on every rank"
    return (f"{assumed} from a {dtype} checkpoint: the weights are its memory-mapped files (the page cache, shared by "
            f"the node's ranks, which the kernel can drop), no private copy per rank; loading in another dtype would "
            f"copy the whole model on every rank")


def add_load(b: Builder, m: ModelSpec) -> None:
    """The load moment: each rank's converted copy on the host; without zero.Init, the whole model on each GPU."""
    s = b.setup
    dtype = loaded_dtype(s, m)
    copy = host_copy(s, m)
    on_disk = m.checkpoint_dtype or "a dtype its config.json does not name"
    b.host(f"the model converted to {dtype} as it loads", "parameters", copy, LOAD,
           f"from_pretrained reads the checkpoint ({on_disk}) as a memory-mapped file and converts every tensor to "
           f"{dtype} in private memory: {m.params:,} x {BYTES[dtype] if dtype else 0} B = {fmt(copy)} per rank until "
           f"the model moves to the GPU (transformers 5.23 core_model_loading._materialize_copy)")
    if s.strat.family == "zero3" and not s.zero3_init:
        compute = compute_dtype(s)
        whole = m.params * BYTES[compute]
        b.gpu(f"the whole model before ZeRO-3 partitions it ({compute})", "parameters", whole, LOAD,
              f"without zero.Init, DeepSpeed's engine casts the module to {compute} and moves all of it to the GPU "
              f"(engine.py _configure_distributed_model: self.module.to(self.device)) before DeepSpeedZeRoOffload "
              f"partitions it: {m.params:,} x {BYTES[compute]} B on every GPU (DeepSpeed 0.19.8)")
