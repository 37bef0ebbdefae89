"""A fake accelerator named 'gpu' for dry runs: PyTorch's PrivateUse1 backend, renamed, with no memory behind it.

Tensors created on device 'gpu' inside a FakeTensorMode have shapes, dtypes and a device but no storage, so a
full-size step runs on a laptop; the tracker tells 'gpu' bytes from 'cpu' (host) bytes by the tensor's device.
What a real CUDA device would add, registered here in Python:
- autocast: CUDA's lists (ATen `autocast_mode.h`): matmul-like ops run in the autocast dtype, with the cast of a leaf
  fp32 weight cached until autocast exits; reductions and losses run in fp32; everything else falls through.
- attention: a Hugging Face attention function that calls the CUDA flash kernel's op (bf16/fp16) or the
  memory-efficient one (fp32), which keep only the output and the logsumexp, as SDPA does on a GPU.
A fake 'cuda' device cannot be used on a CPU-only build (backward aborts the process), hence this device.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "gpu"
_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_LOWER = ("addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm",
          "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
         "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "nll_loss",
         "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "dist", "cdist", "renorm", "logsumexp",
         "binary_cross_entropy_with_logits", "cosine_similarity")
_FP32_OPT_DTYPE = ("softmax.int", "log_softmax.int", "prod", "cumsum", "sum")
_cast_cache: dict[int, tuple] = {}
_installed = False
EXPAND_KV = False
"""Set by `engines.kv_expanded`: the attention below repeats keys and values to every query head first (a copy), as
torchtune's and LitGPT's models do before SDPA."""
_libs: list = []


class _Stream:
    def __init__(self, *args, **kwargs): pass
    def wait_stream(self, other): pass
    def wait_event(self, event): pass
    def record_event(self, event=None): return _Event()
    def synchronize(self): pass
    def query(self): return True
    def __enter__(self): return self
    def __exit__(self, *exc): return False


class _Event:
    def __init__(self, *args, **kwargs): pass
    def record(self, stream=None): pass
    def wait(self, stream=None): pass
    def synchronize(self): pass
    def query(self): return True


class _Backend:
    """The module torch looks up as `torch.gpu`: one device, streams and events that do nothing."""

    Stream, Event = _Stream, _Event

    @staticmethod
    def is_available(): return True
    @staticmethod
    def is_initialized(): return True
    @staticmethod
    def _lazy_init(): pass
    @staticmethod
    def _is_in_bad_fork(): return False
    @staticmethod
    def device_count(): return 1
    @staticmethod
    def current_device(): return 0
    @staticmethod
    def set_device(index): pass
    @staticmethod
    def current_stream(device=None): return _Stream()
    @staticmethod
    def default_stream(device=None): return _Stream()
    @staticmethod
    def stream(stream): return contextlib.nullcontext()
    @staticmethod
    def synchronize(device=None): pass
    @staticmethod
    def get_amp_supported_dtype(): return [torch.bfloat16, torch.float16]
    @staticmethod
    def is_bf16_supported(*args, **kwargs): return True
    @staticmethod
    def manual_seed_all(seed): pass
    @staticmethod
    def manual_seed(seed): pass
    @staticmethod
    def get_rng_state(device=None): return torch.empty(0, dtype=torch.uint8)
    @staticmethod
    def set_rng_state(state, device=None): pass


def _eligible(t, target) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == NAME and t.is_floating_point()
            and t.dtype != torch.float64 and t.dtype != target)


def _cast(t, target):
    if not _eligible(t, target):
        return t
    cacheable = target != torch.float32 and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
    if cacheable and id(t) in _cast_cache and _cast_cache[id(t)][0] is t:
        return _cast_cache[id(t)][1]
    out = t.to(target)
    if cacheable:
        _cast_cache[id(t)] = (t, out)
    return out


def _cast_tree(obj, target):
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_tree(o, target) for o in obj)
    return _cast(obj, target)


def _kernel(op, to_fp32: bool, opt_dtype: bool = False):
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype") if "dtype" in names else len(names)     # where `dtype` sits when given positionally
    def kernel(*args, **kwargs):
        target = torch.float32 if to_fp32 else torch.get_autocast_dtype(NAME)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            if opt_dtype:
                given = args[at] if len(args) > at else kwargs.get("dtype")
                if given is None and args and _eligible(args[0], torch.float32):
                    if len(args) > at:
                        args = (*args[:at], torch.float32, *args[at + 1:])
                    else:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            return op(*_cast_tree(args, target), **{k: _cast_tree(v, target) for k, v in kwargs.items()})
    return kernel


def cached_weight_casts() -> list[torch.Tensor]:
    """The low-precision copies of fp32 weights that autocast holds now (cleared when autocast exits)."""
    return [pair[1] for pair in _cast_cache.values()]


def autocast(dtype=torch.bfloat16):
    """torch.autocast on the fake GPU (its weight-cast cache is cleared when the outermost autocast exits)."""
    return torch.autocast(NAME, dtype=dtype)


def _clear_with_ours(original):
    def clear_autocast_cache():
        original()
        _cast_cache.clear()
    return clear_autocast_cache


def _flash_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    """HF attention function: the CUDA flash (bf16/fp16) or memory-efficient (fp32) kernel's op."""
    aten = torch.ops.aten
    causal = True if is_causal is None else is_causal
    if EXPAND_KV and key.shape[1] != query.shape[1]:      # (the model's own expand + flatten, before the kernel)
        rep = query.shape[1] // key.shape[1]
        key, value = (t.unsqueeze(2).expand(t.shape[0], t.shape[1], rep, *t.shape[2:]).flatten(1, 2)
                      for t in (key, value))
    if torch.is_autocast_enabled(NAME):                   # SDPA is on autocast's lower-precision list
        target = torch.get_autocast_dtype(NAME)
        query, key, value = (t.to(target) for t in (query, key, value))
    dv = value.shape[-1]
    if dv != query.shape[-1]:                             # MLA: values padded to the query head size, as for flash
        value = torch.nn.functional.pad(value, [0, query.shape[-1] - dv])
    if query.dtype in (torch.bfloat16, torch.float16):   # the flash kernel takes fewer key/value heads as they are
        out = aten._scaled_dot_product_flash_attention(query, key, value, dropout, causal, scale=scaling)[0]
        return out[..., :dv].transpose(1, 2).contiguous(), None
    if key.shape[1] != query.shape[1]:                    # the memory-efficient kernel needs them repeated
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = aten._scaled_dot_product_efficient_attention(query, key, value, None, True, dropout, causal, scale=scaling)[0]
    return out[..., :dv].transpose(1, 2).contiguous(), None


