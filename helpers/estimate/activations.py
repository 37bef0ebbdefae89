"""Activations saved for backward, and the logits / cross-entropy, per GPU.

Counted tensor by tensor from what autograd saves in Hugging Face's Llama/Qwen2 decoder layer (transformers 5):
RMSNorm saves its fp32 upcast, its fp32 reciprocal root (one value per token), its normalised output and (through the
projections) its weighted output; q/k/v/o and MLP projections save their inputs; the rotary cos/sin tables, made once
per forward, are saved once (read from each model's own rotary_emb: models.rope_tables); SDPA/flash save q, k, v, the
output and the fp32 logsumexp, while eager attention saves the fp32 softmax and its low-precision copy (batch x heads x seq^2 each); SiLU-gated MLPs save four intermediate-width tensors. The
loss follows transformers' ForCausalLMLoss (logits upcast to fp32, log_softmax). Cf. Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", section 4, for the same method on GPT.
Left out: the transient working set inside one op, dropout masks (none in these models), MoE router scratch,
and the memory of CUDA kernels' workspaces.
"""

from __future__ import annotations

import math

from helpers import versions
from helpers.errors import InputError
from helpers.estimate import adapters, parallel, quantized, sft_loss
from helpers.estimate.items import (
    BWD_DONE,
    BWD_END,
    BWD_HEAD,
    BWD_START,
    FORWARDS,
    GATHER,
    LOSS,
    START,
    STEP,
    STEP_NORM,
    STEP_PREPARE,
)
from helpers.estimate.states import Builder, dtype_bytes
from helpers.models import ModelSpec
from helpers.units import next_power_of_2

FIRST_FORWARDS = frozenset({"forward_start", "forward_gather", "forward"})
STEADY_FORWARDS = frozenset({"steady_forward_start", "steady_forward_gather", "steady_forward"})


def compute_mode(setup) -> str:
    """'autocast' (an fp32 model under torch.autocast: single/ddp bf16-mixed), 'fp32', or 'low' (bf16 weights)."""
    if setup.precision == "fp32":
        return "fp32"
    if setup.mixed and setup.strat.autocast and (not setup.lora_rank or setup.base_fp32):
        return "autocast"                   # (LoRA's frozen base is bf16 itself unless base_weights 'fp32')
    return "low"


RSTD = 4     # per token per RMSNorm: transformers' `hidden_states * torch.rsqrt(variance + eps)` saves the fp32
#              rsqrt, one value per token (per head for the query and key norms), beside its input


def norm_bytes(m: ModelSpec, setup, consumers: int) -> int:
    """Bytes per token one RMSNorm leaves saved: its fp32 input, the normalised tensor, what the next matmuls keep,
    and its fp32 reciprocal root (RSTD).

    bf16 weights: fp32 upcast 4h + normalised bf16 2h + weighted output 2h (saved by the projections); Gemma's norm
    keeps its normalised tensor in fp32 (4h: `x * (1 + w)` runs in fp32, cast back after).
    fp32: the input itself 4h + normalised 4h + weighted output 4h. Under autocast the weighted output is fp32 and
    each projection that reads it saves its own bf16 cast (2h per consumer; casts of non-leaf tensors are not cached).
    A norm whose output only joins the residual stream (Gemma's after attention and after the MLP: consumers 0) keeps
    no weighted output.
    """
    h, mode = m.hidden, compute_mode(setup)
    if mode == "autocast":
        return (4 + 4 + 2 * consumers) * h + RSTD
    if mode == "fp32":
        return (8 + 4 * bool(consumers)) * h + RSTD
    return (4 + (4 if m.gemma_norm else 2) + 2 * bool(consumers)) * h + RSTD


def qk_norm_bytes(m: ModelSpec, setup) -> int:
    """Bytes per token the per-head query and key RMSNorms keep (Qwen3, Gemma 3): the fp32 upcast (4) and the
    normalised tensor (bf16 2, or fp32 4 in fp32 and in Gemma's norm); rotary embedding saves only cos and sin."""
    if not m.qk_norm:
        return 0
    normalised = 4 if compute_mode(setup) == "fp32" or m.gemma_norm else 2
    return (4 + normalised) * (m.q_width + m.k_width) + RSTD * (m.heads + m.kv_heads)


def adapted_names(m: ModelSpec, setup) -> set[str]:
    """The module names ('q_proj', 'down_proj', ...) the set-up's LoRA adapts in a decoder layer."""
    return {t.name.rsplit(".", 2)[-2] for t in adapters.targets(m, setup) if t.group == "layer.0" and t.linear}


def first_iteration_casts(setup) -> bool:
    """LoRA under FSDP1 with bf16-mixed: an adapter's weight, as peft reads it before calling the adapter
    (`lora_A.weight.dtype`), is a view of its unit's fp32 FlatParameter until that unit is first unsharded; FSDP1
    (use_orig_params=False, accelerate's default) then leaves it a view of the bf16 unsharded buffer. So in the first
    iteration peft casts each adapted linear's input to fp32 and autocast casts it back to bf16, a copy each adapter
    keeps (as on one GPU under autocast); from the second on the casts are no-ops and the adapters share their input.
    torch 2.13 `torch/distributed/fsdp/_flat_param.py` (_use_unsharded_views); peft 0.21 tuners/lora/layer.py
    Linear.forward (_cast_input_dtype); located in dry runs (iteration 1 saves 4 more layer-input copies per Llama
    layer than iteration 2)."""
    return bool(setup.lora_rank) and setup.strat.engine == "fsdp1" and setup.precision == "bf16-mixed" \
        and not setup.use_orig_params


def every_iteration_casts(setup) -> bool:
    """As `first_iteration_casts`, in every iteration: FSDP1 with use_orig_params=True makes the original parameters
    views of the sharded FlatParameter again after each reshard (`_flat_param.py` _use_sharded_views), the adapters'
    fp32 shards, so peft casts each adapted layer's input every time (dry runs: iteration 2 keeps as much as 1)."""
    return bool(setup.lora_rank) and setup.strat.engine == "fsdp1" and setup.precision == "bf16-mixed" \
        and setup.use_orig_params


def adapter_input_copy(setup, first: bool = False) -> int:
    """Bytes per element of the copy of its input each adapted linear keeps for itself, 0 where the adapters read the
    very tensor the base layer read. peft casts a layer's input to the adapters' dtype (`_cast_input_dtype`): fp32
    adapters on a bf16 base (`TrainSetup.adapters_fp32`, peft's default) get an fp32 copy each, which they keep
    (4); under torch's autocast the matmul casts it back to bf16 and keeps that (2); adapters in the base's dtype
    share the input (0), and so do fp32 adapters whose engine computes with 16-bit copies of them (FSDP2's
    MixedPrecisionPolicy: peft casts the input to that copy's dtype, a no-op). `first`: in the first iteration, where
    `first_iteration_casts` says it differs (2)."""
    if first and first_iteration_casts(setup) or every_iteration_casts(setup):
        return 2
    if not setup.adapters_fp32 or setup.precision == "fp32" or not setup.strat.adapter_dtype:
        return 0
    return 2 if setup.mixed and setup.strat.autocast else 4


