"""Activations saved for backward, and the logits / cross-entropy, per GPU.

Counted tensor by tensor from what autograd saves in Hugging Face's Llama/Qwen2 decoder layer (transformers 5):
RMSNorm saves its fp32 upcast, its normalised output and (through the projections) its weighted output; q/k/v/o and MLP projections save their inputs; rotary saves
cos/sin once; SDPA/flash save q, k, v, the output and the fp32 logsumexp, while eager attention saves the fp32 softmax
and its low-precision copy (batch x heads x seq^2 each); SiLU-gated MLPs save four intermediate-width tensors. The
loss follows transformers' ForCausalLMLoss (logits upcast to fp32, log_softmax). Cf. Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", section 4, for the same method on GPT.
Left out: the transient working set inside one op, dropout masks (none in these models), MoE router scratch,
and the memory of CUDA kernels' workspaces.
"""

from __future__ import annotations

import math

from helpers.estimate.items import BWD_END, BWD_HEAD, BWD_START, FORWARDS, LOSS
from helpers.estimate.states import Builder
from helpers.models import ModelSpec
from helpers.units import next_power_of_2


def compute_mode(setup) -> str:
    """'autocast' (an fp32 model under torch.autocast: single/ddp bf16-mixed), 'fp32', or 'low' (bf16 weights)."""
    if setup.precision == "fp32":
        return "fp32"
    if setup.precision == "bf16-mixed" and setup.strategy in ("single", "ddp") and not setup.lora_rank:
        return "autocast"                   # (LoRA's frozen base is bf16 itself: only its adapters are fp32)
    return "low"


def norm_bytes(m: ModelSpec, setup, consumers: int) -> int:
    """Bytes per token one RMSNorm leaves saved: its fp32 input, the normalised tensor, what the next matmuls keep.

    bf16 weights: fp32 upcast 4h + normalised bf16 2h + weighted output 2h (saved by the projections).
    fp32: the input itself 4h + normalised 4h + weighted output 4h. Under autocast the weighted output is fp32 and
    each projection that reads it saves its own bf16 cast (2h per consumer; casts of non-leaf tensors are not cached).
    """
    h, mode = m.hidden, compute_mode(setup)
    if mode == "autocast":
        return (4 + 4 + 2 * consumers) * h
    return (12 if mode == "fp32" else 8) * h


def layer_bytes(m: ModelSpec, setup, moe: bool) -> int:
    """Bytes saved for backward by one decoder layer, without checkpointing."""
    T, B, S = setup.batch * setup.seq, setup.batch, setup.seq
    mode = compute_mode(setup)
    a = 4 if mode == "fp32" else 2                                  # attention / MLP compute dtype
    norms = norm_bytes(m, setup, 3) + norm_bytes(m, setup, 2)
    o_width = m.v_width if m.kv_latent else m.q_width
    v_head = m.v_width // (m.heads if m.kv_latent else m.kv_heads)
    rep_k, rep_v = m.heads * m.head_dim, m.heads * v_head                  # keys/values repeated to every head
    if setup.attention == "eager":
        probs = B * m.heads * S * S * (4 + (0 if mode == "fp32" else 2))   # fp32 softmax + its low-precision copy
        attn = a * T * (m.q_width + rep_k + rep_v + o_width) + probs
    elif mode == "fp32":                                            # memory-efficient kernel, heads repeated
        attn = 4 * T * (m.q_width + rep_k + rep_v + o_width) + 4 * B * m.heads * math.ceil(S / 32) * 32
    elif m.kv_latent:                       # MLA under flash: values and output padded to the query head size
        attn = 2 * T * (m.q_width + m.k_width + 2 * m.q_width + o_width) + 4 * B * m.heads * S
    else:                                                           # flash: q, k, v, output, logsumexp
        attn = 2 * T * (m.q_width + m.k_width + m.v_width + o_width) + 4 * B * m.heads * S
    latent = (4 + 2 * a) * T * m.kv_latent                         # the latent's RMSNorm
    if moe:  # routed pairs keep input, gate/up output, SiLU output, product, output; shared experts as dense
        routed = a * T * m.experts_active * (2 * m.hidden + 4 * m.expert_width)
        router = 4 * T * (m.hidden + m.experts) + 4 * m.experts * m.hidden  # fp32 input, softmax, fp32 weight copy
        mlp = routed + 4 * a * T * m.shared_width + router
    else:
        mlp = 4 * a * T * m.intermediate
    return norms * T + attn + latent + mlp


