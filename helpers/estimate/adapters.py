"""Which weights peft's LoRA adapts in a set-up, as the installed (or given) peft release resolves its targets, and
what adapting an MoE's 3-D experts keeps alive.

On transformers 5, peft converts the transformers 4 names of an MoE architecture whose experts transformers 5 fused
into 3-D parameters (`models.PEFT_MOE_PATTERN`, `models.PEFT_MOE_NAMES`): a target_modules list naming them (w1/w3/w2,
or gate_proj/up_proj/down_proj, and the router's gate) targets the experts' 3-D weights and the router instead, from
peft 0.19.0 (the versioned rule 'peft_moe_names_converted'); target_modules="all-linear" does so from 0.20.0
('peft_moe_experts_adapted'), and fails in 0.19.x (the string is split into characters). axolotl's
lora_target_linear and LLaMA-Factory's lora_target: all hand peft a list of every linear module's name
(`models.LINEAR_NAMES`): no router or fused expert, but a DeepSeek dense MLP's gate_proj/up_proj/down_proj, which peft
converts. Checked against peft 0.19.1 and 0.21.2 themselves on tiny Mixtral, Qwen3-MoE and DeepSeek-V2 models
(tests/test_lora_moe_experts.py).

The experts are adapted through peft's ParamWrapper (peft 0.21 tuners/lora/layer.py): its forward registers a
parametrization that returns the weight plus its adapters' product (`get_delta_weight`: B @ A per expert, cast to the
weight's dtype), so every forward of an MoE layer computes each adapted expert weight merged with its delta, a tensor
as large as the weight, and grouped_mm saves it (and now its input) for backward, where the merged weight's gradient
is computed in full before the adapters' own. Seen in dry runs of Mixtral-8x7B with LoRA r16 on all-linear
(transformers 5.23, peft 0.21.2): 87.6 GiB of activations at sequence 256, 2.6 GiB of them per layer the two merged
expert weights.
"""

from __future__ import annotations

from helpers import versions
from helpers.errors import InputError
from helpers.models import LINEAR_NAMES, ModelSpec, Tensor


def converted(m: ModelSpec, setup) -> bool:
    """peft converts the set-up's targets on this MoE architecture: a list naming the experts' transformers 4 names
    at peft 0.19.0 on, "all-linear" at 0.20.0 on."""
    if not (setup.lora_rank and m.peft_named(setup.lora_targets)):
        return False
    rule = "peft_moe_experts_adapted" if setup.lora_targets == "all-linear" else "peft_moe_names_converted"
    return not versions.older(setup, rule)



def trained_params(m: ModelSpec, setup) -> int:
    """Parameters the optimizer updates: the adapters' (as peft converts the targets) with LoRA, else the model's."""
    return m.lora_params(setup.lora_rank, setup.lora_targets, converted(m, setup)) if setup.lora_rank else m.params

def targets(m: ModelSpec, setup) -> tuple[Tensor, ...]:
    """The weights the set-up's LoRA adapts (`ModelSpec.lora_targets`, converted where peft converts them)."""
    return m.lora_targets(setup.lora_targets, converted(m, setup))


def experts_adapted(m: ModelSpec, setup) -> bool:
    """Some of the MoE's 3-D expert weights are adapted (through ParamWrapper)."""
    return converted(m, setup) and any(t.ndim == 3 for t in targets(m, setup))


def check_fsdp1(m: ModelSpec, setup) -> None:
    """InputError for LoRA on an MoE's 3-D experts under FSDP1: peft's ParamWrapper merges each expert weight, a view
    of FSDP1's flat parameter, with its delta in place, and autograd stops it ("Output 0 of View is a view and its base
    or another view of its base has been modified inplace"; torch 2.13 FSDP1 on gloo with peft 0.21.2 training a tiny
    Mixtral, and its dry run alike). A run that fails before its first step has no memory to estimate."""
    if setup.lora_rank and setup.strat.engine == "fsdp1" and experts_adapted(m, setup):
        raise InputError(f"LoRA on {m.name}'s MoE experts under strategy 'fsdp1' fails before it trains: peft's "
                         f"ParamWrapper merges each expert weight, a view of FSDP1's flat parameter, in place and "
                         f"autograd refuses it (seen on torch 2.13 with peft 0.21.2); use strategy fsdp2, or "
                         f"lora_targets without the experts (e.g. q_proj,k_proj,v_proj,o_proj)")


