"""The catalogue by hub id, every MoE family and Gemma-style configs, in estimate, dry run and scaled run; and the
fake GPU's fused kernels (an op CUDA runs whole must reach fake mode whole)."""

import pytest
import torch

from helpers import estimate, models
from helpers.errors import InputError
from helpers.measure import dryrun, fakegpu, scaled
from helpers.training import TrainSetup

MOE = ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v3")
GEMMA = ("gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b")


def test_every_catalogue_model_has_hub_ids_and_a_source():
    src = models.sources()
    assert sorted(src) == models.catalogue()
    for name, entry in src.items():
        assert entry["hub_ids"] and entry["source"].startswith(f"https://huggingface.co/{entry['hub_ids'][0]}/")
    own = {h.lower() for e in src.values() for h in e["hub_ids"]}
    assert len(own) == sum(len(e["hub_ids"]) for e in src.values())                   # no id names two models
    mirrors = models.mirrors()                       # unsloth's 16-bit re-uploads, each of one original of ours
    assert set(mirrors.values()) <= own and not set(mirrors) & own
    assert len(models.hub_ids()) == len(own) + len(mirrors)


@pytest.mark.parametrize("hub,name", [("Qwen/Qwen3-4B", "qwen3-4b"), ("qwen/qwen3-4b", "qwen3-4b"),
                                      ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
                                      ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b")])
def test_a_hub_id_names_its_catalogue_model(hub, name):
    assert models.spec(hub).name == name
    assert models.spec(hub).params == models.spec(name).params


def test_an_unknown_hub_id_says_to_pass_the_config():
    with pytest.raises(InputError, match=r"unknown hub id 'acme/Nonexistent-7B'.*pass its path") as e:
        models.spec("acme/Nonexistent-7B")
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


# Total parameters as the model cards state them (to within one unit of the last digit they print: Qwen2.5-7B's card
# says 7.61B for 7.6156e9), checked against the inventory transformers builds from the shipped config: a typo in a
# transcribed dimension shows here.
@pytest.mark.parametrize("name,billions,digits", [
    ("qwen2.5-0.5b", 0.49, 2), ("qwen2.5-1.5b", 1.54, 2), ("qwen2.5-3b", 3.09, 2), ("qwen2.5-7b", 7.61, 2),
    ("qwen2.5-14b", 14.7, 1), ("qwen3-0.6b", 0.6, 1), ("qwen3-1.7b", 1.7, 1), ("qwen3-4b", 4.0, 1),
    ("qwen3-8b", 8.2, 1), ("qwen3-14b", 14.8, 1), ("qwen3-32b", 32.8, 1), ("qwen3-30b-a3b", 30.5, 1),
    ("mixtral-8x7b", 46.7, 1), ("qwen1.5-moe-a2.7b", 14.3, 1), ("deepseek-v3", 671, 0), ("llama-3.1-70b", 70.6, 1),
])
def test_totals_match_the_model_cards(name, billions, digits):
    assert abs(models.spec(name).params / 1e9 - billions) <= 10**-digits


def test_active_parameters_of_qwen3_30b_a3b():
    """Its card says 3.3B activated: total minus the routed experts a token does not visit."""
    m = models.spec("qwen3-30b-a3b")
    per_expert = 3 * m.hidden * m.expert_width
    assert abs((m.params - m.moe_layers * (m.experts - m.experts_active) * per_expert) / 1e9 - 3.3) <= 0.1   # 3.35


@pytest.mark.parametrize("name,dims", [
    ("mixtral-8x7b", (32, 8, 2, 14336, 0)),                  # num_local_experts; experts as wide as intermediate_size
    ("qwen1.5-moe-a2.7b", (24, 60, 4, 1408, 5632)),          # num_experts; one shared expert, its own width
    ("qwen3-30b-a3b", (48, 128, 8, 768, 0)),                 # num_experts
    ("deepseek-v2-lite", (26, 64, 6, 1408, 2 * 1408)),       # n_routed_experts; first layer dense; 2 shared
    ("deepseek-v3", (58, 256, 8, 2048, 2048)),               # first 3 layers dense; 1 shared
])
def test_each_moe_family_is_recognised_from_its_keys(name, dims):
    m = models.spec(name)
    assert (m.moe_layers, m.experts, m.experts_active, m.expert_width, m.shared_width) == dims


@pytest.mark.parametrize("name", MOE)
def test_a_moe_twin_is_small_and_keeps_the_active_share(name):
    full, twin = models.spec(name), models.spec(str(models.scaled_path(name)))
    assert twin.moe_layers >= 1 and twin.params < 8e6
    assert twin.experts_active / twin.experts == pytest.approx(full.experts_active / full.experts, rel=0.05)
    assert twin.expert_width / twin.hidden == pytest.approx(full.expert_width / full.hidden, rel=0.1)


@pytest.mark.parametrize("name", GEMMA)
def test_a_gemma_twin_keeps_head_dim_apart_from_hidden_over_heads(name):
    full, twin = models.spec(name), models.spec(str(models.scaled_path(name)))
    assert full.head_dim * full.heads != full.hidden
    assert twin.q_width / twin.hidden == pytest.approx(full.q_width / full.hidden, rel=0.1)
    assert twin.norms == full.norms == 4 and twin.gemma_norm


def agree(e, d, rel=0.03):
    for dev in ("gpu", "host"):
        for phase, measured in d.device(dev).phases.items():
            assert e.device(dev).phases[phase] == pytest.approx(measured, rel=rel, abs=16 * 2**20), (dev, phase)


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed", "fp32"])
def test_deepseek_v2_lite_dry_run_at_every_precision(precision):
    s = TrainSetup(precision=precision, adam_impl="fused", seq=256)
    agree(estimate.run("deepseek-v2-lite", s, lifecycle=False), dryrun.run("deepseek-v2-lite", s, progress=False))


@pytest.mark.parametrize("name,precision", [("mixtral-8x7b", "bf16-mixed"), ("qwen1.5-moe-a2.7b", "bf16"),
                                            ("qwen3-30b-a3b", "fp32"), ("gemma-2-2b", "bf16"),
                                            ("gemma-3-1b", "bf16-mixed"), ("phi-3-mini", "fp32")])
def test_moe_gemma_and_phi_dry_runs_agree_with_the_estimate(name, precision):
    s = TrainSetup(precision=precision, adam_impl="fused", seq=256)
    agree(estimate.run(name, s, lifecycle=False), dryrun.run(name, s, progress=False))


@pytest.mark.parametrize("name", ["qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "gemma-2-2b", "gemma-3-1b"])
def test_moe_and_gemma_scaled_runs_agree_with_the_estimate(name):
    setup = TrainSetup(precision="bf16", batch=2, seq=128)
    r = scaled.run(name, setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup(name, setup)
    agree(estimate.run(str(twin), s, lifecycle=False), r)
    assert r.meta["losses"][-1] < r.meta["losses"][0]


def test_silu_backward_reaches_fake_mode_whole():
    """CUDA runs silu_backward as one kernel; without a kernel of its own the fake GPU would decompose it (a sigmoid
    and 1 - sigmoid of the input's size alive inside the op)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 8, device=fakegpu.device(), requires_grad=True)
        y = torch.nn.functional.silu(x).sum()
        with Ops():
            y.backward()
    assert "aten.silu_backward" in seen and "aten.sigmoid" not in seen
    assert set(fakegpu.FUSED_ON_CUDA) <= {s.removeprefix("aten.") for s in seen}
