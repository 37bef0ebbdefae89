"""Pieces shared by the dry runs and the scaled runs: FSDP2's grouping, and what the tracker needs to know about
the output head and about FSDP2's communication buffers."""

from __future__ import annotations

import contextlib

import torch

from helpers.measure.tracker import Tracker
from helpers.training import TrainSetup

SCALED_RUNS = ("rm", "dpo", "kto")
"""Runs other than SFT that a scaled run trains through the real engines (their losses: `reward_loss`,
`helpers.measure.preference_loss.loss`)."""


def refuse_unsupported(setup: TrainSetup, mode: str) -> None:
    """Options the estimate models but this mode does not run: say so rather than measure something else."""
    from helpers import strategies
    from helpers.errors import InputError

    allowed = strategies.names(lambda s: mode in s.fused_ce_modes)
    if setup.fused_ce and setup.strategy not in allowed:
        raise InputError(f"fused_ce in a {mode} run needs the output head's whole weight (strategies {', '.join(allowed)}); "
                         f"got strategy {setup.strategy!r}, whose engine shards or wraps it: use `estimate`, or measure "
                         f"the loss's memory with strategy 'single' (it does not depend on the sharding)")
    from helpers.estimate import sft_loss

    if mode != "dry" and sft_loss.mechanism(setup) != sft_loss.FULL:
        raise InputError(f"trl_loss_type {setup.trl_loss_type!r} at this TRL release ({sft_loss.mechanism(setup)} "
                         f"loss) has no {mode} run here (the training loop computes the model's own loss): a dry run "
                         f"re-enacts TRL's loss, or measure with trl_loss_type unset")
    scaled_ok = SCALED_RUNS + (("grpo",) if setup.dpo_logps == "openrlhf" else ())   # (OpenRLHF's actor)
    what = {"rm": "a reward model's", "grpo": "OpenRLHF's actor"}.get(setup.run, f"a {setup.run.upper()}")
    if setup.run in scaled_ok and mode == "scaled" and setup.strat.one_process_per_gpu:
        raise InputError(f"{what} scaled run trains in this process (single, ddp, DeepSpeed), not under torchrun: got "
                         f"strategy {setup.strategy!r}; `estimate` models it under every engine")
    if setup.run in scaled_ok and mode == "gpu" and setup.strategy != "single":
        raise InputError(f"{what} gpu run trains one GPU in one process (strategy 'single'), got strategy "
                         f"{setup.strategy!r}: run it with --strategy single --gpus 1 to measure the logits and "
                         f"activations per GPU (they do not depend on the sharding; the model states do, and are then "
                         f"the whole model's), and `python -m helpers estimate` with your strategy for the run itself")
    if setup.run not in (("sft",) + (scaled_ok if mode in ("scaled", "gpu") else ())) and mode != "dry":
        whose = ("OpenRLHF's actor step" if setup.dpo_logps == "openrlhf" else
                 f"TRL's (and LLaMA-Factory's) {setup.run.upper()} step with its reference model")
        raise InputError(f"run {setup.run!r} has no {mode} run here (the training loop trains SFT, a reward model, "
                         f"DPO, KTO and OpenRLHF's actor (--dpo-logps openrlhf)): a dry run re-enacts {whose} "
                         f"(single, ddp, zero1, zero2), and `estimate` places it under every engine")
    if setup.resume:
        raise InputError(f"resume is modelled by the estimate (the loaded checkpoint beside the live buffers) but a "
                         f"{mode} run does not load a checkpoint; measure without --resume: the resume transient is "
                         f"measured by helpers.measure.resume (DeepSpeed ZeRO with optimizer offload, notebook 03)")


def reward_loss(model, ids, setup: TrainSetup):
    """A reward model's loss on `ids` (its chosen sequences, then its rejected ones) as TRL 1.10's RewardTrainer takes
    it (`compute_loss`; LLaMA-Factory's the same on the value head's last value): the pooled score per sequence, in
    fp32, split in two, -logsigmoid(chosen - rejected)."""
    if setup.rm_head == "value-head":
        rewards = value_head_rewards(model, ids).float().squeeze(-1)
    else:
        rewards = model(input_ids=ids).logits.float().squeeze(-1)
    chosen, rejected = rewards.chunk(2)
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


def chunked_ce_options():
    """torch's chunked linear cross-entropy with Liger's chunk rule: next_pow2(ceil(N / ceil(vocab / hidden)))."""
    return torch.nn.LinearCrossEntropyOptions(chunking_method="aspect_ratio")