# Ops CUDA runs as one fused kernel that the fake device would otherwise decompose (ATen's CompositeImplicitAutograd
# fallback runs for a backend with no kernel of its own): the decomposition keeps extra tensors alive inside the op
# (silu_backward: a sigmoid and a `1 - sigmoid` of the input's size, +1.8% on a pure-bf16 FSDP2 backward). Found by
# listing every aten op of a forward and backward on the fake device and on a real CPU for Llama, Qwen2.5, Qwen3,
# Mistral, Mixtral, Qwen2/3-MoE, Gemma 3, Phi-3 and DeepSeek-V2 twins (tests/test_fakegpu_ops.py keeps the check).
FUSED_ON_CUDA = ("silu_backward",)


def _no_compute(*args, **kwargs):
    raise NotImplementedError("the fake GPU has no compute: its tensors exist only inside a FakeTensorMode")


def _register_fused_kernels(lib) -> None:
    """A kernel of the fake device's own for each op in FUSED_ON_CUDA, so it reaches FakeTensorMode whole (fake mode
    gives it its output only, as CUDA's fused kernel does); the kernel itself never runs (fake tensors)."""
    for name in FUSED_ON_CUDA:
        lib.impl(name, _no_compute, "PrivateUse1")


def _grouped_mm_as_on_cuda() -> None:
    """transformers' MoE experts (grouped_mm, its default) on the fake GPU as on CUDA: torch's grouped_mm kernel takes
    bf16 only (torch.nn.functional.grouped_mm's docstring; its meta function checks it), so where expert weights are
    not bf16 transformers' own fallback op runs instead (`transformers::grouped_mm_fallback`, one mm per expert; it
    saves the same input and weight for backward as the grouped kernel). Note: on a real GPU transformers 5.23 would
    call the bf16-only kernel with fp32 weights and fail; pass experts_implementation="eager" there."""
    from transformers.integrations import moe

    original = moe._can_use_grouped_mm
    if getattr(original, "_fake_gpu", False):
        return

    def can_use(input, weight, offs):
        if weight.device.type == NAME:
            return weight.dtype == torch.bfloat16
        return original(input, weight, offs)

    can_use._fake_gpu = True
    moe._can_use_grouped_mm = can_use


