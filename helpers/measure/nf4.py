"""QLoRA's 4-bit base in the measured runs: the decoder layers' linear layers made bitsandbytes Linear4bit (NF4, with
or without double quantisation, bf16 compute), as transformers' bitsandbytes integration loads them (bitsandbytes
0.50.2); with a set-up whose `versions` name a bitsandbytes before 0.43.2, its 4-bit matmul as that release kept its
input (`inputs_kept`, re-enacted on the installed release).

- Scaled runs: bitsandbytes quantises the twin on this CPU (`Params4bit._quantize`), and its training matmul runs
  its default kernel (`backends/default/ops._gemm_4bit_default_impl`: the absmax dequantised to fp32, the weight to
  the compute dtype, then F.linear), the path CUDA takes past 1536 tokens (`backends/cuda/ops.py`).
- Dry runs: `Params4bit` is made with `torch.Tensor._make_subclass`, which refuses a FakeTensor, so the weight is
  quantised by bitsandbytes' own `functional.quantize_4bit` (its fake kernels give the shapes) into a plain Parameter
  that carries the QuantState (`Linear4bit.forward` reads `weight.quant_state` as it is); and since the fake kernel of
  `gemm_4bit` makes the product alone, `dequantized_matmuls` runs the same default kernel, so the dequantised weight
  is counted as a GPU holds it. MatMul4Bit's backward (`F.dequantize_4bit`) runs unchanged.
See helpers.estimate.quantized for the bytes and their sources.
"""

from __future__ import annotations

import contextlib

import torch


def quantize(net, device=None, *, double: bool):
    """Replace every nn.Linear of the decoder layers (not the output head) with an NF4 Linear4bit holding the same
    weight, quantised on `device` (the weight's own device by default), with double quantisation or without
    (`double`: transformers' bnb_4bit_use_double_quant); the compute dtype is the model's own (bf16, or fp32 for
    precision 'fp32', as transformers passes bnb_4bit_compute_dtype); returns `net`."""
    import bitsandbytes as bnb
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    head = net.get_output_embeddings()
    compute_dtype = next(net.parameters()).dtype
    for name, module in list(net.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            with unset_fake_temporarily():       # (its placeholder Params4bit cannot wrap a fake tensor)
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=compute_dtype, compress_statistics=double, quant_type="nf4",
                                      device="meta")
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data.to(compute_dtype), requires_grad=False)
            if isinstance(child.weight, FakeTensor):
                _quantize_fake(q, child.weight.data.to(compute_dtype), double)
            else:
                q.weight = bnb.nn.Params4bit(child.weight.data.to(compute_dtype), requires_grad=False,
                                             compress_statistics=double, quant_type="nf4", module=q)
                q.weight = q.weight._quantize(device or child.weight.device)
            q.train(child.training)
            setattr(module, child_name, q)
    return net


def _quantize_fake(q, w, double: bool) -> None:
    """On fake tensors: bitsandbytes' own quantize_4bit (its fake kernels give the shapes and dtypes) into a plain
    Parameter carrying the QuantState (Linear4bit's forward takes a weight's `quant_state` as it is)."""
    import bitsandbytes.functional as F
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if "dynamic" not in F.name2qmap:             # bitsandbytes caches this code book for good: make it a real one
        with unset_fake_temporarily():
            F.name2qmap["dynamic"] = F.create_dynamic_map()
    w4, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=double, quant_type="nf4")
    q.weight = torch.nn.Parameter(w4, requires_grad=False)
    q.weight.quant_state = q.quant_state = qs


def recreate_on(net, device) -> None:
    """Fake tensors: each 4-bit weight and its quantisation state made again on `device` (they cannot be moved)."""
    for module in net.modules():
        w = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        qs = getattr(w, "quant_state", None)
        if qs is None:
            continue
        level = qs
        while level is not None:
            for attr in ("absmax", "code", "offset"):
                t = getattr(level, attr)
                if isinstance(t, torch.Tensor):
                    setattr(level, attr, torch.empty_like(t, device=device))
            level = level.state2
        module.weight = torch.nn.Parameter(torch.empty_like(w, device=device), requires_grad=False)
        module.weight.quant_state = module.quant_state = qs


@contextlib.contextmanager
def dequantized_matmuls():
    """On fake tensors bitsandbytes' `gemm_4bit` runs its registered fake kernel, which makes the product alone: run
    bitsandbytes' own default kernel instead (`backends/default/ops._gemm_4bit_default_impl`: absmax dequantised to
    fp32, the weight to the compute dtype, F.linear), the path CUDA takes past 1536 tokens, so the dequantised weight
    is counted as a GPU holds it."""
    from bitsandbytes.backends.default import ops as default_ops

    ns = torch.ops.bitsandbytes
    original = ns.gemm_4bit
    ns.gemm_4bit = _Overload(default_ops._gemm_4bit_default_impl)
    try:
        yield
    finally:
        ns.gemm_4bit = original


class _Overload:
    """Stands in for `torch.ops.bitsandbytes.gemm_4bit`, whose callers use `.default`."""

    def __init__(self, fn):
        self.default = fn


def state_tensors(net) -> list[torch.Tensor]:
    """The tensors of every Linear4bit's quantisation state (absmax, offset, code books, second-level absmax): not
    parameters or buffers, so a census must be told of them."""
    out = {}
    for module in net.modules():
        qs = getattr(getattr(module, "weight", None), "quant_state", None)   # (peft's wrapper shows its base's)
        while qs is not None:
            out.update({id(t): t for t in (qs.absmax, qs.code, qs.offset) if isinstance(t, torch.Tensor)})
            qs = qs.state2
    return list(out.values())


def matmul_as(setup):
    """The 4-bit matmul as the set-up's bitsandbytes release runs it: `inputs_kept` where its `versions` name a
    release before 0.43.2, else the installed one unchanged."""
    from helpers import versions

    if setup.quantized and versions.older(setup, "bnb_4bit_input_kept"):
        return inputs_kept()
    return contextlib.nullcontext()


@contextlib.contextmanager
def inputs_kept():
    """bitsandbytes before 0.43.2, re-enacted on the installed one: `MatMul4Bit.forward` kept its input as
    `ctx.tensors = (A, B)` where 0.43.2 keeps `(None, B)` (commit 9e75374, 'fix QLoRA mem bug: delete useless buffered
    activation', PR #1270); a ctx attribute is not a saved tensor, so backward never frees it and it lives as long as
    the autograd graph. The installed forward runs unchanged and the input is then put back where the old one kept
    it, which is the whole of that change."""
    from bitsandbytes.autograd import _functions as fns

    original = fns.MatMul4Bit.forward

    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        output = original(ctx, A, B, out, bias, quant_state)
        if not ctx.is_empty and ctx.tensors[1] is not None:
            ctx.tensors = (A, ctx.tensors[1])
        return output

    fns.MatMul4Bit.forward = staticmethod(forward)
    try:
        yield
    finally:
        fns.MatMul4Bit.forward = staticmethod(original)
