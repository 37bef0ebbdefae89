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

from helpers import models
from helpers.errors import InputError
from helpers.measure import fakegpu
from helpers.measure.tracker import Tracker
from helpers.results import DeviceMemory, Result
from helpers.training import TrainSetup
from helpers.units import from_gib

ATTENTION = {"eager": "eager", "sdpa": "fake_gpu_attention", "flash": "fake_gpu_attention"}


def _versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    try:
        from importlib.metadata import version

        out["deepspeed"] = version("deepspeed")
    except Exception:           # pragma: no cover - deepspeed is a dependency, but a dry run does not need it
        pass
    return out


def build_model(m: models.ModelSpec, setup: TrainSetup, device):
    """The model from its config on `device`, in the dtype the set-up keeps its weights in."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    cfg = models.load_config(m.name if m.name in models.catalogue() else m.name)
    dtype = torch.bfloat16 if setup.precision == "bf16" or setup.strategy.startswith("zero") else torch.float32
    if setup.strategy == "fsdp2" and setup.precision == "bf16":
        dtype = torch.bfloat16
    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=ATTENTION[setup.attention])
    if torch.device(device).type != "cpu":
        move_to(model, device)
    model.config.use_cache = False
    if setup.grad_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model


def move_to(model, device) -> None:
    """Re-create parameters and buffers on `device` (fake tensors cannot be moved with Module.to)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty_like(b, device=device)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


def _adamw(params, impl: str):
    kw = {"foreach": dict(foreach=True), "fused": dict(fused=True), "for-loop": dict(foreach=False)}[impl]
    return torch.optim.AdamW(params, lr=1e-5, **kw)


def _watch_logits(model, tracker: Tracker) -> None:
    """Tag the output head and the loss as 'logits', in forward and in backward until d(hidden) is made."""
    head = model.get_output_embeddings()

    def pre(module, args):
        tracker.set_context("logits")
        if args[0].requires_grad:
            args[0].register_hook(lambda grad: tracker.set_context(None))

    head.register_forward_pre_hook(pre)
    model.register_forward_hook(lambda module, args, out: tracker.set_context(None))


class SingleStep:
    """One GPU (or, per rank, the replicated strategies): torch AdamW, autocast for bf16-mixed."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker):
        self.model, self.setup, self.tracker = model, setup, tracker
        self.params = [p for p in model.parameters()]
        tracker.label(self.params, "parameters")
        self.optimizer = _adamw(self.params, setup.adam)
        if setup.strategy == "ddp":          # DDP's reducer buckets: one flat gradient-sized buffer (measured as such)
            dev = self.params[0].device
            self.buckets = torch.empty(sum(p.numel() for p in self.params), dtype=self.params[0].dtype, device=dev)
            tracker.label([self.buckets], "comm_buffers")

    def forward(self, ids):
        ctx = fakegpu.autocast() if self.setup.precision == "bf16-mixed" else contextlib.nullcontext()
        with ctx:
            loss = self.model(input_ids=ids, labels=ids).loss      # the output (and its logits) is dropped, as trainers do
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        return loss

    def backward(self, loss):
        self.tracker.set_context("logits")
        loss.backward()
        self.tracker.set_context(None)
        self.tracker.label([p.grad for p in self.params if p.grad is not None], "gradients")

    def step(self):
        self.optimizer.step()
        self.tracker.label([v for s in self.optimizer.state.values() for v in s.values()
                            if isinstance(v, torch.Tensor) and v.numel() > 1], "optimizer_states")
        self.optimizer.zero_grad(set_to_none=True)


def run(model, setup: TrainSetup, progress: bool = True) -> Result:
    """Dry-run one set-up: a Result with mode 'dry-run' (GPU per rank, host per node)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tqdm.auto import tqdm

    setup = setup.validate()
    m = models.spec(model)
    if setup.strategy not in STEPS:
        raise InputError(f"dry run of strategy {setup.strategy!r} is not available; available: {', '.join(STEPS)}")
    started = time.perf_counter()
    dev = fakegpu.device()
    bar = tqdm(total=6, desc=f"dry run {m.name}", disable=not progress, leave=False)
    with FakeTensorMode(allow_non_fake_inputs=True):
        tracker = Tracker()
        with tracker:
            net = build_model(m, setup, dev)
            bar.update()
            _watch_logits(net, tracker)
            engine = STEPS[setup.strategy](net, setup, tracker)
            ids = torch.randint(0, m.vocab, (setup.batch, setup.seq), device=dev)
            bar.update()
            for first in (True, False):
                with tracker.phase("forward" if first else "steady", activity="forward"):
                    out = engine.forward(ids)
                bar.update()
                with tracker.phase("backward" if first else "steady", activity="backward"):
                    engine.backward(out)
                    del out
                bar.update()
                if first:
                    with tracker.phase("step"):
                        engine.step()
    bar.close()
    scale = setup.ranks_per_node
    gpu_cap = None if setup.gpu_gib is None else from_gib(setup.gpu_gib)
    host_cap = None if setup.host_gib is None else from_gib(setup.host_gib)
    return Result(
        model=m.name, params=m.params, mode="dry-run", setup=dataclasses.asdict(setup),
        gpu=DeviceMemory(tracker.breakdown("gpu"), gpu_cap), host=DeviceMemory(tracker.breakdown("host", scale), host_cap),
        meta={"date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": _versions(),
              "device": "fake tensors (no memory allocated); GPU = fake PrivateUse1 device 'gpu'",
              "wall_s": round(time.perf_counter() - started, 2), "machine": platform.machine()},
    )


STEPS = {"single": SingleStep, "ddp": SingleStep}
