"""QLoRA's 4-bit base (base_weights 'nf4'): the bytes bitsandbytes keeps per quantised weight, and which weights
transformers quantises.

Read in bitsandbytes 0.50.2 (`functional.quantize_4bit`, `nn.modules.Params4bit` / `Linear4bit`,
`autograd/_functions.MatMul4Bit`, `backends/default/ops._gemm_4bit_default_impl`, `backends/cuda/ops.py`) and checked
against the tensors it makes on this CPU (tests/test_qlora.py):
- the codes: two 4-bit values per byte, a uint8 tensor of ceil(n / 2) elements;
- absmax, one per block of 64 weights (NF4's default blocksize): fp32, ceil(n / 64) x 4 bytes (base_weights 'nf4',
  transformers' default `bnb_4bit_use_double_quant=False`); with double quantisation ('nf4-dq',
  `compress_statistics=True`) it is itself quantised to uint8 with `quantize_blockwise(absmax - offset,
  blocksize=256)`: ceil(n / 64) bytes, an fp32 second-level absmax per 256 of them, and the fp32 offset (a 0-dim
  tensor, the mean of the absmax);
- per weight also the 16-entry fp32 NF4 code book, and with double quantisation the 256-entry fp32 code book of the
  8-bit absmax (each Linear4bit holds its own copies: their storages differ from layer to layer).
Which weights: transformers' bitsandbytes integration replaces every nn.Linear but the output head (and the modules
tied to it) with Linear4bit; the embedding (an nn.Embedding), the norms and the head stay in the load dtype
(bf16 here, the compute dtype). peft's `prepare_model_for_kbit_training` would then cast every parameter that is
not a Params4bit to fp32 (peft 0.21 `utils/other.py`); that upcast, and the fp32 norm outputs it makes, are not
modelled: the set-up here keeps them in bf16 (as torchtune's and Unsloth's QLoRA do).
While a 4-bit linear computes, its weight exists dequantised in the compute dtype, with its absmax dequantised to
fp32 (`_gemm_4bit_default_impl` in forward, which CUDA also runs past 1536 tokens; `F.dequantize_4bit` in
`MatMul4Bit.backward`), one layer at a time; MatMul4Bit saves only the 4-bit weight for backward, no input.
"""

from __future__ import annotations

import math

from helpers.models import ModelSpec, Tensor

NF4_BLOCK = 64              # quantize_4bit's default blocksize: one absmax per 64 weights
ABSMAX_BLOCK = 256          # double quantisation: quantize_blockwise(absmax - offset, blocksize=256)
NF4_CODE = 16 * 4           # the NF4 code book, 16 fp32 values, per quantised weight
ABSMAX_CODE = 256 * 4       # the dynamic 8-bit code book of the quantised absmax, 256 fp32 values, per weight
OFFSET = 4                  # the fp32 mean of the absmax, a 0-dim tensor


def nf4_tensors(m: ModelSpec) -> tuple[Tensor, ...]:
    """The weights transformers stores in 4 bits: every linear layer of the decoder layers (not the head)."""
    return m.lora_targets("all-linear")


def nf4_weight_bytes(numel: int, double: bool) -> int:
    """Bytes one Linear4bit keeps for a weight of `numel` elements: the codes and the NF4 code book, with the fp32
    absmax, or (`double`) the 8-bit absmax, its fp32 second-level absmax, the offset and its code book."""
    blocks = math.ceil(numel / NF4_BLOCK)
    codes = (numel + 1) // 2 + NF4_CODE
    if not double:
        return codes + 4 * blocks
    return codes + blocks + 4 * math.ceil(blocks / ABSMAX_BLOCK) + OFFSET + ABSMAX_CODE


def nf4_base_bytes(m: ModelSpec, double: bool) -> tuple[int, int]:
    """(bytes of the 4-bit weights with their quantisation state, elements of the parameters left unquantised)."""
    quantised = nf4_tensors(m)
    return sum(nf4_weight_bytes(t.numel, double) for t in quantised), m.params - sum(t.numel for t in quantised)


def dequantized_bytes(m: ModelSpec, compute_bytes: int = 2) -> int:
    """The largest transient of a 4-bit matmul: the weight dequantised in the compute dtype and its fp32 absmax."""
    return max(compute_bytes * t.numel + 4 * math.ceil(t.numel / NF4_BLOCK) for t in nf4_tensors(m))
