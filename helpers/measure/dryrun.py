"""Dry runs: the real training step of the full-size model, executed on fake tensors, memory tracked.

The model is built from its config on the fake GPU (see fakegpu), a batch of random token ids goes through
forward, backward and the optimizer step (then a second forward and backward: the 'steady' phase), and the tracker
attributes every tensor's bytes. Nothing is allocated: Llama-3-8B runs in well under 1 GiB of RAM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import platform
import time

import torch

from helpers import deepspeed_rules, estimate, gpus, models, provenance, strategies
from helpers import versions as library_versions
from helpers.degrees import ceil_div
from helpers.errors import InputError
from helpers.estimate import adapters, reference, reward
from helpers.measure import allocator, engines, fakegpu, nf4, preference_loss, reserved, rl_loss, tensor_parallel
from helpers.measure.steps import Hooks, run_steps
from helpers.measure.tracker import Tracker
from helpers.results import DeviceMemory, Result
from helpers.training import LOGPS_RUNS, PREFERENCE_RUNS, TrainSetup, checked
from helpers.units import from_gib

NO_CP_DRY_RUN = ("context_parallel has no dry run here: torch 2.13's context_parallel() patches "
                 "F.scaled_dot_product_attention to hand DTensors to ring attention, while the fake GPU's attention "
                 "calls the flash kernel's op on plain tensors, so the patch would not engage; `estimate` models it "
                 "(activations 1/cp of the sequence, keys and values of the whole sequence gathered for attention)")
MAX_FSDP2_RANKS = 128      # an fsdp2 dry run's time grows with the world size (see run)
ATTENTION = {"eager": "eager", "sdpa": "fake_gpu_attention", "flash": "fake_gpu_attention"}


def build_model(m: models.ModelSpec, setup: TrainSetup, device):
    """The model from its config on `device` (built on fake 'cpu', re-created there), in the dtype of its weights."""
    dtype = torch.bfloat16 if setup.precision == "bf16" or setup.strat.deepspeed else torch.float32
    model = engines.build_model(m.path, setup, dtype, ATTENTION[setup.attention])
    if torch.device(device).type != "cpu":
        move_to(model, device)
    return model


def move_to(model, device) -> None:
    """Re-create parameters and buffers on `device` (fake tensors cannot be moved with Module.to)."""
    nf4.recreate_on(model, device)                 # 4-bit weights carry their quantisation state
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not hasattr(p, "quant_state"):
                module._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)   # (empty_like would run
                # a constant buffer's real kernel on the fake device: Gemma's `normalizer` is torch.tensor(...))
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


class SingleStep:
    """One GPU (or, per rank, the replicated strategies): torch AdamW, autocast for bf16-mixed and fp16-mixed (with
    GradScaler)."""

    scaler = None                   # (engines that shard keep none: fp16-mixed is refused there)

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        self.model, self.setup, self.tracker = model, setup, tracker
        tracker.label(list(model.parameters()) + nf4.state_tensors(model), "parameters")
        self.params = [p for p in model.parameters() if p.requires_grad]        # LoRA: the adapters only
        self.optimizer = engines.optimizer(self.params, setup, lr=1e-5)
        self.scaler = engines.grad_scaler(setup, self.params[0].device.type, fake=True)
        if setup.strat.gradient_buckets:     # DDP's reducer buckets: one flat gradient-sized buffer (measured as such)
            dev = self.params[0].device
            self.buckets = torch.empty(sum(_local(p).numel() for p in self.params), dtype=self.params[0].dtype,
                                       device=dev)
            tracker.label([self.buckets], "comm_buffers")

    def _autocast(self):
        """torch's autocast in the set-up's 16-bit dtype for mixed precision; nothing otherwise."""
        return fakegpu.autocast(engines.HALF[self.setup.half]) if self.setup.mixed else contextlib.nullcontext()

    def forward(self, ids):
        with self._autocast():
            if self.setup.outputs_held:     # the loop's variable keeps the logits (LitGPT): rebound after this forward
                out = self.model(input_ids=ids, labels=ids)
                loss, self.held = out.loss, out.logits
                del out
            else:                           # the output (and its logits) is dropped, as trainers do
                loss = engines.setup_loss(self.model, ids, self.setup, self.tracker)
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        return loss

    def backward(self, loss):
        engines.backward(self.tracker, loss, self.params, scaler=self.scaler)

    def step(self):
        engines.step(self.tracker, self.optimizer, scaler=self.scaler)


class DPOLoss:
    """DPO as TRL 1.10's DPOTrainer runs it (`_compute_loss`, re-enacted; KTO's alike, its batch unpaired and its KL
    batch scored first: `preference_loss.kto_loss`), the loss of a step class: the micro batch is
    its chosen sequences then its rejected ones, one forward of the policy (under autocast, where accelerate's
    native-amp wrapper returns the logits as fp32: `convert_outputs_to_fp32`; under DeepSpeed a bf16 module, no native
    amp, the logits stay bf16 and `selective_log_softmax` takes its 16-bit way); the shifted logits'
    log-probabilities; then the reference model's forward under no_grad, scored the same way and dropped; the sigmoid
    loss (beta 0.1): the loss itself is `helpers.measure.preference_loss.dpo_loss`, the one the scaled runs train
    with.

    `reference`: the frozen copy (built like the policy: TRL loads it with the policy's model_init_kwargs; under
    DeepSpeed ZeRO-1/2 in bf16, as stage 0 casts it) where the set-up's reference is 'copy'; None for 'adapters-off'
    (the LoRA policy with its adapters disabled) and 'none' (precomputed log-probs: no reference forward)."""

    def _hold_reference(self, reference, tracker: Tracker) -> None:
        self.reference = reference
        if reference is not None:
            reference.requires_grad_(False)
            reference.eval()
            tracker.label(list(reference.parameters()) + list(reference.buffers()), "parameters")
            engines.watch_logits(reference, tracker)

    def _amp(self):
        """accelerate's native amp: none under DeepSpeed (its bf16 module computes in bf16)."""
        return contextlib.nullcontext() if self.setup.strat.deepspeed else self._autocast()

    def _policy(self, ids):
        with self._amp():
            out = self.model(input_ids=ids)
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        return out

    def _reference(self, ids):
        with self._amp():
            if self.reference is not None:
                return self.reference(input_ids=ids)
            with self.model.disable_adapter():          # LoRA: the base, adapters disabled (peft's disable_adapter)
                return self.model(input_ids=ids)

    def forward(self, ids):
        s = self.setup
        return preference_loss.loss(self._policy, None if s.ref == "none" else self._reference, ids, s,
                                    self.tracker.set_context,
                                    fp32_outputs=preference_loss.fp32_outputs(s))