def check(m: ModelSpec, setup) -> None:
    """InputError where peft itself refuses the set-up: ParamWrapper raises for lora_dropout != 0; a list naming one
    of the two names fused into gate_up_proj without the other; "all-linear" on peft 0.19.x; a list whose only
    targets are transformers 4 names a peft before 0.19 finds no module for; LoRA on the experts under FSDP1
    (`check_fsdp1`)."""
    check_fsdp1(m, setup)
    if not setup.lora_rank or not m.peft_named(setup.lora_targets):
        return
    peft = versions.of(setup, "peft")[0]
    named = m.peft_named(setup.lora_targets)
    if setup.lora_targets == "all-linear" and versions.older(setup, "peft_moe_experts_adapted") and \
            not versions.older(setup, "peft_moe_names_converted"):
        raise InputError(
            f"lora_targets 'all-linear' on {m.name} with peft {peft}: peft 0.19.x converts this MoE's target names "
            f"for transformers 5 but splits the string 'all-linear' into characters, and get_peft_model fails "
            f"('Target modules {{'l', 'r', ...}} not found'; fixed in 0.20.0, PR #3232); name the modules (e.g. "
            f"q,k,v,o) or give a peft of 0.20.0 or later")
    if not converted(m, setup):
        if setup.lora_targets not in ("all-linear", LINEAR_NAMES) and not (
                m.lora_names(setup.lora_targets) & set(m.linear_names())):
            raise InputError(
                f"lora_targets {setup.lora_targets!r} on {m.name} with peft {peft}: {', '.join(sorted(named))} are "
                f"transformers 4 names of its experts, which peft converts only from 0.19.0; before it they match "
                f"no module and get_peft_model fails; name its linear modules ({', '.join(m.linear_names())})")
        return
    fused = set(m.peft_fused_names())
    if 0 < len(named & fused) < len(fused):
        raise InputError(
            f"lora_targets {setup.lora_targets!r} on {m.name}: peft {peft} refuses {', '.join(sorted(named & fused))} "
            f"without {', '.join(sorted(fused - named))}, both fused into the experts' gate_up_proj "
            f"(transformers_weight_conversion.py: 'Cannot convert PEFT target(s)'); name both or neither")
    if setup.lora_dropout and any(not t.linear for t in targets(m, setup)):     # the experts or the router
        raise InputError(
            f"lora_dropout {setup.lora_dropout} with lora_targets {_shown(setup.lora_targets)} on {m.name}: peft "
            f"{peft} adapts its experts' 3-D weights or its router there (ParamWrapper), which refuses "
            f"lora_dropout != 0 (peft tuners/lora/layer.py: 'does not work with lora_dropout != 0'); give "
            f"lora_dropout 0, or name only "
            f"linear modules without {', '.join(sorted(named))} (e.g. q,k,v,o)"
            + ("" if setup.lora_targets != "all-linear" else ", or a peft before 0.19 (versions peft=0.18.1)"))


def _shown(targets: str) -> str:
    return ("every linear module's name (axolotl's lora_target_linear, LLaMA-Factory's lora_target: all)"
            if targets == LINEAR_NAMES else repr(targets))


def merged_expert_bytes(m: ModelSpec, setup, weight_bytes: int) -> tuple[int, int, set[str]]:
    """(bytes of one MoE layer's merged expert weights, bytes of the larger of: the first weight's gradient beside
    both merged weights, and the second's beside its own, the names of the adapted expert weights) with
    `weight_bytes` per element. Backward reaches the down projection first: its merged weight's gradient (grouped_mm)
    comes while both merged weights are kept; gate_up's comes after down's merged weight is freed (dry runs of
    Mixtral-8x7B: peak at down's, 3.5 GiB). Where only one of them is adapted, its merged weight and its gradient."""
    adapted = {t.name.rsplit(".", 1)[-1] for t in targets(m, setup) if t.ndim == 3}
    layer = min(g for g in {t.group for t in m.tensors if t.ndim == 3})
    weights = {t.name.rsplit(".", 1)[-1]: t.numel * weight_bytes for t in m.tensors if t.group == layer and t.ndim == 3
               and t.name.rsplit(".", 1)[-1] in adapted}
    merged = sum(weights.values())
    down = weights.get("down_proj", 0)
    up = merged - down
    extra = max(down, up - down)                          # so that merged + extra = max(up + 2 down, 2 up)
    return merged, extra, adapted