def setup_loss(model, ids, setup: TrainSetup, tracker=None):
    """`causal_lm_loss` the way the set-up computes it (fused_ce; TRL's SFT loss by its release)."""
    from helpers.estimate import sft_loss

    how = sft_loss.mechanism(setup)
    return causal_lm_loss(model, ids, setup.fused_ce, tracker, how, how == sft_loss.CHUNKED and sft_loss.projects_in_fp32(setup))


def causal_lm_loss(model, ids, fused: bool, tracker=None, trl: str = "full", upcast: bool = False):
    """The next-token loss of a causal LM on `ids`: Hugging Face's own (full logits, upcast to fp32), or with
    `fused` torch's chunked `linear_cross_entropy` on the decoder's hidden states (the full logits never exist;
    gradients of the hidden states and the head's weight are made in forward, as Liger's kernel does), or TRL's SFT
    loss `trl` ('chunked', 'tiled': helpers.measure.trl_loss; `upcast`: a chunk projects in fp32)."""
    if trl != "full":
        from helpers.measure import trl_loss

        return trl_loss.loss(model, ids, trl, upcast, tracker)
    if not fused:
        return model(input_ids=ids, labels=ids).loss
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    head = model.get_output_embeddings()
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    if tracker is not None:
        tracker.set_context("logits")
        h.register_hook(lambda grad: tracker.set_context(None))      # the loss's backward ends here
    try:
        return torch.nn.functional.linear_cross_entropy(h, head.weight, ids[:, 1:].reshape(-1),
                                                        options=chunked_ce_options())
    finally:
        if tracker is not None:
            tracker.set_context(None)


def build_model(config_path: str, setup: TrainSetup, dtype: torch.dtype, attention: str):
    """A Hugging Face causal LM from its config (random weights), in train mode, with checkpointing if asked; for run
    'rm' the reward model TRL's RewardTrainer builds: AutoModelForSequenceClassification with num_labels 1 (the
    decoder and a score head of one output, no LM head), its padding token set as the trainer sets it from the
    tokenizer (transformers refuses a batch above 1 without one)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from helpers import models

    hf_logging.set_verbosity_error()
    if setup.lora_rank and setup.precision != "fp32" and not setup.base_fp32:
        dtype = HALF[setup.half]                 # LoRA: the frozen base is loaded in the compute dtype
    elif setup.base_fp32:
        dtype = torch.float32                    # base_weights 'fp32': loaded in float32, computed under autocast
    config = models.load_config(config_path)
    model_class = AutoModelForCausalLM
    if setup.run == "rm" and setup.rm_head == "score":
        model_class, config.num_labels = AutoModelForSequenceClassification, 1
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0
    net = model_class.from_config(config, dtype=dtype, attn_implementation=_attention_for(config, attention))
    net.config.use_cache = False
    from helpers import versions
    from helpers.measure import checkpointing

    checkpointing.enable(net, setup.checkpointing, setup.checkpoint_every,
                         reentrant=versions.older(setup, "checkpointing_reentrant"))
    from helpers.measure import causal_lm_loss

    causal_lm_loss.as_released(net, setup)
    if setup.quantized:
        from helpers.measure import nf4

        nf4.quantize(net, double=setup.double_quant)
    if setup.lora_rank:
        net = add_lora(net, setup)
    if setup.run == "rm" and setup.rm_head == "value-head":
        add_value_head(net, setup)
    return net.train()


def add_value_head(net, setup: TrainSetup) -> None:
    """trl 0.24's ValueHead on the causal LM (models/modeling_value_head.py: dropout 0.1, a linear of hidden x 1 with
    its bias, made in fp32; DeepSpeed's bf16 engine casts it with the module), trained, as `net.v_head`."""
    from helpers.estimate import reward

    hidden = net.get_input_embeddings().weight.shape[1]
    device = next(net.parameters()).device
    dtype = next(net.parameters()).dtype if setup.strat.deepspeed else torch.float32
    head = torch.nn.Module()
    head.dropout = torch.nn.Dropout(reward.VALUE_HEAD_DROPOUT)
    head.summary = torch.nn.Linear(hidden, 1, device="meta")
    head.summary.weight = torch.nn.Parameter(torch.empty((1, hidden), dtype=dtype, device=device))
    head.summary.bias = torch.nn.Parameter(torch.empty((1,), dtype=dtype, device=device))
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(head.summary.weight, FakeTensor):     # trl's "normal" init (v_head_initializer_range 0.2)
        with torch.no_grad():
            head.summary.weight.normal_(0.0, 0.2)
            head.summary.bias.zero_()
    net.v_head = head


