"""Library versions as part of a set-up: the rules that changed across releases, keyed by the release that changed
them.

A set-up's `versions` ("bitsandbytes=0.42.0") names the releases a run used; a library it does not name is taken at
the release installed here (`importlib.metadata`). Each Rule names its library, the first release with the new
behaviour (`changed_in`), what the releases before it do, and the source that says so; the estimator, the dry run and
the report ask `older(setup, key)` and list the rules that bore on the set-up (`applied`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from packaging.version import InvalidVersion, Version

from helpers.errors import InputError


@dataclass(frozen=True)
class Rule:
    key: str
    library: str
    changed_in: str
    """The first release with the new behaviour."""
    before: str
    """What the releases before `changed_in` do."""
    since: str
    """What `changed_in` and later releases do."""
    source: str
    bears: object
    """A test on a TrainSetup: whether the rule can change its figures (the 4-bit rule only with a 4-bit base)."""
    bears_model: object = None
    """A test on the model (a ModelSpec) and the set-up, where the rule bears only on some architectures; None: on
    every one."""


RULES = (
    Rule("bnb_4bit_input_kept", "bitsandbytes", "0.43.2",
         "MatMul4Bit keeps each 4-bit linear's input (ctx.tensors = (A, B)), a ctx attribute that backward never "
         "frees: it lives as long as the autograd graph",
         "MatMul4Bit keeps only the 4-bit weight (ctx.tensors = (None, B))",
         "bitsandbytes commit 9e75374 (PR #1270, 'fix QLoRA mem bug: delete useless buffered activation', "
         "2024-07-16), first released in 0.43.2; autograd/_functions.py MatMul4Bit.forward",
         lambda s: s.quantized),
    Rule("causal_lm_loss_copies_logits", "transformers", "4.49.0",
         "the causal-LM loss shifts the fp32 logits by one token with logits[..., :-1, :].contiguous(): one more fp32 "
         "copy of the logits while the loss runs",
         "the loss shifts the labels instead (padded by one): no copy of the logits",
         "transformers 4.48.0 loss/loss_utils.py ForCausalLMLoss (and before 4.46 LlamaForCausalLM.forward itself); "
         "4.49.0 pads and shifts the labels (PR #35646, 'remove unnecessary contiguous() call')",
         lambda s: not s.fused_ce and s.run != "rm"),
    Rule("checkpointing_reentrant", "transformers", "5.0.0",
         "gradient checkpointing defaults to use_reentrant=True: a checkpointed layer's forward runs without autograd "
         "and its recomputation in backward with it",
         "gradient checkpointing defaults to use_reentrant=False",
         "transformers 4.57.0 modeling_utils.py gradient_checkpointing_enable ({'use_reentrant': True} when no kwargs "
         "are given); 5.0.0 gives {'use_reentrant': False} (PR #43203)",
         lambda s: s.checkpointing == "full"),
    Rule("moe_experts_fused", "transformers", "5.0.0",
         "each routed expert is its own nn.Linear modules (not modelled here: estimate with transformers 5)",
         "the routed experts are fused into 3-D parameters (gate_up_proj, down_proj), not nn.Linear: bitsandbytes' "
         "4-bit loading leaves them in the compute dtype, and LoRA reaches them only through peft's conversion",
         "transformers 5.0.0 models/mixtral/modeling_mixtral.py MixtralExperts ('expert weights stored as 3D "
         "tensors') and conversion_mapping.py; integrations/bitsandbytes.py replaces nn.Linear only (5.0.0 to "
         "5.23.0; a tiny Mixtral loaded in 4 bits keeps its experts in bf16)",
         lambda s: bool(s.lora_rank),
         lambda m, s: bool(m.moe_layers) and any(t.ndim == 3 for t in m.tensors)),
    Rule("foreach_adamw_two_lists", "torch", "2.1.0",
         "torch AdamW's foreach step holds two temporaries the size of what one step updates at once: "
         "exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), then denom = torch._foreach_add(exp_avg_sq_sqrt, eps), "
         "a new list beside it",
         "torch AdamW's foreach step holds one temporary list the size of what one step updates: the square roots, "
         "divided by their bias correction and eps added in place (torch._foreach_add_), are the denominator",
         "torch 2.0.1 torch/optim/adamw.py _multi_tensor_adamw, lines 564-568 (denom = "
         "torch._foreach_add(exp_avg_sq_sqrt, eps)); 2.1.0 adds eps in place (lines 599-603; PR #104898, "
         "'[foreach][AdamW] Minimize intermediates to save peak memory', with #104780 for Adam); measured with the "
         "real wheels on this CPU: data/results/torch_foreach_adamw_versions.json",
         lambda s: s.adam == "foreach"),
    Rule("logits_upcast_in_forward", "transformers", "4.46.0",
         "the model's forward upcasts its logits to fp32 (logits = logits.float()) and returns those: the bf16 "
         "logits are freed at once",
         "the model returns its logits in the compute dtype and the loss upcasts a copy",
         "transformers 4.45.0 models/llama/modeling_llama.py LlamaForCausalLM.forward; 4.46.0 moves the upcast into "
         "loss/loss_utils.py ForCausalLMLoss",
         lambda s: not s.fused_ce and s.precision != "fp32" and s.run != "rm"),
    Rule("peft_moe_names_converted", "peft", "0.19.0",
         "a target_modules list naming the experts' transformers 4 names (w1/w2/w3 or gate_proj/up_proj/down_proj) "
         "adapts only nn.Linear modules of those names: on transformers 5 the routed experts (3-D parameters) stay "
         "frozen",
         "a target_modules list naming the experts' transformers 4 names adapts the routed experts' 3-D weights (and "
         "the router, for 'gate') instead, and no nn.Linear of those names (a dense MLP's or shared expert's): "
         "ParamWrapper merges each expert weight with its adapters' product for every forward",
         "peft 0.19.0 utils/transformers_weight_conversion.py _convert_peft_config_moe (PR #3083); "
         "tuners/lora/layer.py ParamWrapper",
         lambda s: bool(s.lora_rank) and s.lora_targets != "all-linear",
         lambda m, s: bool(m.peft_named(s.lora_targets))),
    Rule("peft_moe_experts_adapted", "peft", "0.20.0",
         "target_modules='all-linear' adapts nn.Linear modules only: on transformers 5 the routed experts (3-D "
         "parameters) and the router stay frozen (peft 0.19.x converted the config too, but split the string into "
         "characters and found no module)",
         "target_modules='all-linear' also adapts the routed experts' 3-D weights and the router (ParamWrapper, by "
         "their transformers 4 names): each expert weight is merged with its adapters' product for every forward",
         "peft 0.20.0 utils/transformers_weight_conversion.py _resolve_string_target_modules (PR #3232, "
         "2026-07-06); tuners/lora/layer.py ParamWrapper",
         lambda s: bool(s.lora_rank) and s.lora_targets == "all-linear",
         lambda m, s: bool(m.peft_expert_names())),
    Rule("trl_chunked_nll", "trl", "1.4.0",
         "SFTConfig has no loss_type 'chunked_nll' (SFTTrainer raises 'Invalid loss_type')",
         "loss_type 'chunked_nll' computes the loss 256 valid tokens at a time, each chunk under non-reentrant "
         "checkpoint (_chunked_cross_entropy_loss)",
         "trl 1.4.0 trainer/sft_trainer.py _patch_chunked_ce_lm_head, _CHUNKED_LM_HEAD_CHUNK_SIZE = 256",
         lambda s: s.trl_loss_type == "chunked_nll"),
    Rule("trl_chunked_nll_default", "trl", "1.7.0",
         "loss_type defaults to 'nll': the model's own loss over the full logits",
         "loss_type left unset is 'chunked_nll' ('nll' with use_liger_kernel)",
         "trl 1.7.0 trainer/sft_config.py __post_init__ (self.loss_type = 'nll' if self.use_liger_kernel else "
         "'chunked_nll'); 1.4.0 to 1.6.x default='nll'",
         lambda s: s.trl_loss_type == "unset" and older(s, "trl_fused_lm_head")),
    Rule("trl_chunk_projects_in_fp32", "trl", "1.13.0",
         "each chunk projects in fp32, h.float() @ w.float().t(): the output head's weight upcast to fp32 in every "
         "chunk's forward and again in its recompute",
         "each chunk projects in the hidden states' dtype, (h @ w.to(h.dtype).t()).float()",
         "trl 1.12.0 and 1.13.0 trainer/sft_trainer.py _chunk",
         lambda s: s.trl_loss_type in ("unset", "chunked_nll") and older(s, "trl_fused_lm_head")),
    Rule("trl_fused_lm_head", "trl", "1.15.0",
         "SFTTrainer computes loss_type 'nll' with the model's own loss (the full logits) and 'chunked_nll' in "
         "256-token chunks",
         "every loss_type goes through add_fused_lm_head: the valid positions' hidden states projected in tiles of "
         "4096 tokens x 32768 vocabulary entries (trl.kernels.ChunkedLogProbFunction); 'chunked_nll' is an alias of "
         "'nll'",
         "trl 1.15.0 trainer/sft_trainer.py (add_fused_lm_head, model(**inputs, fused_lm_head=True)), "
         "trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE = 32768, kernels/chunked_logprob.py TOKEN_CHUNK_SIZE = 4096",
         lambda s: s.trl_loss_type is not None),
)

LIBRARIES = tuple(sorted({r.library for r in RULES}))
ALIASES = {"bnb": "bitsandbytes"}
_BY_KEY = {r.key: r for r in RULES}


def parse(text: str | None) -> dict[str, Version]:
    """'bitsandbytes=0.42.0,...' as {library: Version}; InputError naming the part and what is allowed."""
    if text is None:
        return {}
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"versions must be library=version pairs separated by commas (libraries: "
                         f"{', '.join(LIBRARIES)}), e.g. bitsandbytes=0.42.0, got {text!r}")
    out: dict[str, Version] = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*[=@]=?\s*(\S+)\s*", part)
        if not m:
            raise InputError(f"versions: {part.strip()!r} is not library=version (e.g. bitsandbytes=0.42.0)")
        lib, ver = m.group(1).lower().replace("_", "-"), m.group(2)
        if len(ver) > 64:
            raise InputError(f"versions: {lib}={ver[:40]!r}... ({len(ver):,} characters) is not a release number "
                             f"(e.g. 0.42.0)")
        lib = ALIASES.get(lib, lib)
        if lib not in LIBRARIES:
            raise InputError(f"versions: no rule here depends on the release of {lib}; libraries with versioned "
                             f"rules: {', '.join(LIBRARIES)}")
        if lib in out:
            raise InputError(f"versions: {lib} is given twice")
        try:
            out[lib] = Version(ver)
        except (InvalidVersion, ValueError):     # (ValueError: a number past Python's 4300 digits)
            raise InputError(f"versions: {lib}={ver[:40]!r}{'...' if len(ver) > 40 else ''} is not a release number "
                             f"(e.g. 0.42.0)") from None
    return out


def merged(base: str | None, over: str | None) -> str | None:
    """`base`'s pairs with `over`'s in place of any for the same library (a flag's releases over a file's)."""
    if not base or not over:
        return over or base
    pairs = {**parse(base), **parse(over)}
    return ",".join(f"{lib}={v}" for lib, v in pairs.items())


def installed(library: str) -> Version | None:
    try:
        return Version(version(library))
    except PackageNotFoundError:
        return None


def of(setup, library: str) -> tuple[Version | None, str]:
    """(the release the set-up runs `library` at, where that came from: 'given' or 'installed'); (None, 'not
    installed') when neither says."""
    given = parse(setup.versions).get(library)
    if given is not None:
        return given, "given"
    here = installed(library)
    return (here, "installed") if here is not None else (None, "not installed")


def _before(rule: Rule, v: Version | None) -> bool:
    """Release `v` predates the rule's change (None, a library not installed and not given: the newest behaviour)."""
    return v is not None and v < Version(rule.changed_in)


def older(setup, key: str) -> bool:
    """The set-up's release of the rule's library predates `changed_in`."""
    rule = _BY_KEY[key]
    return _before(rule, of(setup, rule.library)[0])


def applied(setup, model=None) -> list[dict]:
    """The versioned rules that bear on the set-up (of `model`, a ModelSpec, where given): library, release and where it
    came from, and what that release does, with the source."""
    out = []
    for r in RULES:
        if not r.bears(setup) or (model is not None and r.bears_model is not None
                                  and not r.bears_model(model, setup)):
            continue
        v, where = of(setup, r.library)
        old = _before(r, v)
        out.append({"key": r.key, "library": r.library, "version": str(v) if v else None, "from": where,
                    "changed_in": r.changed_in, "older": old, "does": r.before if old else r.since,
                    "source": r.source})
    return out


def line(rule: dict) -> str:
    """One rule as the report prints it."""
    rel = "<" if rule["older"] else ">="
    return (f"{rule['library']} {rule['version'] or '(newest)'} ({rule['from']}) {rel} {rule['changed_in']}: "
            f"{rule['does']}")
