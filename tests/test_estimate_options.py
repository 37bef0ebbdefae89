"""Every option's effect on the estimate, checked against exact byte counts where the arithmetic is exact."""

import math

import pytest

from helpers import deepspeed_rules, estimate, models
from helpers.training import TrainSetup
from helpers.units import GiB, next_power_of_2

M = "llama-3-8b"
P = 8_030_261_248


def cat(r, device, phase, category):
    return r.device(device).breakdown[phase][category]


def test_zero2_model_states_are_exact(case1):
    r = estimate.run(M, case1)
    assert cat(r, "gpu", "setup", "parameters") == 2 * P
    assert cat(r, "gpu", "setup", "master_weights") == 4 * P
    # at the step: the fp32 copy made for Adam, the bf16 partition and its flattened copy (DeepSpeed 0.19.8, measured)
    assert cat(r, "gpu", "step", "gradients") == 4 * P + 2 * P + 2 * P
    assert cat(r, "gpu", "step", "optimizer_states") == 8 * P
    assert cat(r, "gpu", "setup", "optimizer_states") == 0           # Adam states are created at the first step


@pytest.mark.parametrize("precision,param_bytes,state_bytes", [("bf16", 2, 2), ("bf16-mixed", 4, 4), ("fp32", 4, 4)])
def test_precision_bytes_per_param_single(precision, param_bytes, state_bytes):
    r = estimate.run(M, TrainSetup(precision=precision, adam_impl="fused", seq=128))
    assert cat(r, "gpu", "setup", "parameters") == param_bytes * P
    assert cat(r, "gpu", "step", "gradients") == param_bytes * P
    assert cat(r, "gpu", "step", "optimizer_states") == 2 * state_bytes * P


def test_mixed_precision_is_16_bytes_per_param_before_activations():
    r = estimate.run(M, TrainSetup(precision="bf16-mixed", adam_impl="fused", seq=128))
    b = r.gpu.breakdown["step"]
    assert b["parameters"] + b["gradients"] + b["optimizer_states"] == 16 * P


def test_adam_impl_temporaries():
    peak = {i: estimate.run(M, TrainSetup(precision="bf16", adam_impl=i, seq=128)).gpu.phases["step"]
            for i in ("foreach", "fused", "for-loop")}
    assert peak["foreach"] - peak["fused"] == 2 * P                    # one full bf16 copy
    # a tensor's sqrt and quotient beside the previous tensor's denominator, bf16 (Llama 3 8B: the output head's two
    # beside the final norm's one)
    m = models.spec(M)
    assert peak["for-loop"] - peak["fused"] == 2 * m.for_loop_adam_params
    assert m.for_loop_adam_params == 2 * m.largest_tensor_params + 4096
    assert estimate.run(M, TrainSetup(precision="bf16", adam_impl="fused", seq=128)).gpu.peak_bytes == \
        pytest.approx(59.86 * GiB, rel=0.01)     # torch's MemTracker on the fake-tensor step (`python -m helpers.bench dryrun`)


def test_strategies_shard_as_documented():
    base = TrainSetup(gpus=8, seq=1024, grad_checkpointing=True)
    peak = {s: estimate.run(M, base.replace(strategy=s)).gpu.peak_bytes for s in ("ddp", "zero1", "zero2", "zero3")}
    assert peak["ddp"] > peak["zero1"] > peak["zero2"] > peak["zero3"]
    ddp = estimate.run(M, base.replace(strategy="ddp"))
    assert cat(ddp, "gpu", "setup", "comm_buffers") == 4 * P          # DDP buckets = one more gradient copy


def test_more_gpus_less_per_gpu_for_sharded_strategies():
    for s in ("zero3", "fsdp2"):
        a = estimate.run(M, TrainSetup(strategy=s, gpus=2, seq=512)).gpu.peak_bytes
        b = estimate.run(M, TrainSetup(strategy=s, gpus=8, seq=512)).gpu.peak_bytes
        assert b < a


def test_host_is_per_node():
    base = TrainSetup(strategy="zero2", gpus=16, seq=512, offload_optimizer=True, pin_memory=False)
    h8 = estimate.run(M, base.replace(gpus_per_node=8)).host.peak_bytes
    h4 = estimate.run(M, base.replace(gpus_per_node=4)).host.peak_bytes
    assert h8 == 2 * h4
    r = estimate.run(M, base.replace(gpus_per_node=8))
    states = sum(r.host.breakdown["step"][c] for c in ("master_weights", "gradients", "optimizer_states"))
    assert states == 8 * math.ceil(P / 16) * 16                         # master 4 + fp32 grad 4 + Adam 8, x 8 ranks


def test_offload_moves_states_to_host():
    base = TrainSetup(strategy="zero3", gpus=8, seq=512)
    none = estimate.run(M, base)
    opt = estimate.run(M, base.replace(offload_optimizer=True))
    both = estimate.run(M, base.replace(offload_optimizer=True, offload_params=True))
    assert none.gpu.peak_bytes > opt.gpu.peak_bytes > both.gpu.peak_bytes
    assert none.host.peak_bytes < opt.host.peak_bytes < both.host.peak_bytes
    assert cat(opt, "gpu", "step", "optimizer_states") == 0