def value_head_rewards(model, ids):
    """trl 0.24's AutoModelForCausalLMWithValueHead.forward as LLaMA-Factory's stage rm calls it
    (`model(**inputs, output_hidden_states=True)`), re-enacted: the causal LM's forward with every hidden state, the
    value head on the last one, the LM head's logits upcast to fp32 and returned unused; the value of each
    sequence's last token."""
    out = model(input_ids=ids, output_hidden_states=True)
    values = _value_head(model.v_head, out.hidden_states[-1]).squeeze(-1)
    logits = out.logits.float() if out.logits.dtype != torch.float32 else out.logits
    del out, logits
    return values[:, -1:]


def _value_head(head, hidden):
    """ValueHead.forward (trl 0.24): dropout, a cast to the head's dtype where it differs, the summary linear; its
    locals go when it returns."""
    x = head.dropout(hidden)
    if x.dtype != head.summary.weight.dtype:
        x = x.to(head.summary.weight.dtype)
    return head.summary(x)


SDPA_UNCHECKED = "uncapped_scaled_dot_product"   # (a name with "sdpa" in it would be checked as sdpa)


def _attention_for(config, attention: str) -> str:
    """`attention`, except "sdpa" for a model class that refuses it because SDPA cannot soft-cap attention scores
    (Gemma 2: `_supports_sdpa = False`): transformers' own SDPA function under another name, which leaves the
    soft-capping out. Its memory is that of flash-attention 2 (which soft-caps, and is what Gemma 2 trains with on a
    GPU): output and logsumexp saved, no seq x seq scores; the loss values differ slightly from the capped model's."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention != "sdpa":
        return attention
    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    if getattr(model_class, "_supports_sdpa", True):
        return attention
    def uncapped(module, query, key, value, attention_mask, softcap=None, **kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(SDPA_UNCHECKED, uncapped)
    return SDPA_UNCHECKED


@contextlib.contextmanager
def torch_globals_restored():
    """Put back what an engine patches in torch for good: DeepSpeed ZeRO-3 replaces torch.nn.functional.linear with its
    memory-efficient wrapper and says it "will persist unless manually reset" (partition_parameters.py). Left in
    place, every later step in the process — a dry run in the same notebook — saves different tensors for backward."""
    import torch.nn.functional as F

    saved = {"linear": F.linear, "manual_seed": torch.manual_seed, "apply": torch.nn.Module.apply,
             "smart_apply": getattr(torch.nn.Module, "smart_apply", None)}
    try:
        yield
    finally:
        F.linear, torch.manual_seed, torch.nn.Module.apply = saved["linear"], saved["manual_seed"], saved["apply"]
        if saved["smart_apply"] is not None:
            torch.nn.Module.smart_apply = saved["smart_apply"]


def fp32_adapters(setup: TrainSetup) -> bool:
    """LoRA adapters are kept in fp32 beside a bf16 base where `TrainSetup.adapters_fp32` says: peft's default
    (autocast_adapter_dtype) on single and ddp, with or without autocast; FSDP2's MixedPrecisionPolicy under
    bf16-mixed (param_dtype bf16, reduce_dtype fp32; as accelerate does, which upcasts trainable low-precision
    parameters to fp32 under FSDP mixed precision). FSDP2 requires a uniform original dtype among the trainable
    parameters of a group only (`_fsdp_param_group.py` `_init_mp_dtypes`), so fp32 adapters may share a group with the
    bf16 frozen base. DeepSpeed's bf16 mode casts the whole module, adapters included, to bf16 (its fp32 master
    weights are its own)."""
    return setup.adapters_fp32 and setup.precision != "fp32"


def add_lora(net, setup: TrainSetup):
    """peft LoRA adapters of the set-up's rank on its lora_targets ("all-linear": every linear but the head); adapters
    are fp32 where `fp32_adapters` says (peft's autocast_adapter_dtype), in the base's dtype otherwise."""
    from peft import LoraConfig, get_peft_model
    from torch._subclasses.fake_tensor import FakeTensor

    if setup.checkpointing != "none":
        net.enable_input_require_grads()        # a frozen embedding's output must carry grad into checkpointed layers
    from helpers import models

    if setup.lora_targets == models.LINEAR_NAMES:     # as axolotl's find_all_linear_names builds the list
        names = {n.rsplit(".", 1)[-1] for n, mod in net.named_modules() if isinstance(mod, torch.nn.Linear)
                 or "Linear" in type(mod).__name__} - {"lm_head"}
    else:
        names = models.lora_modules(setup.lora_targets)
    fake = isinstance(next(net.parameters()), FakeTensor)
    score = setup.run == "rm" and setup.rm_head == "score"
    config = LoraConfig(r=setup.lora_rank, lora_alpha=2 * setup.lora_rank, lora_dropout=setup.lora_dropout,
                        target_modules="all-linear" if names is None else sorted(names - {"score"}),
                        task_type="SEQ_CLS" if score and not fake else None,
                        exclude_modules=["score"] if score and fake else None)
    # (SEQ_CLS: "all-linear" leaves the score head out and peft's modules_to_save trains a deep copy of it; fake
    # tensors cannot be deep-copied safely (the copies' storages crash the garbage collector later), so on the fake
    # GPU the score's own weight is trained instead: the same bytes but the frozen original's hidden x 1)
    fp32 = fp32_adapters(setup)
    if not fake:
        return get_peft_model(net, config, autocast_adapter_dtype=fp32)
    original = torch.nn.Module.to
    torch.nn.Module.to = _recreate_to               # fake tensors cannot be swapped in place by Module.to
    try:
        peft_model = get_peft_model(net, config, autocast_adapter_dtype=fp32)
    finally:
        torch.nn.Module.to = original
    if score:
        score_head(peft_model).weight.requires_grad_(True)
    return peft_model


def _recreate_to(module, *args, **kwargs):
    """Module.to for fake tensors: each parameter and buffer re-created on the device, in the dtype asked."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    for mod in module.modules():
        for store in (mod._parameters, mod._buffers):
            for name, t in list(store.items()):
                if t is None:
                    continue
                dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
                new = torch.empty_like(t, device=device or t.device, dtype=dt)
                store[name] = torch.nn.Parameter(new, t.requires_grad) if store is mod._parameters else new
    return module


def param_groups(params, setup: TrainSetup) -> list:
    """The trainable parameters as the optimizer's groups (TrainSetup.optimizer_groups, which the estimate's ZeRO-3
    sub-groups follow: helpers.deepspeed_rules.optimizer_param_groups): under ZeRO-3 with 'decay', the matrices, then
    the 1-D tensors (biases, norm weights) at weight decay 0, as the HF Trainer and OpenRLHF group them; else one list."""
    params = [p for p in params if p.requires_grad]
    if setup.strategy != "zero3" or setup.optimizer_groups == "one":
        return params
    from helpers.deepspeed_rules import decays

    decay, rest = [p for p in params if decays(p.ndim)], [p for p in params if not decays(p.ndim)]
    return [g for g in ({"params": decay}, {"params": rest, "weight_decay": 0.0}) if g["params"]]


def optimizer(params, setup: TrainSetup, lr: float = 1e-3):
    """The set-up's torch-side optimizer over the trainable parameters (or over `param_groups`' groups): AdamW (its
    implementation) or AdamW8bit."""
    params = list(params)
    if not params or not isinstance(params[0], dict):
        params = [p for p in params if p.requires_grad]
    if setup.optimizer == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr)
    return adamw(params, setup.adam, lr=lr)