def mlp_forward_working_set(m: ModelSpec, s) -> tuple[str, int]:
    """(what, bytes) alive in one dense layer's forward when nothing is saved (a checkpointed layer), at its MLP's
    peak: the residual sum and the normed input, then gate's result beside up's being made. With LoRA on gate/up,
    up's base output, its adapters' input copy (fp32 for fp32 adapters; cast to bf16 again under autocast), the
    dropped copy and its mask (lora_dropout), lora_B's output and its scaled copy (or the sum they make); else
    act(gate), up and their product."""
    T, H, I = s.batch * s.seq, m.hidden, m.intermediate
    mode = compute_mode(s)
    a = 4 if mode == "fp32" else 2                         # a matmul's output (bf16 under autocast)
    stream = 2 if mode == "low" else 4
    around = T * H * (2 * stream + (2 if mode == "autocast" else 0))   # h, the normed x (and its bf16 cast)
    if s.lora_rank and adapted_names(m, s) & {"gate_proj", "up_proj", "gate_up_proj"}:
        own = adapter_input_copy(s)
        d = 2 if s.mixed and s.strat.autocast else (4 if own == 4 else a)     # lora_B's output
        copies = (4 + (2 if own == 2 else 0) if own else 0) + ((own or a) + 1 if s.lora_dropout else 0)
        return ("gate's result, up's base output and its adapters' input copies and output",
                around + T * (2 * a * I + 2 * d * I + copies * H))
    return "act(gate), up and their product", around + 3 * a * T * I


def first_backward_working_set(m: ModelSpec, s, width: int) -> tuple[str, int]:
    """(what, bytes) of the larger of the final norm's backward and the last layer's MLP backward, the first of the
    backward's working sets (not checkpointed, no full logits), beside every saved activation. The norm:
    transformers' RMSNorm computes in fp32, and autograd's backward of its pow, mean, rsqrt and products holds five
    batch x seq x hidden fp32 tensors at once. The MLP (`width` its intermediate width): the gradients of down_proj's
    input and of the product's two factors (three batch x seq x width), the residual stream's gradient, and, with the
    weights trained, down_proj's weight gradient, the first one made; down_proj's saved input (batch x seq x width)
    is freed by then. Seen in dry runs of reward models on torch 2.13: the norm's is the peak under 16-bit compute,
    the MLP's in fp32."""
    T, tp = s.batch * s.seq, s.tensor_parallel
    a = 4 if compute_mode(s) == "fp32" else 2
    norm = 5 * 4 * T * m.hidden // tp
    compute, storage = dtype_bytes(s)
    grad = compute if s.strat.deepspeed else storage            # (DeepSpeed's bf16 module makes bf16 gradients)
    mlp = a * T * (2 * width + m.hidden) // tp + (0 if s.lora_rank else m.intermediate * m.hidden * grad // tp)
    if norm >= mlp:
        return "the final norm's backward (five fp32 batch x seq x hidden tensors)", norm
    return ("the last layer's MLP backward (its input gradients, less down_proj's saved input, and down_proj's "
            "weight gradient)"), mlp


def mlp_forward_transient(m: ModelSpec, s) -> tuple[str, int]:
    """(what, bytes) of `mlp_forward_working_set` that a layer not checkpointed does not keep for backward: of the
    MLP's outputs gate's result alone is saved (by the activation) by the time up's adapters run; without adapters on
    gate/up act(gate), up and their product are all saved (by the product and down_proj), leaving the residual sum
    and the normed input."""
    what, nbytes = mlp_forward_working_set(m, s)
    a = 4 if compute_mode(s) == "fp32" else 2
    T, I = s.batch * s.seq, m.intermediate
    lora_mlp = bool(s.lora_rank and adapted_names(m, s) & {"gate_proj", "up_proj", "gate_up_proj"})
    saved = a * T * I * (1 if lora_mlp else 3)
    return what + " (less what it saves)", nbytes - saved


def lora_saves(m: ModelSpec, setup, first: bool = False) -> tuple[int, int, int]:
    """Bytes per token a decoder layer with LoRA keeps in its norms, for o_proj's input and for down_proj's input.

    The base is frozen, norms included: a frozen linear saves no input and `weight * x` with a frozen weight saves
    no x, so a norm keeps only its fp32 upcast (4 per element; Gemma's likewise), and a layer's input is kept by the
    adapters that read it: once, shared, when the adapters are in the base's dtype; else each adapted linear keeps a
    copy of its own (`adapter_input_copy`: fp32 without autocast, bf16 under it).

    With lora_dropout > 0 (peft 0.21 tuners/lora/layer.py Linear.forward: `lora_B(lora_A(dropout(x)))`, an
    nn.Dropout), every adapted linear reads its own dropped copy: lora_A saves that copy (in the adapters' compute
    dtype: bf16 under autocast, fp32 for fp32 adapters without it, else the base's) instead of the shared input, and
    torch's native_dropout saves its mask for backward (bool, 1 byte per element)."""
    a = 4 if compute_mode(setup) == "fp32" else 2
    own = adapter_input_copy(setup, first)
    dropped = bool(setup.lora_dropout)
    adapted = adapted_names(m, setup)

    def kept(names) -> int:                  # per element of an input the named linears read
        n = len(adapted & names)
        if dropped:
            return n * ((own or a) + 1)
        return own * n if own else a * bool(n)

    h = m.hidden
    norms = (4 + kept({"q_proj", "k_proj", "v_proj", "qkv_proj"})) * h \
        + (4 + kept({"gate_proj", "up_proj", "gate_up_proj"})) * h + (m.norms - 2) * 4 * h + m.norms * RSTD
    norms += 4 * (m.q_width + m.k_width) + RSTD * (m.heads + m.kv_heads) if m.qk_norm else 0
    o_input = kept({"o_proj"}) * m.q_width if own or dropped else 0    # else: the attention output, saved anyway
    down_input = kept({"down_proj"}) * m.intermediate
    return norms, o_input, down_input


def unmasked_first_readers(m: ModelSpec, setup) -> int:
    """Bytes per token of LoRA dropout masks the first decoder layer does not keep: without checkpointing the frozen
    embedding's output carries no gradient (peft's enable_input_require_grads runs only under checkpointing), so the
    adapters reading layer 0's first norm drop an input that needs no gradient and autograd saves no mask for it
    (`lora_saves` counts one for every adapted linear of every layer)."""
    if not (setup.lora_rank and setup.lora_dropout) or setup.checkpointing != "none":
        return 0
    first = {"q_proj", "k_proj", "v_proj", "qkv_proj"}
    return sum(t.shape[1] for t in adapters.targets(m, setup)
               if t.group == "layer.0" and t.linear and t.name.rsplit(".", 2)[-2] in first)