class DPOStep(DPOLoss, SingleStep):
    """DPO on one GPU or under DDP (DPOLoss), with the reference copy held."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None, reference=None):
        SingleStep.__init__(self, model, setup, tracker, mesh)
        self._hold_reference(reference, tracker)


class GRPOLoss:
    """GRPO as TRL 1.10's GRPOTrainer trains (`_compute_loss` and `_get_per_token_logps_and_entropies`, re-enacted),
    the loss of a step class: each sequence is a prompt and its completion, the last `completion` tokens; the policy's
    forward asks for the completion's logits alone (transformers' `logits_to_keep` = completion + 1). Without
    DeepSpeed the forward runs under autocast and accelerate's native-amp wrapper returns its logits as fp32; under
    DeepSpeed (a bf16 module, no native amp) they stay bf16, and `selective_log_softmax` takes its bf16 way, a
    log_softmax per sequence. The last position is dropped, the rest divided by the temperature in place; the entropy
    under no_grad, 128 rows at a time (`entropy_from_logits`); the clipped policy loss with old log-probs equal to the
    new ones detached (num_iterations 1, TRL's default) and, with a reference, the KL term on log-probs scored before
    the step (zeros here: they come in with the batch). Generation and scoring happen between steps, outside this."""

    TEMPERATURE, EPSILON, BETA, CHUNK = 1.0, 0.2, 0.04, 128

    def _hold_reference(self, reference, tracker: Tracker) -> None:
        self.reference = reference                      # alive through the step, used between steps
        if reference is not None:
            reference.requires_grad_(False)
            tracker.label(list(reference.parameters()) + list(reference.buffers()), "parameters")

    def forward(self, ids):
        c, deepspeed = self.setup.completion_tokens, self.setup.strat.deepspeed
        with contextlib.nullcontext() if deepspeed else self._autocast():
            out = self.model(input_ids=ids, logits_to_keep=c + 1)
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        self.tracker.set_context("logits")
        logits = out.logits if deepspeed else out.logits.float()    # accelerate: an autocast forward's outputs as fp32
        del out
        logits = logits[:, :-1, :][:, -c:, :]
        logits.div_(self.TEMPERATURE)
        logps = preference_loss.sequence_token_logps(logits, ids[:, -c:])
        with torch.no_grad():                           # entropy_from_logits, for the metrics (entropy_coef 0.0)
            flat = logits.reshape(-1, logits.shape[-1])
            entropies = []
            for chunk in flat.split(self.CHUNK, dim=0):
                lp = torch.nn.functional.log_softmax(chunk, dim=-1)
                entropies.append(-(torch.exp(lp) * lp).sum(-1))
            del flat, lp, chunk
            torch.cat(entropies, dim=0)
            del entropies
        del logits
        advantages = torch.ones(ids.shape[0], 1, device=ids.device)
        coef_1 = torch.exp(logps - logps.detach())
        coef_2 = torch.clamp(coef_1, 1 - self.EPSILON, 1 + self.EPSILON)
        per_token = -torch.min(coef_1 * advantages, coef_2 * advantages)
        if self.setup.ref != "none":
            ref = torch.zeros_like(logps)
            per_token = per_token + self.BETA * (torch.exp(ref - logps) - (ref - logps) - 1)
        loss = per_token.mean(-1).mean()
        self.tracker.set_context(None)
        return loss


class GRPOStep(GRPOLoss, SingleStep):
    """GRPO on one GPU or under DDP (GRPOLoss), with the reference copy held."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None, reference=None):
        SingleStep.__init__(self, model, setup, tracker, mesh)
        self._hold_reference(reference, tracker)


class OpenRLHFActorLoss:
    """OpenRLHF's actor step (train_ppo_ray, `helpers.measure.rl_loss.actor_loss`, re-enacted), the loss of a step
    class: the whole sequence's logits from the module (bf16 under DeepSpeed: no autocast), copied to fp32, scored
    with flash-attn's Triton cross-entropy (attention 'flash') or gather less a chunked logsumexp, the clipped policy
    loss over the last `completion` tokens; what training_step keeps referenced (the fp32 logits, the entropy's
    graph) is held until the next micro batch's forward begins: through backward and the optimizer step. The
    reference (another Ray actor on the same GPU when colocated) scores before the step: held, not run."""

    _hold_reference = GRPOLoss._hold_reference
    _actor = None

    def forward(self, ids):
        s = self.setup
        if self._actor is None:
            self._actor = rl_loss.ActorStep(s, self.tracker.set_context)

        def logits_of(x):
            with contextlib.nullcontext() if s.strat.deepspeed else self._autocast():
                out = self.model(input_ids=x)
                self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
            return out.logits

        return self._actor(logits_of, ids)


class OpenRLHFActorStep(OpenRLHFActorLoss, SingleStep):
    """OpenRLHF's actor on one GPU or data-parallel (OpenRLHFActorLoss)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None, reference=None):
        SingleStep.__init__(self, model, setup, tracker, mesh)
        self._hold_reference(reference, tracker)


class RewardLoss:
    """A reward model's step as TRL 1.10's RewardTrainer trains it (`compute_loss`, re-enacted), the loss of a step
    class: the micro batch is its chosen sequences then its rejected ones (DataCollatorForPreference), one forward of
    the sequence classifier; its pooled score per sequence (fp32 from accelerate's native-amp wrapper; the module's
    dtype under DeepSpeed), split in two, and -logsigmoid(chosen - rejected)."""

    def forward(self, ids):
        deepspeed = self.setup.strat.deepspeed
        with contextlib.nullcontext() if deepspeed else self._autocast():
            if self.setup.rm_head == "value-head":
                rewards = engines.value_head_rewards(self.model, ids)
            else:
                out = self.model(input_ids=ids)
                rewards = out.logits
                del out
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        self.tracker.set_context("logits")
        rewards = rewards if deepspeed else rewards.float()
        chosen, rejected = rewards.squeeze(-1).chunk(2)
        loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
        self.tracker.set_context(None)
        return loss


class RewardStep(RewardLoss, SingleStep):
    """A reward model on one GPU or under DDP (RewardLoss)."""


class FSDP2Step(SingleStep):
    """FSDP2 on a fake process group (rank 0 of `gpus`): torchtitan's grouping, MixedPrecisionPolicy for
    bf16-mixed (bf16 compute, fp32 reduce), CPUOffloadPolicy (pageable: a fake host cannot pin) with offload."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        if mesh is not None and mesh.mesh_dim_names:                     # named: hybrid sharding, or TP's 'dp' part
            mesh = _data_parallel(mesh)
        engines.shard_fsdp2(model, setup, mesh, pin_memory=False)
        self.model, self.setup, self.tracker = model, setup, tracker
        tracker.label(list(model.parameters()), "parameters")
        self.params = [p for p in model.parameters() if p.requires_grad]        # LoRA: the adapters only
        self.optimizer = engines.adamw(self.params, setup.adam, lr=1e-5)

    def forward(self, ids):
        with engines.fsdp_buffers_counted(self.tracker):
            return self.model(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        with engines.fsdp_buffers_counted(self.tracker), fakegpu.accelerator_stream():
            super().backward(loss)

    def syncing(self, on: bool) -> None:
        """accelerate's no_sync for FSDP2 around every micro batch but the last (unless sync_each_batch)."""
        self.model.set_requires_gradient_sync(on or self.setup.sync_each_batch)


class FSDP1Step(SingleStep):
    """FSDP1 (FullyShardedDataParallel, FULL_SHARD, one unit per decoder layer) on a fake process group, rank 0's
    view; MixedPrecision for bf16-mixed, CPUOffload(offload_params=True) with offload (see helpers.measure.fsdp1)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        from helpers.measure import fsdp1

        self.stack = contextlib.ExitStack()
        self.stack.enter_context(fsdp1.no_stream_records())
        self.stack.enter_context(fsdp1.pinned_host_memory())
        self.stack.enter_context(fsdp1.reduce_scatter_counted(tracker))
        self.stack.enter_context(fsdp1.fake_data_ptrs_told_apart())
        try:
            group = (mesh.get_group("dp_shard_cp"), mesh.get_group("dp_replicate")) if setup.hybrid_shard else \
                mesh.get_group()
            self.model = fsdp1.wrap(model, setup, device_id=fakegpu.device(), process_group=group)
        except BaseException:
            self.stack.close()
            raise
        self.setup, self.tracker, self.module = setup, tracker, self.model
        tracker.label(list(self.model.parameters()), "parameters")
        self.params = [p for p in self.model.parameters() if p.requires_grad]       # LoRA: the adapters only
        self.optimizer = engines.adamw(self.params, setup.adam, lr=1e-5)

    def close(self):
        self.stack.close()

    def syncing(self, on: bool) -> None:
        """FSDP1's no_sync() around every micro batch but the last (unless sync_each_batch): it sets every FSDP
        module's _sync_gradients (torch 2.13 fully_sharded_data_parallel.py no_sync)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for m in FSDP.fsdp_modules(self.model):
            m._sync_gradients = on or self.setup.sync_each_batch

    def forward(self, ids):
        from helpers.measure import fsdp1

        with self._autocast():                  # accelerate runs an FSDP model's forward under autocast too
            loss = self.model(input_ids=ids, labels=ids).loss
        fsdp1.label_buffers(self.tracker, self.model, self.setup.offload_params)     # made by the lazy init
        return loss

    def step(self):
        super().step()
        self.tracker.label([p.grad for p in self.params if p.grad is not None], "gradients")


class TensorParallelFSDP2Step(FSDP2Step):
    """2-D: torchtitan's tensor-parallel plan over the mesh's 'tp' dimension (helpers.measure.tensor_parallel), then
    FSDP2 over 'dp_shard_cp'; the loss under loss_parallel (Shard(-1) logits)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        tensor_parallel.apply(model, mesh["tp"])
        with tensor_parallel.real_mesh_arithmetic():
            super().__init__(model, setup, tracker, _data_parallel(mesh))

    def forward(self, ids):
        with engines.fsdp_buffers_counted(self.tracker):
            return tensor_parallel.loss(self.model, ids, self.tracker)

    def backward(self, loss):
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            super().backward(loss)


class TensorParallelReplicatedStep(SingleStep):
    """Tensor parallelism with the parameters' TP shards replicated over the data-parallel ranks (DDP re-enacted:
    its bucket buffer sized to this rank's shards)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        tensor_parallel.apply(model, mesh["tp"])
        super().__init__(model, setup, tracker, mesh)

    def forward(self, ids):
        with self._autocast():
            loss = tensor_parallel.loss(self.model, ids, self.tracker)
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        return loss

    def backward(self, loss):
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            super().backward(loss)


class ZeroEquivalentStep(SingleStep):
    """DeepSpeed ZeRO-1/2 re-enacted in torch (DeepSpeed itself cannot run on fake tensors), labelled as such.

    The same buffers as `deepspeed/runtime/zero/stage_1_and_2.py`, made at the same points: bf16 parameters; an fp32
    master partition (1/N, on the host with offload_optimizer); ipg reduce bucket(s) made by the first gradient hook; each
    gradient kept whole (ZeRO-1), or (ZeRO-2) held in the bucket and copied into a contiguous bf16 partition made at the
    bucket's first reduction (reduce_bucket_size elements filled, or the end of backward); at the step an
    fp32 copy of the gradient partition, then Adam (torch's fused AdamW standing in for FusedAdam/DeepSpeedCPUAdam;
    with adam_impl, the HF Trainer's torch AdamW that DeepSpeed steps as a client optimizer, over the flat partition).
    """

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        self.model, self.setup, self.tracker = model, setup, tracker
        tracker.label(list(model.parameters()), "parameters")
        self.params = [p for p in model.parameters() if p.requires_grad]        # LoRA: the adapters only
        G, dev = setup.degrees.shard, self.params[0].device
        self.part = ceil_div(sum(p.numel() for p in self.params), G)
        self.host = torch.device("cpu") if setup.offload_optimizer else dev
        self.master = torch.nn.Parameter(torch.empty(self.part, dtype=torch.float32, device=self.host))
        tracker.label([self.master], "master_weights")
        self.host_grad = None
        if setup.offload_optimizer:
            self.host_grad = torch.empty(self.part, dtype=torch.float32, device=self.host)
            tracker.label([self.host_grad], "gradients")
            largest = max(p.numel() for p in self.params)
            self.staging = [torch.empty(largest, dtype=torch.bfloat16, device=d) for d in (self.host, dev)]
            self.staging.append(torch.empty(self.part, dtype=torch.bfloat16, device=self.host))
            tracker.label(self.staging, "comm_buffers")
        # the HF Trainer's torch AdamW handed to DeepSpeed, else torch's fused one standing in for DeepSpeed's own
        self.optimizer = engines.adamw([self.master], setup.adam if setup.client_optimizer else "fused", lr=1e-5)
        self.buckets, self.partition, self.offset, self.filled = None, None, 0, 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._reduce)

    def forward(self, ids):
        return engines.setup_loss(self.model, ids, self.setup, self.tracker)

    def backward(self, loss):
        self.offset, self.filled = 0, 0
        super().backward(loss)
        if self.filled:
            self._flush(self.params[0])        # the end of backward reduces what the bucket holds (the epilogue)
        self.buckets = None                    # DeepSpeed releases its ipg buckets when backward ends

    def _flush(self, p):
        """A reduction of the ipg bucket: ZeRO-2 makes its gradient partition at the first one (DeepSpeed 0.19.8
        stage_1_and_2.py copy_grads_in_partition: `grads_in_partition` made when first None), the gradients held in
        the bucket until then; as the rank whose partition holds the head and the last layers does."""
        if self.partition is None and "gradients" in self.setup.strat.shards and self.host_grad is None:
            self.partition = torch.empty(self.part, dtype=p.dtype, device=p.device)
            self.tracker.label([self.partition], "gradients")
        self.filled = 0

    def _reduce(self, p):
        """What DeepSpeed's gradient hooks do: keep this rank's share of the gradient, free the rest."""
        if self.buckets is None:               # made by the first gradient hook (ZeRO-1's too: a scaled run shows it)
            n = 2 if self.setup.overlap else 1
            self.buckets = [torch.empty(self.setup.reduce_bucket_size, dtype=torch.bfloat16, device=p.device)
                            for _ in range(n)]
            self.tracker.label(self.buckets, "comm_buffers")
        if "gradients" not in self.setup.strat.shards and not self.setup.offload_optimizer:     # ZeRO-1
            self.tracker.label([p.grad], "gradients")
            return
        if self.filled and self.filled + p.numel() > self.setup.reduce_bucket_size:
            self._flush(p)                     # (reduce_independent_p_g_buckets_and_remove_grads: the bucket is full)
        self.filled += p.numel()
        n = self.setup.degrees.split(p.numel())
        n = min(n, self.part - self.offset)
        if self.host_grad is not None and self.setup.grad_accum > 1:
            self._accumulate_on_host(p, n)
        if self.host_grad is not None:
            self.host_grad.narrow(0, self.offset, n).copy_(p.grad.view(-1)[:n])
        elif self.partition is not None:      # (before it, the gradient waits in the bucket, counted there)
            self.partition.narrow(0, self.offset, n).copy_(p.grad.view(-1)[:n])
        self.offset += n
        p.grad = None

    def _accumulate_on_host(self, p, n):
        """DeepSpeed's accumulated_grads_in_cpu under gradient accumulation with offload: one host buffer per
        parameter in the model dtype, made at the first micro step and kept."""
        if not hasattr(self, "accumulated"):
            self.accumulated = {}
        if id(p) not in self.accumulated:
            self.accumulated[id(p)] = torch.zeros(n, dtype=p.grad.dtype, device=self.host)
            self.tracker.label([self.accumulated[id(p)]], "gradients")
        self.accumulated[id(p)].copy_(p.grad.view(-1)[:n])      # (DeepSpeed adds; the bytes are the same)

    def step(self):
        flat = None
        if self.host_grad is not None:
            self.master.grad = self.host_grad
        else:
            # the gradient norm first: each gradient of the partition copied to float64 in turn (DeepSpeed 0.19.8
            # get_grad_norm_direct); the largest piece any rank holds (deepspeed_rules), one copy made and freed
            piece = deepspeed_rules.largest_partition_piece([p.numel() for p in self.params], self.part)
            copy64 = torch.empty(piece, dtype=torch.float64, device=self.params[0].device)
            self.tracker.label([copy64], "gradients")
            torch.linalg.vector_norm(copy64)
            del copy64
            if self.partition is None:        # ZeRO-1: flatten this rank's share of the whole gradients
                share, left = [], self.part
                for p in self.params:
                    n = min(self.setup.degrees.split(p.numel()), left)
                    share.append(p.grad.view(-1)[:n])
                    left -= n
                flat = torch.cat(share)
                del share
            else:                             # ZeRO-2: flatten the partition's views (a copy), as DeepSpeed does
                flat = torch.cat([self.partition])
            self.tracker.label([flat], "gradients")
            self.master.grad = flat.float()
            self.tracker.label([self.master.grad], "gradients")
            for p in self.params:
                p.grad = None
            self.partition = flat = None      # freed before the update (stage_1_and_2.py step: del flat_grad_partition,
            #                                   _release_preflattened_grad_buffers)
        self.optimizer.step()
        self.tracker.label(engines.optimizer_states(self.optimizer), "optimizer_states")
        if self.host_grad is None:
            self.master.grad = None


def _local(t):
    """A tensor's own shard when it is a DTensor (its numel() is the global one), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _fake_mesh(world: int, tp: int = 1, replicate: int = 1):
    """A device mesh over a fake process group of `world` ranks, this process being rank 0: 1-D, or with tensor
    parallelism 2-D ('dp_shard_cp' x 'tp', torchtitan's names: data-parallel and context-parallel ranks outer), with
    hybrid sharding a 'dp_replicate' dimension outermost (torchtitan's order)."""
    from torch.distributed.device_mesh import init_device_mesh

    from helpers.measure import procgroup

    procgroup.ensure("fake", world)
    if tp == 1 and replicate == 1:
        return init_device_mesh(fakegpu.NAME, (world,))
    dims = [("dp_replicate", replicate), ("dp_shard_cp", world // (tp * replicate)), ("tp", tp)]
    dims = [d for d in dims if d[0] == "dp_shard_cp" or d[1] > 1]
    return init_device_mesh(fakegpu.NAME, tuple(n for _, n in dims), mesh_dim_names=tuple(k for k, _ in dims))


def _data_parallel(mesh):
    """What FSDP shards over in `mesh`: its 'dp_shard_cp' dimension, or with hybrid sharding the 2-D
    ('dp_replicate', 'dp_shard_cp') mesh that makes fully_shard hybrid (HSDP)."""
    if "dp_replicate" in mesh.mesh_dim_names:
        return mesh["dp_replicate", "dp_shard_cp"]
    return mesh["dp_shard_cp"]


class _Progress(Hooks):
    """The dry run's progress bar: one tick a phase."""

    def __init__(self, bar):
        self.bar = bar

    def after(self, phase, activity, seconds):
        self.bar.update()


class NullTracker:
    """Stands in for the Tracker to time the same step untracked."""

    def label(self, tensors, category, device=None): pass
    def set_context(self, name): pass
    def restart_peak(self, phase): pass

    @contextlib.contextmanager
    def phase(self, name, activity=None):
        yield

    @contextlib.contextmanager
    def made_as(self, category):
        yield

    @contextlib.contextmanager
    def paused(self):
        yield

    def __enter__(self): return self
    def __exit__(self, *exc): return False


def supports(setup: TrainSetup) -> tuple[bool, str]:
    """(True, '') where `run` can dry-run `setup` (any model that takes it), else (False, why): the one answer to
    "has this set-up a dry run?" for the notebooks, `recheck` and `run` itself."""
    why = refusal(checked(setup))
    return why is None, why or ""


def refusal(setup: TrainSetup) -> str | None:
    """Why `setup` has no dry run (one sentence naming what does measure it), or None."""
    try:
        engines.refuse_unsupported(setup, "dry")
    except InputError as exc:
        return str(exc)
    st = setup.strat
    if setup.optimizer == "adamw-8bit":
        return ("optimizer 'adamw-8bit' has no dry run: bitsandbytes' kernels cannot run on fake tensors; its states "
                "are in `estimate` and measured for real in a scaled run")
    if st.dry_run is None:
        return (f"no dry run for strategy {setup.strategy!r}: {st.no_dry_run}; dry runs exist for "
                f"{strategies.listing(lambda x: x.dry_run is not None)} (fsdp2 shards as ZeRO-3 does; a scaled real "
                f"run uses {st.title} itself)")
    if (st.fake_process_group or setup.tensor_parallel > 1) and setup.gpus > MAX_FSDP2_RANKS:
        return (f"gpus must be at most {MAX_FSDP2_RANKS} in an {setup.strategy} dry run, got {setup.gpus}: rank 0's "
                f"all-gathers touch every rank's shard, so the fake step's time grows with the world size (~40 s at "
                f"256, minutes beyond); `estimate` takes any world size")
    if not st.dry_run_offload and setup.offload_params:
        return ("no dry run of FSDP1 with CPU offload: FSDP1 moves each flat parameter between host and GPU by "
                "swapping its `.data`, which fake tensors on the fake GPU refuse; `estimate` models it, and a scaled "
                "run (`measure --mode scaled`) runs FSDP1's CPUOffload for real")
    if setup.context_parallel > 1:
        return NO_CP_DRY_RUN
    families = ("replicated", "zero12")
    if setup.run in LOGPS_RUNS and st.family not in families:
        return (f"a {setup.run.upper()} dry run exists for "
                f"{strategies.listing(lambda x: x.family in families, 'and')} (TRL's step re-enacted, reference "
                f"model included), not for {setup.strategy!r}; `estimate` places the reference model under every "
                f"engine (helpers.estimate.reference)")
    if setup.run == "rm" and st.family not in families:
        return (f"a reward model's dry run exists for {strategies.listing(lambda x: x.family in families, 'and')} "
                f"(TRL's RewardTrainer step re-enacted), not for {setup.strategy!r}; `estimate` models its score head "
                f"under every engine (helpers.estimate.reward)")
    return None


def run(model, setup: TrainSetup, progress: bool = True, track: bool = True, gpu: str | None = None,
        alloc_conf: str | None = None, snapshot=None) -> Result:
    """Dry-run one set-up: a Result with mode 'dry-run' (GPU per rank, host per node), with the reserved view: the
    caching allocator modelled on the step's allocations (`alloc_conf` as PYTORCH_CUDA_ALLOC_CONF, e.g.
    'expandable_segments:True'), plus the CUDA context of `gpu` (a helpers.gpus preset) and NCCL's buffers.
    `snapshot`: a path where the allocator model's state is also written as a PyTorch memory snapshot
    (`helpers.measure.snapshot`), at its out-of-memory under the GPU's capacity less the context and NCCL, or at its
    highest allocated moment; meta['snapshot'] says which."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tqdm.auto import tqdm

    setup = checked(setup)
    allocator.Config.parse(alloc_conf)                      # bad settings and GPU names refused before the run
    if gpu is not None:
        gpus.preset(gpu)
    why = refusal(setup)
    if why:
        raise InputError(why)
    m = models.spec(model)
    if setup.run == "rm":
        m = reward.spec(m, setup.rm_head)                                  # (its parameters, as the estimate counts them)
    m.check_lora_rank(setup.lora_rank, setup.lora_targets)
    adapters.check_fsdp1(m, setup)
    st = setup.strat
    if setup.tensor_parallel > 1:
        from helpers.estimate import parallel
        parallel.check(m, setup)
    started = time.perf_counter()
    dev = fakegpu.device()
    bar = tqdm(total=4 + 4 * setup.grad_accum, desc=f"dry run {m.name}", disable=not progress, leave=False)
    tp = setup.tensor_parallel
    mesh = _fake_mesh(setup.gpus, tp, setup.degrees.dp_replicate) if st.fake_process_group or tp > 1 else None
    with FakeTensorMode(allow_non_fake_inputs=True), \
            (nf4.dequantized_matmuls() if setup.quantized else contextlib.nullcontext()), nf4.matmul_as(setup), \
            engines.kv_expanded(setup):
        net = build_model(m, setup, dev)                     # built before tracking: setup is the engine's state
        ref = build_model(m, setup, dev) if reference.holds_copy(setup) else None    # DPO's, GRPO's frozen copy
        bar.update()
        tracker = Tracker() if track else NullTracker()
        stepped = time.perf_counter()
        with tracker, engines.untracked_sharding_propagation(tracker):
            if setup.run in PREFERENCE_RUNS:
                engine = (DPOZeroStep if st.family == "zero12" else DPOStep)(net, setup, tracker, mesh, reference=ref)
            elif setup.run == "rm":
                engine = (RewardZeroStep if st.family == "zero12" else RewardStep)(net, setup, tracker, mesh)
            elif setup.run == "grpo" and setup.dpo_logps == "openrlhf":
                engine = (OpenRLHFActorZeroStep if st.family == "zero12" else OpenRLHFActorStep)(
                    net, setup, tracker, mesh, reference=ref)
            elif setup.run == "grpo":                   # (its reference scores between steps)
                engine = (GRPOZeroStep if st.family == "zero12" else GRPOStep)(net, setup, tracker, mesh, reference=ref)
            else:
                engine = (TP_STEPS if tp > 1 else STEPS)[st.family](net, setup, tracker, mesh)
            try:
                tracker.label([b for b in net.buffers()], "parameters")
                tracker.restart_peak("setup")
                engines.watch_logits(net, tracker)
                ids = torch.randint(0, m.vocab, (reference.pairs(setup).batch, setup.seq), device=dev)
                bar.update()
                # two iterations, each with its step: from the second step on, the states the first update made are
                # alive while a step prepares (DeepSpeed ZeRO-1/2 frees its bf16 gradients before the update, so
                # its step's peak is the second step's preparation)
                run_steps(engine, tracker, ids, setup.grad_accum, 2, hooks=_Progress(bar))
            finally:
                getattr(engine, "close", lambda: None)()      # the engine's patches of torch, if any, undone
    step_s = time.perf_counter() - stepped
    bar.close()
    if not track:
        return Result(m.name, m.params, "dry-run (untracked)", dataclasses.asdict(setup), DeviceMemory({}),
                      DeviceMemory({}), meta={"step_s": round(step_s, 2)})
    scale = setup.ranks_per_node
    gpu_cap = None if setup.gpu_gib is None else from_gib(setup.gpu_gib)
    host_cap = None if setup.host_gib is None else from_gib(setup.host_gib)
    result = Result(
        model=m.name, params=m.params, mode="dry-run", setup=dataclasses.asdict(setup),
        gpu=DeviceMemory(tracker.breakdown("gpu"), gpu_cap), host=DeviceMemory(tracker.breakdown("host", scale), host_cap),
        meta={"date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": provenance.versions(),
              "versioned": library_versions.applied(setup, m),
              "device": "fake tensors (no memory allocated); GPU = fake PrivateUse1 device 'gpu'",
              "engine": st.dry_run + (f"; tensor parallel {tp} (torchtitan's plan, DTensor on a 2-D fake mesh)"
                                      if tp > 1 else ""), "wall_s": round(time.perf_counter() - started, 2),
              "step_s": round(step_s, 2), "machine": platform.machine(),
              "note": ("host bytes are pageable: fake tensors cannot be pinned"
                       if setup.offload_optimizer or setup.offload_params else "")},
    )
    events = reserved.events_from(tracker)
    result = reserved.attach(result, events, gpu, alloc_conf)
    if snapshot is not None:
        from helpers.measure import snapshot as snapshot_writer

        limit = None if gpu_cap is None else gpu_cap - sum((result.gpu.overhead or {}).values())
        result.meta["snapshot"] = snapshot_writer.write(snapshot, events, snapshot_writer.labels_of(tracker),
                                                        allocator.Config.parse(alloc_conf), limit)
    return result


class RewardZeroStep(RewardLoss, ZeroEquivalentStep):
    """A reward model under DeepSpeed ZeRO-1/2 re-enacted (RewardLoss on ZeroEquivalentStep)."""


class DPOZeroStep(DPOLoss, ZeroEquivalentStep):
    """DPO under DeepSpeed ZeRO-1/2 re-enacted (DPOLoss on ZeroEquivalentStep): bf16 logits, the reference copy whole
    in bf16 as TRL's prepare_deepspeed places it (stage 0)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None, reference=None):
        ZeroEquivalentStep.__init__(self, model, setup, tracker, mesh)
        self._hold_reference(reference, tracker)


class GRPOZeroStep(GRPOLoss, ZeroEquivalentStep):
    """GRPO under DeepSpeed ZeRO-1/2 re-enacted (GRPOLoss on ZeroEquivalentStep): bf16 logits, the reference copy
    whole in bf16 as TRL's prepare_deepspeed places it (stage 0)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None, reference=None):
        ZeroEquivalentStep.__init__(self, model, setup, tracker, mesh)
        self._hold_reference(reference, tracker)


class OpenRLHFActorZeroStep(OpenRLHFActorLoss, ZeroEquivalentStep):
    """OpenRLHF's actor under DeepSpeed ZeRO-1/2 re-enacted (OpenRLHFActorLoss on ZeroEquivalentStep): bf16 logits
    copied to fp32; a colocated reference whole in bf16 (get_eval_ds_config: stage 0 unless the actor's is 3)."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None, reference=None):
        ZeroEquivalentStep.__init__(self, model, setup, tracker, mesh)
        self._hold_reference(reference, tracker)


STEPS = {"replicated": SingleStep, "zero12": ZeroEquivalentStep, "fsdp2": FSDP2Step, "fsdp1": FSDP1Step}
"""The dry-run step of each strategy's `states` key (helpers.strategies); a strategy with no dry run has none."""
TP_STEPS = {"replicated": TensorParallelReplicatedStep, "fsdp2": TensorParallelFSDP2Step}
"""The same with tensor_parallel > 1 (strategies with `model_parallel`)."""


def recheck(model: str, setup, gpu: str | None = None, alloc_conf: str | None = None,
            result: Result | None = None) -> dict:
    """A set-up's GPU verdict on allocated bytes and on the device total (bytes): from a dry run with the allocator
    model where the strategy has a dry run (`result`, if that dry run was already made), else from the estimate plus
    the context and NCCL (reserved not modelled: said in 'basis'). 'flipped' is True where the two verdicts differ."""
    has_dry, why = supports(setup)
    r = result if result is not None else run(model, setup, progress=False, gpu=gpu, alloc_conf=alloc_conf) \
        if has_dry else estimate.run(model, setup)
    if has_dry and r.gpu.reserved is None:
        raise ValueError("recheck needs a dry run's Result (with its reserved view) for this set-up")
    parts = gpus.overhead(setup.strategy, setup.gpus, gpu)
    allocated, cap = r.gpu.peak_bytes, r.gpu.capacity_bytes
    if has_dry:
        reserved_peak = max(r.gpu.reserved.values())
        v = r.meta["allocator"]["verdict"] or {"fits": True, "part": None}
        fits_device, part = v["fits"], v["part"]
        basis = "dry run + allocator model (reserved modelled) + context + NCCL"
    else:
        reserved_peak = None
        part = gpus.pushed_over(allocated, allocated, parts, cap) if cap else None
        fits_device = part is None
        basis = (f"estimate + context + NCCL: no dry run of this set-up ({why}), so the allocator's reserve is not "
                 f"modelled (a lower bound)")
    fits_allocated = cap is None or r.oom["device"] != "gpu"
    return {"model": model, "allocated": allocated, "reserved": reserved_peak, "overhead": parts,
            "device_total": (reserved_peak if reserved_peak is not None else allocated) + sum(parts.values()),
            "capacity": cap, "fits_allocated": fits_allocated, "fits_device": fits_device, "part": part,
            "flipped": fits_allocated != fits_device, "basis": basis, "result": r}