@contextlib.contextmanager
def accelerator_stream():
    """torch.accelerator.current_stream() answering for the fake device (a stream that does nothing): FSDP2's
    finalize_backward waits through it on an all-gather that was prefetched and never used (LoRA's frozen
    embedding, whose group runs no backward), and the PrivateUse1 backend registered in Python cannot serve it."""
    original = torch.accelerator.current_stream
    torch.accelerator.current_stream = lambda device=None: _Stream()
    try:
        yield
    finally:
        torch.accelerator.current_stream = original


def device() -> torch.device:
    """The fake GPU device (installs the backend on first use)."""
    install()
    return torch.device(NAME)


CUDA_PROCESS_ENV = "OOM_CASEBOOK_CUDA_PROCESS"     # "1": this process runs CUDA's backward (helpers.measure.gpu)


def wanted() -> bool:
    """Whether this process names PrivateUse1 'gpu' when `helpers.measure` is imported: everywhere but a process that
    runs the GPU mode (CUDA_PROCESS_ENV set). A registered PrivateUse1 backend becomes torch's accelerator
    (at::getAccelerator), and autograd then finds no stream for a CUDA node: every CUDA backward in the process fails
    with 'opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED' (engine.cpp; pytorch/pytorch#161129; seen with
    torch 2.11 on an H100 when this project's GPU mode first ran). So a GPU run goes to a process of its own."""
    import os

    return os.environ.get(CUDA_PROCESS_ENV) != "1"


def registered() -> bool:
    """Whether this process has named PrivateUse1 'gpu' (after which CUDA's backward fails here: see `wanted`)."""
    return torch._C._get_privateuse1_backend_name() == NAME


def register_backend() -> None:
    """Name PyTorch's PrivateUse1 backend 'gpu' (once per process).

    This must happen before the process's first backward pass: autograd sizes its per-device queues then, and a
    device registered later makes backward fail. `helpers.measure` calls it on import for that reason.
    """
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    if torch._C._get_privateuse1_backend_name() != NAME:
        _setup_privateuseone_for_python_backend(rename=NAME, backend_module=_Backend())


def install() -> None:
    """Register the 'gpu' backend, its autocast kernels and the attention function (once per process)."""
    global _installed
    if _installed:
        return
    register_backend()
    torch.clear_autocast_cache = _clear_with_ours(torch.clear_autocast_cache)   # called as autocast exits
    glob = torch.library.Library("_", "IMPL")
    glob.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for names, fp32, opt in ((_LOWER, False, False), (_FP32, True, False), (_FP32_OPT_DTYPE, True, True)):
        for name in names:
            base, _, overload = name.partition(".")
            packet = getattr(torch.ops.aten, base, None)
            if packet is None:
                continue
            for ov in ([overload] if overload else packet.overloads()):
                if ov.startswith("out") or "out" in ov.split("_"):
                    continue
                op = getattr(packet, ov)
                try:
                    lib.impl(op, _kernel(op, fp32, opt), "AutocastPrivateUse1")
                except RuntimeError:
                    pass                                   # an overload with no autocast meaning (e.g. inplace)
    from transformers import AttentionInterface

    AttentionInterface.register("fake_gpu_attention", _flash_attention)
    _grouped_mm_as_on_cuda()
    _register_fused_kernels(lib)
    _libs.extend([glob, lib])
    _installed = True