QKV_NAMES, MLP_IN_NAMES = {"q_proj", "k_proj", "v_proj", "qkv_proj"}, {"gate_proj", "up_proj", "gate_up_proj"}


def all_4bit_inputs(m: ModelSpec, setup) -> int:
    """Bytes per token of every 4-bit linear's input in one decoder layer: q/k/v's and gate/up's (hidden each),
    o_proj's (q_width) and down_proj's (intermediate), in the compute dtype."""
    return (4 if compute_mode(setup) == "fp32" else 2) * (2 * m.hidden + m.q_width + m.intermediate)


def kept_4bit_inputs(m: ModelSpec, setup) -> tuple[int, int]:
    """bitsandbytes before 0.43.2 (helpers.versions 'bnb_4bit_input_kept'): MatMul4Bit kept each 4-bit linear's
    input as a ctx attribute, which backward never frees. (Bytes per token one decoder layer keeps so beyond what it
    saves anyway, bytes per token the first layer keeps less.)

    Without checkpointing an input is extra where no adapter already saves that very tensor (peft's adapters share it
    when they run in the base's dtype without dropout): the norms' outputs read by q/k/v and by gate/up, and down's
    input; o_proj's input is the attention kernel's output, saved anyway. The first layer's q/k/v read the frozen
    embedding's output, which needs no gradient, so their MatMul4Bit keeps nothing (`needs_input_grad` all False).
    Under full checkpointing (non-reentrant, transformers' default from 5.0, PR #43203) the layer's saved tensors are
    dropped and recomputed, but a ctx attribute is not a saved tensor: every 4-bit linear's input stays, the first
    layer's too (peft's enable_input_require_grads); under reentrant checkpointing (before 5.0: the
    'checkpointing_reentrant' rule) the checkpointed forward runs without autograd and keeps none (`add_activations`).
    Measured on dry runs with the old matmul re-enacted (`helpers.measure.nf4.inputs_kept`)."""
    if setup.attention == "eager" or m.kv_latent or m.moe_layers:
        raise InputError(f"bitsandbytes before 0.43.2 (versions {setup.versions!r}) is modelled for dense "
                         f"attention-kernel (sdpa, flash) layers without MLA: {m.name} with attention "
                         f"{setup.attention!r} is not: give a bitsandbytes of 0.43.2 or later")
    a = 4 if compute_mode(setup) == "fp32" else 2
    adapted = adapted_names(m, setup)
    own = adapter_input_copy(setup)
    shared = lambda names: bool(adapted & names) and not own and not setup.lora_dropout  # noqa: E731
    if setup.checkpointing != "none":
        return all_4bit_inputs(m, setup), 0
    qkv = 0 if shared(QKV_NAMES) else a * m.hidden
    mlp_in = 0 if shared(MLP_IN_NAMES) else a * m.hidden
    down = 0 if shared({"down_proj"}) else a * m.intermediate
    return qkv + mlp_in + down, qkv


def base_weight_copies(m: ModelSpec, setup) -> tuple[int, int, int]:
    """LoRA on an fp32 base under autocast (base_weights 'fp32'): (bytes of the 16-bit weight copies one decoder layer's
    linears keep, bytes of them the first layer keeps less without checkpointing, bytes of the output head's copy).

    Autocast casts a linear's fp32 weight to the 16-bit dtype for each call and caches the cast only for a leaf that
    requires grad (torch aten/src/ATen/autocast_mode.h `cached_cast`), so a frozen weight is cast afresh by every
    linear; `F.linear` then saves that copy for its input's gradient whenever its input needs one (its weight needs
    none, so the input itself is not saved). Without checkpointing the first layer's linears up to its first adapter
    read the frozen embedding's output, which needs no gradient, and keep nothing; under checkpointing peft's
    enable_input_require_grads gives that output a gradient, and the recomputed layer keeps every copy."""
    half = 2
    layer0 = [t for t in m.tensors if t.group == "layer.0" and t.linear]
    per_layer = half * sum(t.numel for t in layer0)
    adapted, less = adapted_names(m, setup), 0
    if setup.checkpointing == "none":
        for names in (QKV_NAMES, {"o_proj"}, MLP_IN_NAMES, {"down_proj"}):
            less += half * sum(t.numel for t in layer0 if t.name.rsplit(".", 2)[-2] in names)
            if adapted & names:
                break
    head = half * (m.lm_head_params if setup.run == "rm" else m.vocab * m.hidden)    # (a reward model's score head)
    return per_layer, less, head


def add_base_weight_copies(b: Builder, m: ModelSpec) -> None:
    """The 16-bit copies of an fp32 frozen base's weights that its linears save for backward (`base_weight_copies`)."""
    s = b.setup
    if m.moe_layers or m.kv_latent:
        raise InputError(f"base_weights 'fp32' is modelled for dense models without MLA: {m.name}'s experts or latent "
                         f"attention compute differently under autocast (leave base_weights out: a bf16 base)")
    per_layer, less, head = base_weight_copies(m, s)
    why = (f"autocast casts a frozen fp32 weight afresh for every matmul (it caches casts of trainable leaves only) "
           f"and the linear saves the {s.half} copy for its input's gradient: {per_layer / 2**20:,.0f} MiB per layer")
    if s.checkpointing == "full":
        kept = sum(1 for i in range(m.layers) if (i + 1) % s.checkpoint_every) * per_layer
        if kept:
            b.gpu(f"{s.half} copies of the fp32 base's weights in the layers not checkpointed", "activations", kept,
                  FORWARDS | BWD_START | BWD_HEAD, why)
        last_layer = last_layer_peak(s)
        b.gpu(f"{s.half} copies of the fp32 base's weights in the layer recomputed", "activations", per_layer,
              BWD_END | (BWD_HEAD if last_layer else frozenset()),
              why + "; checkpointing re-runs a layer's forward, and its casts, before its backward")
    else:
        b.gpu(f"{s.half} copies of the fp32 base's weights, saved by its linears", "activations",
              m.layers * per_layer - less, FORWARDS | BWD_START | BWD_HEAD,
              why + (f"; the first layer's linears before its first adapter read the frozen embedding's output, which "
                     f"needs no gradient, and keep none ({less / 2**20:,.0f} MiB less)" if less else ""))
        b.gpu(f"{s.half} copies of the first layer's weights, not yet freed", "activations", per_layer - less, BWD_END,
              "backward frees each layer's saved tensors as it passes")
    b.gpu(f"{s.half} copy of the fp32 output head's weight, saved for the hidden states' gradient", "logits", head,
          LOSS | BWD_START | BWD_HEAD, "the frozen head is cast like the other linears; kept until the head's backward")


