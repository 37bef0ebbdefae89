"""Which weights peft's LoRA adapts in a set-up, as the installed (or given) peft release resolves its targets, and
what adapting an MoE's 3-D experts keeps alive.

peft 0.20.0 and later, on transformers 5, resolve target_modules="all-linear" on an MoE architecture whose experts
transformers 5 fused into 3-D parameters to the experts and the router as well (`models.PEFT_MOE_PATTERN`; the
versioned rule 'peft_moe_experts_adapted'). Those are adapted through peft's ParamWrapper (peft 0.21
tuners/lora/layer.py): its forward registers a parametrization that returns the weight plus its adapters' product
(`get_delta_weight`: B @ A per expert, cast to the weight's dtype), so every forward of an MoE layer computes each
expert weight merged with its delta, a tensor as large as the weight, and grouped_mm saves it (and now its input) for
backward, where the merged weight's gradient is computed in full before the adapters' own. Seen in dry runs of
Mixtral-8x7B with LoRA r16 on all-linear (transformers 5.23, peft 0.21.2): 87.6 GiB of activations at sequence 256,
2.6 GiB of them per layer the two merged expert weights.
"""

from __future__ import annotations

from helpers import versions
from helpers.errors import InputError
from helpers.models import ModelSpec, Tensor


def experts_adapted(m: ModelSpec, setup) -> bool:
    """LoRA on "all-linear" of an MoE architecture peft converts, at a peft that converts it (0.20.0 on)."""
    return bool(setup.lora_rank and setup.lora_targets == "all-linear" and m.peft_expert_names()
                and not versions.older(setup, "peft_moe_experts_adapted"))


def targets(m: ModelSpec, setup) -> tuple[Tensor, ...]:
    """The weights the set-up's LoRA adapts (`ModelSpec.lora_targets` with the experts where peft adds them)."""
    return m.lora_targets(setup.lora_targets, experts_adapted(m, setup))


def check(m: ModelSpec, setup) -> None:
    """InputError where peft itself refuses the set-up: ParamWrapper raises for lora_dropout != 0."""
    if setup.lora_dropout and experts_adapted(m, setup):
        raise InputError(
            f"lora_dropout {setup.lora_dropout} with lora_targets 'all-linear' on {m.name}: peft "
            f"{versions.of(setup, 'peft')[0]} adapts its experts' 3-D weights there (ParamWrapper), which refuses "
            f"lora_dropout != 0 (peft tuners/lora/layer.py: 'does not work with lora_dropout != 0'); give lora_dropout "
            f"0, name the linear modules (e.g. q,k,v,o), or a peft before 0.20 (versions peft=0.18.1)")


def merged_expert_bytes(m: ModelSpec, weight_bytes: int) -> tuple[int, int]:
    """(bytes of one MoE layer's merged expert weights, bytes of the larger of: the first weight's gradient beside
    both merged weights, and the second's beside its own) with `weight_bytes` per element. Backward reaches the down
    projection first: its merged weight's gradient (grouped_mm) comes while both merged weights are kept; gate_up's
    comes after down's merged weight is freed (dry runs of Mixtral-8x7B: peak at down's, 3.5 GiB)."""
    layer = min(g for g in {t.group for t in m.tensors if t.ndim == 3})
    weights = {t.name.rsplit(".", 1)[-1]: t.numel * weight_bytes for t in m.tensors if t.group == layer and t.ndim == 3}
    merged = sum(weights.values())
    down = weights.get("down_proj", 0)
    up = merged - down
    extra = max(down, up - down)                          # so that merged + extra = max(up + 2 down, 2 up)
    return merged, extra