def optimizer_name(setup: TrainSetup) -> str:
    """What `optimizer` makes, in words."""
    return "bitsandbytes AdamW8bit" if setup.optimizer == "adamw-8bit" else f"torch AdamW ({setup.adam})"


def shard_fsdp2(model, setup: TrainSetup, mesh, pin_memory: bool) -> None:
    """fully_shard as torchtitan groups a decoder: the embedding, each block, norm + output head (a tied head shares
    the embedding's group), then the root; MixedPrecisionPolicy for bf16-mixed, CPUOffloadPolicy with offload.
    A peft model (LoRA, applied before fully_shard as torchtune's and accelerate's FSDP2 recipes do) is grouped the
    same way: each block's group holds its frozen base weights and its adapters."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw = {"mesh": mesh, "reshard_after_forward": setup.reshard_after_forward}
    if setup.mixed:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32
                                               if setup.reduce_dtype == "fp32" else torch.bfloat16)
    if setup.offload_params:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=pin_memory)
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model     # under peft's PeftModel
    inner = hf.base_model
    head = [inner.norm, hf.get_output_embeddings()]
    tied = hf.get_output_embeddings().weight is inner.embed_tokens.weight
    if not tied:
        fully_shard(inner.embed_tokens, **kw)
    for layer in inner.layers:
        fully_shard(layer, **kw)
    fully_shard([inner.embed_tokens, *head] if tied else head, **kw)
    fully_shard(model, **kw)


def score_head(model):
    """A reward model's score head (AutoModelForSequenceClassification's `score`; peft's wrapper around it)."""
    return next(mod for name, mod in model.named_modules() if name.endswith("score") and not name.endswith(".score."))