def test_ratio_keeps_first_sub_groups_on_gpu():
    s = TrainSetup(strategy="zero3", gpus=8, seq=512, offload_optimizer=True, sub_group_size=100_000_000)
    groups = deepspeed_rules.zero3_sub_groups(models.spec(M), s)
    assert sum(groups) == sum(math.ceil(t.numel / 8) for t in models.spec(M).tensors)
    on_gpu = sum(groups[: int((1 - 0.5) * len(groups))])
    r = estimate.run(M, s.replace(offload_ratio=0.5))
    assert cat(r, "gpu", "step", "optimizer_states") == 8 * on_gpu
    hosts = [estimate.run(M, s.replace(offload_ratio=x / 20)).host.peak_bytes for x in range(21)]
    assert hosts == sorted(hosts) and len(set(hosts)) < len(hosts)    # rises with the ratio, in steps


def test_pinned_rounding_is_powers_of_two():
    s = TrainSetup(strategy="fsdp2", gpus=2, gpus_per_node=2, seq=512, offload_optimizer=True, offload_params=True)
    pinned, pageable = estimate.run(M, s, lifecycle=False), estimate.run(M, s.replace(pin_memory=False), lifecycle=False)
    shards = [math.ceil(t.numel / 2) * 4 for t in models.spec(M).tensors]
    rounding = sum(next_power_of_2(b) - b for b in shards)
    assert cat(pinned, "host", "setup", "pinned_overhead") == 2 * rounding          # params, 2 ranks
    assert cat(pinned, "host", "step", "pinned_overhead") == 2 * 2 * rounding       # + grads
    assert pinned.host.peak_bytes - pageable.host.peak_bytes == 2 * 2 * rounding
    assert pinned.gpu.phases == pageable.gpu.phases


def test_checkpointing_and_fused_ce_and_attention():
    base = TrainSetup(batch=2, seq=4096, precision="bf16", adam_impl="fused")
    act = lambda r: cat(r, "gpu", "forward", "activations")
    assert act(estimate.run(M, base.replace(grad_checkpointing=True))) < act(estimate.run(M, base)) / 5
    logits = lambda r: cat(r, "gpu", "backward", "logits")
    assert logits(estimate.run(M, base.replace(fused_ce=True))) < logits(estimate.run(M, base)) / 5
    E = 2 * 4096 * 128256
    assert logits(estimate.run(M, base)) == 12 * E       # log_softmax out, its grad, the logits fp32 grad (dry run agrees)
    eager, sdpa, flash = (estimate.run(M, base.replace(attention=a)) for a in ("eager", "sdpa", "flash"))
    assert act(eager) - act(sdpa) > 32 * 2 * 32 * 4096 * 4096 * 6 * 0.9   # fp32 + bf16 score matrices, 32 layers
    assert act(sdpa) == act(flash)


def test_activations_scale_linearly_with_batch_but_the_rotary_tables():
    # the rotary cos/sin are made for position_ids of batch 1 (transformers: cache_position.unsqueeze(0))
    one, four = (estimate.run(M, TrainSetup(batch=b, seq=1024)) for b in (1, 4))
    rope = one.item_bytes("rotary cos and sin")
    assert rope > 0 and four.item_bytes("rotary cos and sin") == rope
    assert four.gpu.breakdown["forward"]["activations"] - rope == 4 * (one.gpu.breakdown["forward"]["activations"] - rope)


def test_capacities_give_the_verdict(case1):
    assert estimate.run(M, case1.replace(gpu_gib=200)).oom == {"device": None, "phase": None}
    assert estimate.run(M, case1.replace(gpu_gib=10)).oom == {"device": "gpu", "phase": "setup"}
    off = case1.replace(offload_optimizer=True, host_gib=50)
    assert estimate.run(M, off).oom == {"device": "host", "phase": "setup"}


def test_resume_adds_a_phase():
    s = TrainSetup(strategy="zero2", seq=512, offload_optimizer=True)
    assert "resume" not in estimate.run(M, s).host.phases
    r = estimate.run(M, s.replace(resume=True))
    assert list(r.host.phases) == ["setup", "resume", "forward", "backward", "step", "steady"]
    assert cat(r, "host", "resume", "checkpoint") == 12 * P


def test_resume_loads_the_optimizer_shard_each_rank_holds():
    """The checkpoint a rank loads is its optimizer states: under FSDP2 with TP, 1/(dp x cp) of its TP shard (`m` is
    the TP rank's share already). Before the degrees object it was 1/gpus of the TP shard: half the states at TP 2."""
    for tp in (1, 2):
        r = estimate.run("qwen2.5-7b", TrainSetup(strategy="fsdp2", gpus=8, tensor_parallel=tp, seq=512, resume=True))
        states_ = sum(i["bytes"] for i in r.items if i["category"] == "optimizer_states" and i["device"] == "gpu")
        assert cat(r, "host", "resume", "checkpoint") == states_ * 8, tp          # 8 ranks on the node


def test_second_iteration_can_be_the_peak():
    r = estimate.run(M, TrainSetup(batch=8, seq=4096, precision="bf16", adam_impl="fused"))
    assert r.gpu.peak_phase == "steady"      # activations of iteration 2 sit on top of Adam's states