def expanded_kv_bytes(m: ModelSpec, setup) -> int:
    """Bytes per token per layer that keeping keys and values expanded to every query head adds to what a 16-bit
    flash/SDPA kernel saves (`kv_expanded`: torchtune's MultiHeadAttention at bd2a0fc, attention.py 284-290, and
    LitGPT's CausalSelfAttention at 2685705, model.py 534-536, copy them with expand + flatten/reshape before SDPA;
    the kernel saves the copies, the grouped ones are freed); 0 where the modelled attention keeps them expanded
    anyway (eager, fp32), for MLA and without grouped-query attention."""
    if not setup.kv_expanded or m.kv_latent or m.kv_heads >= m.heads or setup.attention == "eager" \
            or compute_mode(setup) == "fp32":
        return 0
    return 2 * (m.heads * m.head_dim - m.k_width) + 2 * (m.heads * m.v_width // m.kv_heads - m.v_width)


def _expanded_note(m: ModelSpec, s) -> str:
    extra = expanded_kv_bytes(m, s)
    return (f"; {extra:,} bytes per token per layer of it are the keys and values expanded to every query head "
            f"(kv_expanded: torchtune's and LitGPT's attention)") if extra else ""


def layer_bytes(m: ModelSpec, setup, moe: bool, first: bool = False) -> int:
    """Bytes saved for backward by one decoder layer, without checkpointing (`first`: in the first iteration)."""
    T, B, S = setup.batch * setup.seq, setup.batch, setup.seq
    mode = compute_mode(setup)
    a = 4 if mode == "fp32" else 2                                  # attention / MLP compute dtype
    if setup.lora_rank:
        norms, o_input, down_input = lora_saves(m, setup, first)
    else:
        qkv_readers, mlp_readers = (1 if m.fused_qkv else 3), (1 if m.fused_gate_up else 2)
        norms = norm_bytes(m, setup, qkv_readers) + norm_bytes(m, setup, mlp_readers) \
            + (m.norms - 2) * norm_bytes(m, setup, 0) + qk_norm_bytes(m, setup)
        o_input, down_input = 0, a * m.intermediate
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
        attn = 2 * T * (m.q_width + m.k_width + m.v_width + o_width) + 4 * B * m.heads * S \
            + T * expanded_kv_bytes(m, setup)
    if m.fused_qkv and not (setup.attention != "flash" and mode == "fp32" and m.kv_heads < m.heads) \
            and not ((setup.attention == "eager" or setup.kv_expanded) and m.kv_heads < m.heads):
        attn += a * T * (m.q_width + m.k_width)      # saved values are a view: the whole qkv output stays alive
    latent = ((4 + 2 * a) * m.kv_latent + RSTD) * T if m.kv_latent else 0     # the latent's RMSNorm
    if moe:  # routed pairs keep input, gate/up output, SiLU output, product, output; shared experts as dense
        e = 4 if mode != "low" else 2       # experts' grouped_mm is not on autocast's list: fp32 weights, fp32 pairs
        routed = e * T * m.experts_active * (2 * m.hidden + 4 * m.expert_width)
        router = 4 * T * (m.hidden + m.experts) + 4 * m.experts * m.hidden  # fp32 input, softmax, fp32 weight copy
        mlp = routed + 4 * a * T * m.shared_width + router
    else:
        mlp = 3 * a * T * m.intermediate + T * down_input   # gate and up outputs, SiLU output; down's input
    return norms * T + attn + latent + mlp + T * o_input


def selective_bytes(m: ModelSpec, setup) -> int:
    """Bytes one decoder layer keeps under torchtitan's op-level selective checkpointing, besides its input: the
    output of every odd-numbered matmul of the layer (q, v, gate and down projections in a Llama layer; a linear with
    a bias is an addmm, which the policy neither counts nor saves) and the attention kernel's output and fp32
    logsumexp (eager attention's matmuls and softmax are not on the list: recomputed)."""
    T, B, S = setup.batch * setup.seq, setup.batch, setup.seq
    a = 4 if compute_mode(setup) == "fp32" else 2
    names = {t.name for t in m.tensors}
    linears = [t for t in m.tensors if t.group == "layer.0" and t.linear]
    mms = [t for t in linears if t.name[:-len("weight")] + "bias" not in names]
    saved = sum(a * T * t.shape[0] for t in mms[0::2])
    if setup.attention == "eager":
        return saved
    if a == 4:                                        # the memory-efficient kernel pads its logsumexp to 32
        return saved + 4 * T * m.q_width + 4 * B * m.heads * math.ceil(S / 32) * 32
    return saved + 2 * T * m.q_width + 4 * B * m.heads * S


def sequence_parallel_saving(m: ModelSpec, setup, tokens: int) -> int:
    """Bytes one RMSNorm saves less under sequence parallelism (TP degree t): its upcast and normalised output are
    kept for 1/t of the sequence; what its readers save (the all-gathered input of the colwise linears) stays whole.
    See helpers.estimate.parallel."""
    tp = setup.tensor_parallel
    own = norm_bytes(m, setup, 0) * tokens                  # the norm's own saved tensors, without its readers'
    return own - own // tp


def moe_layer_indices(m: ModelSpec) -> set[int]:
    """Indices of the decoder layers whose MLP is a mixture of experts (those holding expert weights)."""
    return {int(t.group.split(".")[1]) for t in m.tensors
            if t.group.startswith("layer.") and ".experts." in f".{t.name}"}


def add_activations(b: Builder, m: ModelSpec) -> None:
    """Saved activations (forward end, backward start) and, under checkpointing, one recomputed layer.

    With tensor/context parallelism `m` is one TP rank's share (helpers.estimate.parallel.rank_model) and each rank
    sees 1/cp of every sequence; the norms and the residual stream are sequence-parallel (1/tp)."""
    s, tp, cp = parallel.rank_setup(b.setup), b.setup.tensor_parallel, b.setup.context_parallel
    T = s.batch * s.seq
    dense_layers = m.layers - m.moe_layers
    sp = sequence_parallel_saving(m, s, T) if tp > 1 else 0
    per_dense = layer_bytes(m, s, moe=False) - (m.norms * sp if dense_layers else 0)
    per_moe = layer_bytes(m, s, moe=True) - m.norms * sp if m.moe_layers else 0
    full = dense_layers * per_dense + m.moe_layers * per_moe - unmasked_first_readers(m, s) * T
    stream = (2 if compute_mode(s) == "low" else 4) * T * m.hidden // tp
    final_norm = norm_bytes(m, s, 1) * T - sp
    a = 4 if compute_mode(s) == "fp32" else 2
    width = max(m.intermediate if dense_layers else 0, m.experts_active * m.expert_width + m.shared_width)
    # with no full logits (a fused or chunked loss, a reward model's score) the last layer's backward, every layer's
    # input kept, is the backward's peak: counted at BWD_HEAD, the head's backward being part of the loss's
    # (BWD_START) there
    last_layer = last_layer_peak(s)
    b.gpu("gradient working set of one layer", "temporaries", a * T * (3 * width + 2 * m.hidden),
          BWD_END | (BWD_HEAD if last_layer else frozenset()),
          "gradients in flight in one MLP's backward: of the SiLU output, of up's output and of gate's output (CUDA's "
          "fused silu_backward makes no more; decomposed it kept a sigmoid and 1 - sigmoid too), and of the hidden state")
    if s.lora_rank and s.mixed and s.strat.autocast and adapted_names(m, s) & {"gate_proj", "up_proj", "gate_up_proj"}:
        b.gpu("the gradient of gate's or up's scaled adapter output", "temporaries", 2 * T * m.intermediate,
              BWD_END | (BWD_HEAD if last_layer else frozenset()),
              "peft 0.21 tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(x)) * scaling; the product's "
              "backward makes a new gradient of its output (bf16 under autocast) beside the MLP's own")
    if s.lora_dropout and adapter_input_copy(s) and "down_proj" in adapted_names(m, s):
        b.gpu("the fp32 gradient of down_proj's dropped adapter input", "temporaries", 4 * T * m.intermediate,
              BWD_END | (BWD_HEAD if last_layer else frozenset()),
              "peft 0.21 tuners/lora/layer.py Linear.forward: fp32 adapters read lora_A(dropout(x.to(fp32))); the "
              "backward of the cast back (autocast's, or the matmul's) hands the dropout an fp32 gradient, and the "
              "dropout's backward makes another beside it (seen in dry runs with lora_dropout > 0: 4.5 bytes per "
              "element of down_proj's input beyond the MLP's working set without dropout)")
    if cp > 1:
        b.gpu("keys and values of the whole sequence, gathered for ring attention", "temporaries",
              a * s.batch * s.seq * cp * (m.k_width + m.v_width), BWD_END,
              f"context parallelism (torch's ALL_GATHER rotation): one layer's attention sees all {cp} ranks' keys "
              f"and values; estimated, not measured (no dry run of context parallelism)")
    if s.checkpointing == "selective":
        if m.moe_layers:
            raise InputError(f"selective checkpointing is modelled for dense decoder layers; {m.name} has "
                             f"{m.moe_layers} mixture-of-experts layers (use checkpointing 'full' or 'none')")
        kept = selective_bytes(m, s)
        b.gpu("layer inputs and the outputs selective checkpointing saves", "activations",
              m.layers * (stream + kept) + final_norm, FORWARDS | BWD_START | BWD_HEAD,
              f"torchtitan's op-level policy: {kept / T:,.0f} bytes per token per layer besides its input "
              f"(every other matmul's output, the attention kernel's output and logsumexp)")
        b.gpu("one layer recomputed in backward", "activations", max(per_dense, per_moe),
              BWD_END, "the ops the policy did not save are re-run before the layer's backward")
    elif s.checkpointing == "full" and s.checkpoint_every > 1:
        every, moe = s.checkpoint_every, moe_layer_indices(m)
        ckpt = [i for i in range(m.layers) if (i + 1) % every == 0]
        whole = sum(per_moe if i in moe else per_dense for i in range(m.layers) if (i + 1) % every)
        b.gpu(f"inputs of the {len(ckpt)} checkpointed layers (every {every}th)", "activations", len(ckpt) * stream,
              FORWARDS | BWD_START | BWD_HEAD, "one residual-stream tensor per checkpointed layer (torchtitan's "
              f"layer-level selective checkpointing: layers {every - 1}, {2 * every - 1}, ... counted from 0)")
        b.gpu(f"saved activations of the {m.layers - len(ckpt)} layers not checkpointed", "activations",
              whole + final_norm, FORWARDS | BWD_START | BWD_HEAD,
              f"{per_dense / T:,.0f} bytes per token per dense layer" + (f", {per_moe / T:,.0f} per MoE layer" if per_moe else ""))
        if m.layers % every == 0:
            last = per_moe if m.layers - 1 in moe else per_dense
            b.gpu("the last layer recomputed while every other layer's activations are kept", "activations",
                  last - stream, BWD_HEAD, "the last layer is checkpointed: its forward is re-run at the start of "
                  "backward, beside what the layers not checkpointed saved (its input is counted above); counted at the head's "
                  "backward, whose own buffers are in fact freed by then (up to 2.5% over the dry run on the grid)")
        b.gpu("activations of the first layer (not checkpointed), not yet freed", "activations",
              max(per_dense, per_moe), BWD_END, "backward frees each layer's saved tensors as it passes")
    elif s.checkpointing == "full":
        if last_layer:
            b.gpu("layer inputs kept by checkpointing", "activations", m.layers * stream,
                  FORWARDS | BWD_START | BWD_HEAD, "one residual-stream tensor per layer (torch.utils.checkpoint)")
            b.gpu("the final norm's saved tensors", "activations", final_norm, FORWARDS | BWD_START,
                  "freed by the final norm's backward, before the last layer's")
        else:
            b.gpu("layer inputs kept by checkpointing", "activations", m.layers * stream + final_norm,
                  FORWARDS | BWD_START | BWD_HEAD, "one residual-stream tensor per layer (torch.utils.checkpoint)")
        b.gpu("one layer recomputed in backward", "activations", max(per_dense, per_moe),
              BWD_END, "checkpointing re-runs a layer's forward before its backward" + _expanded_note(m, s))
        if not m.moe_layers and "parameters" not in s.strat.shards:     # (sharded: GATHER is the head's gather)
            what, nbytes = mlp_forward_working_set(m, s)
            b.gpu(f"the last layer's forward under checkpoint: {what}", "activations", nbytes, GATHER,
                  "a checkpointed layer's forward saves nothing, but its MLP's outputs are alive together until down_proj "
                  "reads their product (transformers LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)); peft 0.21 "
                  "tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling, cast back)")
        if last_layer:
            b.gpu("the last layer recomputed while every layer's input is kept", "activations",
                  max(per_dense, per_moe) - stream, BWD_HEAD, "the last layer's backward comes first: its forward is "
                  "re-run beside every checkpointed input (its own counted above)")
    else:
        if first_iteration_casts(s):
            first_dense = layer_bytes(m, s, moe=False, first=True) - layer_bytes(m, s, moe=False)
            first_moe = layer_bytes(m, s, moe=True, first=True) - layer_bytes(m, s, moe=True) if m.moe_layers else 0
            b.gpu("first iteration: each adapted linear's own bf16 copy of its input", "activations",
                  dense_layers * first_dense + m.moe_layers * first_moe,
                  FIRST_FORWARDS | {"backward_start", "backward_head"},
                  "until each adapter unit is first gathered, peft reads its weight as fp32 and casts the input to "
                  "fp32, autocast casts it back and the adapter keeps that copy (first_iteration_casts)")
            b.gpu("first iteration: the first layer's own input copies, not yet freed", "activations",
                  max(first_dense, first_moe), {"backward_end"}, "backward frees each layer's saved tensors as it passes")
        b.gpu("saved activations", "activations", full + final_norm, FORWARDS | BWD_START | BWD_HEAD,
              f"{per_dense / T:,.0f} bytes per token per dense layer" + (f", {per_moe / T:,.0f} per MoE layer" if per_moe else "")
              + _expanded_note(m, s))
        b.gpu("activations of the first layers, not yet freed", "activations", max(per_dense, per_moe), BWD_END,
              "backward frees each layer's saved tensors as it passes")
        if no_full_logits(s) or s.dpo_logps == "openrlhf":    # (OpenRLHF's actor: its loss's backward buffers
            what, nbytes = first_backward_working_set(m, s, width)  # freed, its held logits alive at the head's)
            b.gpu(f"the backward's first working set beside every saved activation: {what}", "temporaries", nbytes,
                  BWD_HEAD, "with no full logits the loss's backward is small, and the backward's peak comes in the "
                  "final norm's or the last layer's backward, before any layer's saved tensors are freed (with full "
                  "logits, the items at the head's backward that these free are larger)")
        if no_full_logits(s) and not m.moe_layers and "parameters" not in s.strat.shards:
            what, nbytes = mlp_forward_transient(m, s)
            b.gpu(f"the last layer's forward beside every saved activation: {what}", "activations", nbytes, GATHER,
                  "with no full logits after it the last MLP's forward is the forward's peak: its outputs not saved "
                  "for backward are alive beside everything saved (mlp_forward_working_set less what the layer saves)")
    follow, fixed = m.rope
    if follow or fixed:
        c = 2 if compute_mode(s) == "low" else 4
        b.gpu("rotary cos and sin, made once and saved by every layer's attention", "activations",
              s.seq * (follow * c + fixed), FORWARDS | BWD_START | BWD_HEAD | BWD_END,
              f"transformers' {m.model_type} rotary_emb (models.rope_tables): {follow} values per token in the hidden "
              f"states' dtype" + (f" and {fixed} bytes of its own" if fixed else "") + ", position_ids of batch 1")
    if not s.lora_rank:
        b.gpu("the gradient reaching the embedding's output", "temporaries", stream,
              BWD_DONE, "batch x seq x hidden (the residual stream's dtype): the first layer's input gradient, summed "
              "from its two branches, alive while the embedding's backward makes the weight's gradient (seen in dry "
              "runs on torch 2.13: an add's output beside embedding_dense_backward's)")
    if s.quantized and versions.older(s, "bnb_4bit_input_kept"):
        per_layer, first_less = kept_4bit_inputs(m, s)
        if s.checkpointing == "full" and versions.older(s, "checkpointing_reentrant"):
            per_layer = 0       # reentrant: a checkpointed layer's forward runs without autograd, MatMul4Bit keeps
            #                     nothing, and what its recomputation keeps goes with that layer's backward
        if s.checkpointing == "full" and s.checkpoint_every > 1:
            ckpt = m.layers // s.checkpoint_every
            plain, _ = kept_4bit_inputs(m, s.replace(checkpointing="none", checkpoint_every=1))
            per_layer_all = ckpt * per_layer + (m.layers - ckpt) * plain   # (the first layer's input needs a gradient)
        else:
            per_layer_all = m.layers * per_layer
        b.gpu("4-bit linears' inputs kept by bitsandbytes' MatMul4Bit (before 0.43.2)", "activations",
              (per_layer_all - first_less) * T, FORWARDS | BWD_START | BWD_HEAD | BWD_END,
              f"bitsandbytes {versions.of(s, 'bitsandbytes')[0]} keeps each 4-bit linear's input as ctx.tensors until "
              f"the graph is freed after backward (fixed in 0.43.2, commit 9e75374): {per_layer:,} "
              f"bytes per token per layer beyond what the layer saves anyway")
        if s.outputs_held:      # after backward every 4-bit linear's input is held by its ctx alone, shared or not
            every = all_4bit_inputs(m, s) if per_layer else 0
            b.gpu("4-bit linears' inputs of the graph the loop holds", "activations", (m.layers * every - first_less) * T,
                  held_moments(s) - BWD_START - BWD_HEAD - BWD_END,
                  "the held logits keep their graph's nodes, and MatMul4Bit's ctx.tensors with them, through the "
                  "step and the next forward (outputs_held)")
    if s.quantized:
        c = 4 if s.precision == "fp32" else 2
        b.gpu(f"a 4-bit weight dequantised for its matmul ({'fp32' if c == 4 else s.half}) with its fp32 absmax",
              "temporaries", quantized.dequantized_bytes(m, c), BWD_END,
              "bitsandbytes dequantises one Linear4bit's weight at a time, in forward and again in backward")
    if s.base_fp32:
        add_base_weight_copies(b, m)
    if s.lora_rank:
        adapted = sum(t.linear for t in adapters.targets(m, s))     # (ParamWrapper's merge keeps no x @ A)
        targets = adapted if s.checkpointing == "none" else adapted // m.layers
        r_bytes = 4 if adapter_input_copy(s) == 4 else a           # fp32 adapters without autocast compute in fp32
        b.gpu("LoRA intermediates (x @ A, saved by B)", "activations", targets * T * s.lora_rank * r_bytes,
              FORWARDS | BWD_START | BWD_HEAD, f"{s.lora_rank} features per token per adapted linear layer")
        if adapters.experts_adapted(m, s):
            add_merged_experts(b, m, s, T, a)


def add_merged_experts(b: Builder, m: ModelSpec, s, T: int, a: int) -> None:
    """LoRA on an MoE's 3-D experts (peft's ParamWrapper, `helpers.estimate.adapters`): each MoE layer's forward
    merges every expert weight with its adapters' product, and grouped_mm keeps the merged weights and its inputs
    (the weights now need a gradient) for backward; a layer's backward makes each merged weight's gradient in full."""
    wb = 4 if s.precision == "fp32" else 2
    merged, extra, adapted = adapters.merged_expert_bytes(m, s, wb)
    widths = m.hidden * ("gate_up_proj" in adapted) + m.expert_width * ("down_proj" in adapted)
    inputs = a * T * m.experts_active * widths           # each adapted weight's input, kept for its gradient
    moe = moe_layer_indices(m)
    if s.checkpointing == "none":
        kept = len(moe)
    else:
        kept = sum(1 for i in moe if (i + 1) % s.checkpoint_every)          # the layers not checkpointed
    src = ("peft ParamWrapper (tuners/lora/layer.py): the weight plus B @ A per expert, as large as the weight; "
           f"{merged / 2**30:.2f} GiB per MoE layer")
    if kept:
        last = 1 if s.strat.engine == "fsdp2" else 0     # FSDP2's peak gather is a block's, before it merges its own
        if kept > last:
            b.gpu(f"merged expert weights (W + B @ A) and the experts' inputs, kept by {kept - last} MoE layers",
                  "activations", (kept - last) * (merged + inputs), FORWARDS | BWD_START | BWD_HEAD, src)
        if last:
            b.gpu("the last MoE layer's merged expert weights and inputs, made after its block's all-gather",
                  "activations", merged + inputs, LOSS | BWD_START | BWD_HEAD, src)
    if kept < len(moe):
        fsdp2 = s.strat.engine == "fsdp2"
        b.gpu("one checkpointed MoE layer's merged expert weights, made in its forward", "activations", merged,
              START if fsdp2 else GATHER,
              src + "; a checkpointed layer frees them when its forward ends: the last one's beside every layer's "
              "kept input and the forward's autocast cache (under FSDP2 beside two gathered blocks, less than the "
              "all-gather's own peak of three)")
    b.gpu("an MoE layer's merged expert weights in its backward (kept, or recomputed) and its inputs", "activations",
          merged + inputs, BWD_END, src)
    b.gpu("the gradient of a merged expert weight, and the routed gradients in flight", "temporaries", extra + inputs,
          BWD_HEAD | BWD_END, "grouped_mm's weight gradient, in full, before the adapters' own: the down projection's "
          "first (both merged weights kept), gate_up's after down's merged weight is freed; beside it the gradients "
          "of the routed tokens' output and input")


def no_full_logits(s) -> bool:
    """The loss never makes the full logits: a fused cross-entropy, TRL's chunked/tiled loss, or a reward model's score
    head (no vocabulary)."""
    return bool(s.fused_ce) or s.run == "rm" or sft_loss.mechanism(s) != sft_loss.FULL


def last_layer_peak(s) -> bool:
    """With no full logits (or OpenRLHF's actor, whose loss's backward buffers are freed by then) and every layer
    checkpointed, the last layer's recomputation (every layer's input kept) is the backward's peak: its items are
    counted at BWD_HEAD too."""
    return ((no_full_logits(s) or s.dpo_logps == "openrlhf") and s.checkpointing == "full"
            and s.checkpoint_every == 1)


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's fused linear cross-entropy chunk: next_power_of_2(ceil(tokens / ceil(vocab / hidden)))."""
    return min(tokens, next_power_of_2(math.ceil(tokens / math.ceil(vocab / hidden))))


def held_moments(s) -> frozenset:
    """Where a micro batch's output held by the loop (`outputs_held`) is alive beyond its own forward: its backward,
    the optimizer step, and the next forward (the first iteration's forward only from its second micro batch on)."""
    moments = BWD_START | BWD_HEAD | BWD_END | BWD_DONE | STEP_NORM | STEP_PREPARE | STEP | STEADY_FORWARDS
    return moments | (FIRST_FORWARDS if s.grad_accum > 1 else frozenset())


def add_softcap(b: Builder, m: ModelSpec, nbytes: int) -> None:
    """A soft-capped model's tanh output (`nbytes`, the logits' size in their dtype), kept for its backward."""
    if m.logit_softcap:
        b.gpu("soft-capped logits (tanh output, saved)", "logits", nbytes, LOSS | BWD_START,
              "final_logit_softcapping: logits = cap * tanh(logits / cap); tanh keeps its output until its backward")


def add_logits(b: Builder, m: ModelSpec) -> None:
    """Logits and cross-entropy: full logits with the fp32 upcast, or a fused/chunked linear cross-entropy."""
    s = parallel.rank_setup(b.setup)      # with loss parallel, `m.vocab` is one TP rank's share of the vocabulary
    T = s.batch * s.seq
    c = 4 if s.precision == "fp32" else 2
    E = T * m.vocab
    how = sft_loss.mechanism(s)
    if how != sft_loss.FULL:
        return _add_trl_loss(b, m, how)
    if s.fused_ce:
        chunk = liger_chunk_tokens(T, m.hidden, m.vocab)
        b.gpu("logits of one chunk (fp32 softmax in place)", "logits", chunk * m.vocab * 4, LOSS,
              f"fused linear cross-entropy: {chunk} tokens at a time (Liger's chunk rule)")
        head_grad = 0 if s.lora_rank else m.vocab * m.hidden * c          # a frozen head needs no weight gradient
        b.gpu("the hidden states' gradient made during forward", "logits", T * m.hidden * c, LOSS | BWD_START,
              "Liger computes d(hidden) in the forward pass; the final norm's backward reads it")
        if head_grad:
            b.gpu("the head weight's gradient made during forward", "logits", head_grad,
                  LOSS | BWD_START | (frozenset() if s.strat.deepspeed else BWD_HEAD),
                  "Liger computes d(lm_head) in the forward pass; the loss's backward hands it to the weight (under "
                  "DeepSpeed its reduce hook takes it into a bucket then)")
        return
    upcast = 4 * E if c == 2 else 0
    if s.run == "sft" and compute_mode(s) == "autocast":
        b.gpu("the final norm's fp32 output, alive while the loss runs", "activations", 4 * T * m.hidden, LOSS,
              "an fp32 model under autocast: the decoder returns the final norm's fp32 output as its last hidden "
              "state, which the causal LM's forward holds through the head and the loss (the head saves its bf16 "
              "cast, counted with the norm)")
    if s.outputs_held:
        returned = 4 if c == 2 and versions.older(s, "logits_upcast_in_forward") else c
        b.gpu("logits the loop holds until the next forward returns", "logits", returned * E, held_moments(s),
              "the loop's variable keeps the output after the loss (LitGPT fit(): `logits = model(input_ids, ...)`, "
              "rebound when the next forward returns): this micro batch's logits through its backward and the "
              "optimizer step, the previous micro batch's through the next forward")
    if not (c == 2 and versions.older(s, "logits_upcast_in_forward")):   # (before 4.46 the bf16 logits are freed
        b.gpu("logits", "logits", c * E, LOSS, f"batch x seq x vocab = {E:,} elements; dropped with the output")
    # at once: the model's forward upcasts them and returns the fp32 ones, counted below)
    shifting = versions.older(s, "causal_lm_loss_copies_logits")   # the loss over batch x (seq - 1) rows
    L = s.batch * (s.seq - 1) * m.vocab if shifting else E
    if shifting and s.batch > 1:
        b.gpu("fp32 logits shifted by one token (a contiguous copy)", "logits", 4 * L, LOSS,
              f"transformers {versions.of(s, 'transformers')[0]}: logits[..., :-1, :].contiguous() before the "
              f"cross-entropy (the labels are shifted instead from 4.49.0); with batch 1 the slice is contiguous "
              f"already and no copy is made")
    add_softcap(b, m, c * E)
    b.gpu("fp32 upcast + log_softmax output", "logits", upcast + 4 * L, LOSS,
          "ForCausalLMLoss: logits.float(); cross_entropy saves log_softmax's output")
    b.gpu("log_softmax output + its gradient + the logits' fp32 gradient", "logits", 12 * L, BWD_START,
          "nll_loss backward makes a dense fp32 gradient; log_softmax backward another")


def _trl_chunk_peaks(s, m: ModelSpec, c: int, autocast: bool, tokens: int) -> tuple[tuple[str, int], tuple[str, int]]:
    """TRL 1.4-1.14's chunked_nll, one chunk of `tokens`: (what, bytes) at its forward's peak and at its backward's
    (the chunk recomputed under checkpoint, then its backward), beside the packed hidden states. `c`: bytes of the
    hidden states and of the head's weight (fp32 under autocast with fp32 weights, else the 16-bit dtype)."""
    C, V, H = tokens, m.vocab, m.hidden
    upcast = sft_loss.projects_in_fp32(s)
    if upcast:      # h.float() @ w.float().t(): fp32 copies of 16-bit inputs; autocast casts both back to bf16
        copies = (4 * C * H + 4 * V * H if c == 2 else 0) + (2 * C * H + 2 * V * H if autocast else 0)
        mm = 2 * C * V if autocast else 4 * C * V
        saved_w = 2 * V * H if autocast else (4 * V * H if c == 2 else 0)
        kept = mm if autocast else 4 * C * V      # the logits log_softmax reads (under autocast: its fp32 cast)
        what = "the head's weight upcast to fp32 (w.float())" + (" and cast back by autocast" if autocast else "")
    else:           # (h @ w.to(h.dtype).t()).float(): autocast casts fp32 inputs to bf16
        copies = 2 * C * H + 2 * V * H if autocast and c == 4 else 0
        mm = 2 * C * V if autocast or c == 2 else 4 * C * V
        saved_w = 2 * V * H if autocast and c == 4 else 0
        kept = 4 * C * V
        what = "the head's weight cast to bf16 by autocast" if copies else "the chunk's logits"
    projection = copies + mm + (4 * C * V if mm < 4 * C * V and not upcast else 0)
    softmax = kept + 12 * C * V               # log_softmax's output, exp(log_p), exp(log_p) * log_p
    fwd = (f"one chunk's projection: {what}, and {C} tokens' logits", projection) if projection > softmax else \
        (f"one chunk's logits, log_softmax, exp and entropy product ({C} tokens, fp32)", softmax)
    back = saved_w + 12 * C * V
    bwd = (f"one chunk recomputed: {what}, and {C} tokens' logits", projection) if projection > back else \
        (f"one chunk's backward: the weight copy its matmul saved and three fp32 {C}-token logits-sized tensors "
         f"(log_softmax's output, exp's, their gradient)", back)
    return fwd, bwd


def _add_trl_loss(b: Builder, m: ModelSpec, how: str) -> None:
    """TRL's SFT loss, computed from the hidden states and the head's weight (helpers.measure.trl_loss re-enacts
    both): 'chunked' (TRL 1.4-1.14 chunked_nll) or 'tiled' (TRL 1.15+'s fused LM head). The full logits never
    exist; what the loss holds is its packed copy of the hidden states and one chunk's or tile's working set."""
    s = b.setup
    N, V, H = s.batch * (s.seq - 1), m.vocab, m.hidden
    mode = compute_mode(s)
    c = 4 if mode in ("autocast", "fp32") else 2            # the hidden states' and the head weight's bytes
    autocast = s.mixed and s.strat.autocast
    trained = not s.lora_rank
    src = ("trl 1.4.0-1.14.x trainer/sft_trainer.py _chunked_cross_entropy_loss, _chunk" if how == sft_loss.CHUNKED
           else "trl 1.16.0 trainer/utils.py add_fused_lm_head, kernels/chunked_logprob.py ChunkedLogProbFunction")
    packed = "hidden[order]" if how == sft_loss.CHUNKED else "hidden_states[mask]"
    b.gpu(f"the shifted hidden states packed for the loss ({packed}, a copy)", "logits", N * H * c, LOSS | BWD_START,
          f"{src}: every position with a label, {N:,} x hidden; the loss's backward reads it")
    if how == sft_loss.CHUNKED:
        last = N - (math.ceil(N / sft_loss.CHUNK_TOKENS) - 1) * sft_loss.CHUNK_TOKENS
        fwd, bwd = _trl_chunk_peaks(s, m, c, autocast, min(N, sft_loss.CHUNK_TOKENS))
        if s.batch > 1 and N * H * c > fwd[1]:
            fwd = ("the shifted hidden states' reshape (a copy, before they are packed)", N * H * c)
        b.gpu(fwd[0], "logits", fwd[1], LOSS, src + ": 256 tokens at a time under non-reentrant checkpoint; "
              "nothing of a chunk is kept after its forward")
        if N > sft_loss.CHUNK_TOKENS:    # the backward runs the last chunk (of `last` tokens) first
            bwd = max(bwd, _trl_chunk_peaks(s, m, c, autocast, last)[1], key=lambda x: x[1])
        b.gpu(bwd[0], "logits", bwd[1], BWD_START, src + ": each chunk's forward recomputed in the loss's backward")
        if trained:
            grad_mm = (2 if autocast else 4 if sft_loss.projects_in_fp32(s) else c) * V * H
            b.gpu("the head weight's gradient of one chunk, as its matmul makes it, and its conversion", "logits",
                  grad_mm + (c * V * H if grad_mm != c * V * H else 0), BWD_START,
                  src + ": the gradient of the weight copy, converted to the weight's dtype and added to its .grad")
    else:
        n = min(N, sft_loss.TILE_TOKENS)
        compute = 2 if autocast or c == 2 else 4
        casts_h = n * H * compute if compute != c else 0
        w_slice = min(V, sft_loss.TILE_VOCAB) * H * compute if compute != c else 0
        stats = sft_loss.TILE_STATS * N * 4
        b.gpu(f"the projection's tile buffer ({n} tokens x {sft_loss.TILE_VOCAB} vocabulary entries) and per-token "
              f"statistics" + (", a tile's hidden states and weight slice cast to bf16" if casts_h else ""), "logits",
              n * sft_loss.TILE_VOCAB * compute + stats + casts_h + w_slice, LOSS,
              src + ": mm_buf, the online-logsumexp statistics; Triton folds each tile in registers")
        second = min(max(V - sft_loss.TILE_VOCAB, 0), sft_loss.TILE_VOCAB) * H * compute if compute != c else 0
        grads = N * H * 4 + (4 * V * H if trained else 0)
        b.gpu("the backward's fp32 gradient accumulators (hidden states" + (", head weight" if trained else "")
              + "), its tile buffer" + (" and weight slices cast to bf16" if w_slice else ""), "logits",
              grads + n * sft_loss.TILE_VOCAB * compute + casts_h + w_slice + second, BWD_START,
              src + ": grad_hidden and grad_weight zeros in fp32, each tile re-projected into a new mm_buf; the next "
              "weight slice is cast while the previous is still held")
        if c == 2:
            b.gpu("the gradients cast back to bf16 (hidden states" + (", head weight" if trained else "") + ")",
                  "logits", N * H * 2 + (2 * V * H if trained else 0), BWD_START,
                  src + ": grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), beside the fp32 ones")