def watch_logits(model, tracker: Tracker) -> None:
    """Tag the output head's output and the loss as 'logits' in forward, and the loss's backward until the
    gradient of the logits is made."""
    head = model.get_output_embeddings() or score_head(model)

    def pre(module, args):
        tracker.set_context("logits")

    def post(module, args, output):
        if output.requires_grad:
            output.register_hook(lambda grad: tracker.set_context(None))

    head.register_forward_pre_hook(pre)
    head.register_forward_hook(post)
    model.register_forward_hook(lambda module, args, out: tracker.set_context(None))


@contextlib.contextmanager
def fsdp_buffers_counted(tracker: Tracker):
    """Count what FSDP2's all-gathers make (unsharded parameters) as temporaries, its reduce-scatters as
    communication buffers."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    originals = {name: getattr(pg, name) for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce")}

    def wrap(fn, category):
        def wrapped(*args, **kwargs):
            with tracker.made_as(category):
                return fn(*args, **kwargs)
        return wrapped

    for name, fn in originals.items():
        setattr(pg, name, wrap(fn, "comm_buffers" if name == "foreach_reduce" else "temporaries"))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(pg, name, fn)


@contextlib.contextmanager
def untracked_sharding_propagation(tracker: Tracker):
    """DTensor infers output shapes by running ops on scratch fake tensors: keep those out of the count."""
    from torch.distributed.tensor import _sharding_prop as sp

    original = sp.ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, *args, **kwargs):
        with tracker.paused():
            return original(self, *args, **kwargs)

    sp.ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        sp.ShardingPropagator._propagate_tensor_meta_non_cached = original


def adamw(params, impl: str, lr: float = 1e-3) -> torch.optim.AdamW:
    """torch AdamW in one of its implementations: 'foreach', 'fused' or 'for-loop'."""
    kw = {"foreach": dict(foreach=True), "fused": dict(fused=True), "for-loop": dict(foreach=False)}[impl]
    return torch.optim.AdamW(params, lr=lr, **kw)


def optimizer_states(optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors (exp_avg, exp_avg_sq), without the scalar step counters."""
    return [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1]


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def grad_scaler(setup: TrainSetup, device_type: str, fake: bool = False):
    """torch's GradScaler for fp16-mixed (as the HF Trainer and accelerate use it), else None. `fake`: on fake
    tensors its check for inf/nan before the step (a host sync, `.item()` of found_inf) cannot run, so the step
    always runs; the tensors it makes are the same."""
    if setup.precision != "fp16-mixed":
        return None
    scaler = torch.amp.GradScaler(device_type)
    if fake:
        scaler._maybe_opt_step = lambda optimizer, optimizer_state, *args, **kwargs: optimizer.step(*args, **kwargs)
    return scaler


def backward(tracker: Tracker, loss, params, device: str | None = None, scaler=None) -> None:
    """loss.backward() (scaled by `scaler`, fp16-mixed) with the loss's own backward counted as logits, then the
    gradients labelled."""
    tracker.set_context("logits")
    (scaler.scale(loss) if scaler is not None else loss).backward()
    tracker.set_context(None)
    tracker.label([p.grad for p in params if p.grad is not None], "gradients", device)
    if scaler is not None:
        tracker.label([scaler._scale, scaler._growth_tracker], "optimizer_states", device)


def step(tracker: Tracker, optimizer, device: str | None = None, scaler=None) -> None:
    """optimizer.step() (run on `device` when given; through `scaler`, which unscales the gradients in place and
    skips a step with inf/nan, for fp16-mixed), its states labelled, gradients set to None."""
    with tracker.placing(device) if device else contextlib.nullcontext():
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    tracker.label(optimizer_states(optimizer), "optimizer_states", device)
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def kv_expanded(setup):
    """With `setup.kv_expanded`, the model's attention on keys and values repeated to every query head before the
    kernel, as torchtune's and LitGPT's models do: transformers' own SDPA path takes its `repeat_kv` branch
    (`use_gqa_in_sdpa` answers False: integrations/sdpa_attention.py, transformers 5), and the fake GPU's flash
    attention repeats them the same way (`fakegpu.EXPAND_KV`). Undone on exit."""
    if not setup.kv_expanded:
        yield
        return
    import transformers.integrations.sdpa_attention as sdpa

    from helpers.measure import fakegpu

    saved = sdpa.use_gqa_in_sdpa, fakegpu.EXPAND_KV
    sdpa.use_gqa_in_sdpa, fakegpu.EXPAND_KV = (lambda *a, **k: False), True
    try:
        yield
    finally:
        sdpa.use_gqa_in_sdpa, fakegpu.EXPAND_KV = saved