def add_activations(b: Builder, m: ModelSpec) -> None:
    """Saved activations (forward end, backward start) and, under checkpointing, one recomputed layer."""
    s = b.setup
    T = s.batch * s.seq
    dense_layers = m.layers - m.moe_layers
    per_dense = layer_bytes(m, s, moe=False)
    per_moe = layer_bytes(m, s, moe=True) if m.moe_layers else 0
    full = dense_layers * per_dense + m.moe_layers * per_moe
    stream = (2 if compute_mode(s) == "low" else 4) * T * m.hidden
    final_norm = norm_bytes(m, s, 1) * T
    a = 4 if compute_mode(s) == "fp32" else 2
    width = max(m.intermediate if dense_layers else 0, m.experts_active * m.expert_width + m.shared_width)
    b.gpu("gradient working set of one layer", "temporaries", a * T * (4 * width + 2 * m.hidden), BWD_END,
          "gradients of the MLP's four intermediate tensors and of the hidden state, inside one layer's backward")
    if s.grad_checkpointing:
        b.gpu("layer inputs kept by checkpointing", "activations", m.layers * stream + final_norm,
              FORWARDS | BWD_START | BWD_HEAD, "one residual-stream tensor per layer (torch.utils.checkpoint)")
        b.gpu("one layer recomputed in backward", "activations", max(per_dense, per_moe),
              BWD_END, "checkpointing re-runs a layer's forward before its backward")
    else:
        b.gpu("saved activations", "activations", full + final_norm, FORWARDS | BWD_START | BWD_HEAD,
              f"{per_dense / T:,.0f} bytes per token per dense layer" + (f", {per_moe / T:,.0f} per MoE layer" if per_moe else ""))
        b.gpu("activations of the first layers, not yet freed", "activations", max(per_dense, per_moe), BWD_END,
              "backward frees each layer's saved tensors as it passes")
    if s.lora_rank:
        targets = len(m.lora_targets()) if not s.grad_checkpointing else len(m.lora_targets()) // m.layers
        b.gpu("LoRA intermediates (x @ A, saved by B)", "activations", targets * T * s.lora_rank * a,
              FORWARDS | BWD_START | BWD_HEAD, f"{s.lora_rank} features per token per adapted linear layer")


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's fused linear cross-entropy chunk: next_power_of_2(ceil(tokens / ceil(vocab / hidden)))."""
    return min(tokens, next_power_of_2(math.ceil(tokens / math.ceil(vocab / hidden))))


def add_logits(b: Builder, m: ModelSpec) -> None:
    """Logits and cross-entropy: full logits with the fp32 upcast, or a fused/chunked linear cross-entropy."""
    s = b.setup
    T = s.batch * s.seq
    c = 4 if s.precision == "fp32" else 2
    E = T * m.vocab
    if s.fused_ce:
        chunk = liger_chunk_tokens(T, m.hidden, m.vocab)
        b.gpu("logits of one chunk (fp32 softmax in place)", "logits", chunk * m.vocab * 4, LOSS,
              f"fused linear cross-entropy: {chunk} tokens at a time (Liger's chunk rule)")
        head_grad = 0 if s.lora_rank else m.vocab * m.hidden * c          # a frozen head needs no weight gradient
        b.gpu("input and weight gradients made during forward", "logits", T * m.hidden * c + head_grad,
              FORWARDS | BWD_START | BWD_HEAD, "Liger computes d(hidden) and d(lm_head) in the forward pass")
        return
    upcast = 4 * E if c == 2 else 0
    b.gpu("logits", "logits", c * E, LOSS, f"batch x seq x vocab = {E:,} elements; dropped with the output")
    b.gpu("fp32 upcast + log_softmax output", "logits", upcast + 4 * E, LOSS,
          "ForCausalLMLoss: logits.float(); cross_entropy saves log_softmax's output")
    b.gpu("log_softmax output + its gradient + the logits' fp32 gradient", "logits", 12 * E, BWD_START,
          "nll_loss backward makes a dense fp32 gradient; log_softmax backward another")
