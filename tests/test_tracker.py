"""The tracker: each category's bytes equal numel * element_size of the tensors that hold it, for real and fake."""

from pathlib import Path

import pytest
import torch

from helpers import models
from helpers.measure import dryrun, engines, fakegpu
from helpers.measure.tracker import Tracker
from helpers.training import TrainSetup

TINY = str(Path(__file__).parent / "data" / "tiny-llama.json")


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def tracked_step(net, ids, device_kind, optimizer):
    """Forward, backward and an AdamW step under the tracker; returns the tracker and what it should have seen."""
    tracker = Tracker()
    with tracker:
        params = list(net.parameters())
        tracker.label(params, "parameters")
        tracker.label(list(net.buffers()), "parameters")
        engines.watch_logits(net, tracker)
        with tracker.phase("forward", activity="forward"):
            loss = net(input_ids=ids, labels=ids).loss
        with tracker.phase("backward", activity="backward"):
            loss.backward()
            del loss
            grads = [p.grad for p in params]
            tracker.label(grads, "gradients")
        with tracker.phase("step"):
            optimizer.step()
            states = [v for s in optimizer.state.values() for v in s.values() if v.numel() > 1]
            tracker.label(states, "optimizer_states")
    expected = {"parameters": nbytes(params) + nbytes(net.buffers()), "gradients": nbytes(grads),
                "optimizer_states": nbytes(states)}
    return tracker.breakdown(device_kind), expected


def test_real_cpu_step_categories_equal_tensor_bytes():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(models.load_config(TINY), dtype=torch.float32)
    ids = torch.randint(0, 512, (2, 32))
    got, want = tracked_step(net, ids, "host", torch.optim.AdamW(net.parameters(), foreach=False))
    assert got["setup"]["parameters"] == want["parameters"]
    assert got["step"]["gradients"] == want["gradients"] == nbytes(net.parameters())
    assert got["step"]["optimizer_states"] == want["optimizer_states"] == 2 * nbytes(net.parameters())
    assert got["forward"]["activations"] > 0 and got["forward"]["logits"] > 0


def test_fake_gpu_step_categories_equal_tensor_bytes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    m = models.spec("llama-3-8b")
    with FakeTensorMode(allow_non_fake_inputs=True):
        net = dryrun.build_model(m, TrainSetup(precision="bf16", seq=64), fakegpu.device())
        ids = torch.randint(0, m.vocab, (1, 64), device=fakegpu.device())
        got, want = tracked_step(net, ids, "gpu", torch.optim.AdamW(net.parameters(), fused=True))
    assert got["setup"]["parameters"] == want["parameters"] == 2 * m.params + nbytes(net.buffers())
    assert got["step"]["gradients"] == want["gradients"] == 2 * m.params
    assert got["step"]["optimizer_states"] == want["optimizer_states"] == 4 * m.params


def test_dry_run_result_format_and_metadata():
    r = dryrun.run("llama-3-8b", TrainSetup(strategy="zero2", seq=128, attention="flash", grad_checkpointing=True,
                                            gpu_gib=80), progress=False)
    d = r.to_dict()
    assert d["mode"] == "dry-run" and d["params"] == 8_030_261_248
    assert d["oom"] == {"device": "gpu", "phase": "step"}
    assert {"date", "versions", "device", "wall_s", "engine"} <= set(d["meta"])
    assert d["meta"]["versions"]["torch"].startswith("2.13")
    assert "re-enacted" in d["meta"]["engine"]


def test_fsdp2_shards_are_numel_times_element_size():
    s = TrainSetup(strategy="fsdp2", gpus=4, gpus_per_node=4, seq=64, offload_optimizer=True, offload_params=True,
                   pin_memory=False)
    r = dryrun.run(TINY, s, progress=False)
    spec = models.spec(TINY)
    shards = sum(-(-t.numel // 4) for t in spec.tensors) * 4 * 4       # fp32 shards, 4 ranks on the node
    assert r.host.breakdown["setup"]["parameters"] == pytest.approx(shards, rel=0.01)
    assert r.host.breakdown["step"]["optimizer_states"] == pytest.approx(2 * shards, rel=0.01)
    assert r.gpu.breakdown["setup"]["parameters"] < 1024      # only the rotary embedding's buffers stay on the GPU


# The tiny model's peaks are 0.3-3 MiB, so the tolerance is relative only, plus 1 KiB for AdamW's scalar step counters
# (host tensors of a few bytes the estimate does not count). The tiny checkpointed bf16-mixed run is the one
# exception, stated rather than hidden: its backward peak is 8.9% under the estimate (1.55 vs 1.69 MiB; 7.9% before the
# rotary tables, 16 KiB here, and the norms' reciprocal roots were counted, which dry runs at full size confirm) because at
# hidden 64 autocast's recomputed weight casts outweigh the recomputed layer's activations, and the estimate counts
# the whole layer at once, beside every gradient; at full size the same rule lands within 3% (the llama-3-8b rows).
# (It was 5.6% while the fake GPU decomposed silu_backward, whose extra temporaries filled part of the gap.)
@pytest.mark.parametrize("model,setup,rel", [
    (TINY, TrainSetup(precision="bf16", adam_impl="foreach", batch=2, seq=64), 0.03),
    (TINY, TrainSetup(precision="bf16", adam_impl="for-loop", seq=128), 0.03),
    (TINY, TrainSetup(precision="bf16-mixed", adam_impl="for-loop", seq=128, grad_checkpointing=True), 0.095),
    # FSDP2's backward start takes the larger of the head's backward and the last block's post-backward; on this
    # twin (blocks larger than its tiny vocabulary's head) that is the block's, counted with every activation saved
    # though the block's own are freed by then: 8.2% over the dry run (7.7% before the rotary tables were counted),
    # the safe direction
    (TINY, TrainSetup(strategy="fsdp2", gpus=2, gpus_per_node=2, seq=64), 0.09),
    ("llama-3-8b", TrainSetup(strategy="zero2", seq=128, attention="flash", grad_checkpointing=True), 0.03),
    ("llama-3-8b", TrainSetup(precision="bf16", adam_impl="fused", seq=1024, attention="eager"), 0.03),
])
def test_estimate_agrees_with_dry_run(model, setup, rel):
    from helpers import estimate

    e, d = estimate.run(model, setup, lifecycle=False), dryrun.run(model, setup, progress=False)
    for dev in ("gpu", "host"):
        for phase, measured in d.device(dev).phases.items():
            assert e.device(dev).phases[phase] == pytest.approx(measured, rel=rel, abs=1024), (dev, phase)


def test_for_loop_adamw_temporary_matches_the_dry_run():
    """torch's _single_tensor_adam holds sqrt(exp_avg_sq) and its quotient of a parameter at once, beside the
    previous parameter's denominator: here the output head's two and the final norm's one, to the byte."""
    from helpers import estimate

    s = TrainSetup(precision="bf16", adam_impl="for-loop", seq=64)
    e, d = estimate.run(TINY, s), dryrun.run(TINY, s, progress=False)
    m = models.spec(TINY)
    assert e.gpu.breakdown["step"]["temporaries"] == 2 * m.for_loop_adam_params == 2 * (2 * m.largest_tensor_params + 64)
    assert e.gpu.breakdown["step"]["temporaries"] == d.gpu.breakdown["step"]["temporaries"]


def test_zero3_dry_run_is_refused_plainly():
    from helpers.errors import InputError

    with pytest.raises(InputError, match="DeepSpeed cannot run on fake tensors"):
        dryrun.run("llama-3-8b", TrainSetup(strategy="zero3", gpus=8), progress=False)
