"""The model catalogue: configs by name (data/models/NAME.json) or path, and the parameter inventory of a config.

Nothing is downloaded: a model is a Hugging Face `config.json`; its parameter shapes come from a meta-device build
(no memory is allocated), cached per config file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import InputError
from helpers.files import unusable_name, write_text_atomically

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MODELS_DIR = DATA_DIR / "models"
SCALED_DIR = Path.home() / ".cache" / "oom-casebook" / "scaled"   # the tiny twins' configs (derived, see scaled_config)

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


SOURCES = DATA_DIR / "model_sources.json"    # each catalogue model's hub ids and where its numbers were published
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def catalogue() -> list[str]:
    """Names of the models that ship in data/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


@functools.lru_cache(maxsize=1)
def _sources_file() -> dict:
    return json.loads(SOURCES.read_text())


def sources() -> dict[str, dict]:
    """Per catalogue name: its Hugging Face hub ids and the published config it was written from (model_sources.json)."""
    return _sources_file()["models"]


def mirrors() -> dict[str, str]:
    """Original hub id by the hub id of a 16-bit re-upload under another organisation (model_sources.json "mirrors",
    from unsloth's mapper), both in lower case."""
    return {k.lower(): v.lower() for k, v in _sources_file()["mirrors"]["ids"].items()}


def hub_ids() -> dict[str, str]:
    """Catalogue name by hub id, the id in lower case (the hub treats ids without regard to case); a re-upload listed
    in mirrors() answers to its original's model."""
    own = {hub.lower(): name for name, src in sources().items() for hub in src["hub_ids"]}
    return own | {m: own[o] for m, o in mirrors().items() if o in own}


def hub_id(name: str) -> str | None:
    """The main hub id of a catalogue name (None for a config given by path)."""
    src = sources().get(name)
    return src["hub_ids"][0] if src else None


@functools.lru_cache(maxsize=None)
def tower_params(name: str) -> int | None:
    """Parameters outside the language model (vision tower and projector) of the multimodal checkpoint a catalogue
    text model was taken from, counted on transformers' own class built on the meta device from the checkpoint's
    published vision_config (model_sources.json "multimodal"); None for a text-only checkpoint."""
    mm = sources().get(name, {}).get("multimodal")
    if not mm:
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    text = read_config_dict(name)
    cfg = AutoConfig.for_model(text["model_type"].removesuffix("_text"), text_config=text,
                               vision_config=mm["vision_config"], mm_tokens_per_image=mm["mm_tokens_per_image"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for n, p in model.named_parameters() if ".language_model." not in f".{n}"
               and not n.startswith("lm_head."))


def tower_note(named: str | None) -> str | None:
    """What the estimate leaves out when a hub id names a multimodal checkpoint whose language model is a catalogue
    model (e.g. google/gemma-3-4b-it): its vision tower, loaded by AutoModelForCausalLM all the same."""
    name = hub_ids().get(str(named or "").lower())
    towers = tower_params(name) if name else None
    if not towers:
        return None
    import transformers

    cls = sources()[name]["multimodal"]["class"]
    return (f"{named} is a multimodal checkpoint: transformers {transformers.__version__}'s AutoModelForCausalLM loads "
            f"it as {cls}, with a vision tower and projector of {towers / 1e9:.2f} B parameters that the estimate "
            f"(catalogue model {name}, its language model) does not count: the real figure is higher by their "
            f"weights, and by their gradients and optimizer states where they are trained")


def quantization_note(model, base_weights: str | None) -> str | None:
    """A config.json with a quantization_config (a pre-quantised upload such as unsloth's -bnb-4bit) estimated
    without a quantised base: what its weights really are, and the flag that says so."""
    try:
        q = read_config_dict(model).get("quantization_config")
    except InputError:
        return None
    if not isinstance(q, dict) or base_weights is not None:
        return None
    method = q.get("quant_method", "?")
    if method == "bitsandbytes" and q.get("load_in_4bit"):
        flag = "nf4-dq" if q.get("bnb_4bit_use_double_quant") else "nf4"
        how = (f"bitsandbytes 4-bit {q.get('bnb_4bit_quant_type', 'nf4')}: pass --base-weights {flag} to estimate it "
               f"so, with --lora-rank R: transformers trains a quantised model only through adapters")
    else:
        how = f"quant_method {method!r}, which this package does not model"
    return (f"the checkpoint is pre-quantised (its config.json's quantization_config: {how}); estimated with "
            f"16-bit weights, so the real figure is lower")


def hub_repo_of(path: str | Path) -> str | None:
    """The hub id of a config.json inside a Hugging Face cache (.../models--ORG--NAME/snapshots/REV/config.json),
    else None."""
    parts = Path(path).parts
    if len(parts) >= 4 and parts[-3] == "snapshots" and parts[-4].startswith("models--"):
        return parts[-4][len("models--"):].replace("--", "/")
    return None


def same_shapes_as(model: str | Path | ModelSpec) -> str | None:
    """The catalogue model whose every parameter has the same name and shape, and the same traits, as `model`'s (a mirror, a fine-tune or
    an instruct variant of it), None if there is none or `model` is itself in the catalogue."""
    m = spec(model)
    if m.name in catalogue():
        return None
    bare = lambda x: dataclasses.replace(x, name="", path="")  # noqa: E731  (shapes, tying, the family's traits)
    mine = bare(m)
    return next((name for name in catalogue() if bare(spec(name)) == mine), None)


def config_path(model: str | Path) -> Path:
    """The config file for a catalogue name or a path to a config.json; InputError if there is none."""
    if not isinstance(model, (str, Path)):
        raise InputError(f"model must be a catalogue name ({', '.join(catalogue())}) or the path of a config.json, "
                         f"got {type(model).__name__} {model!r}")
    if not str(model).strip():
        raise InputError("model is empty: give a catalogue name (e.g. llama-3.2-1b), a hub id or the path of a "
                         "config.json")
    if str(model) in catalogue():
        return MODELS_DIR / f"{model}.json"
    if str(model).lower() in hub_ids():
        return MODELS_DIR / f"{hub_ids()[str(model).lower()]}.json"
    path = Path(model)
    why = unusable_name(model)
    if why:
        raise InputError(f"model must be a catalogue name, a hub id or the path of a config.json, got "
                         f"{str(model)[:60]!r}... ({why})")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"model directory {str(model)!r} has no config.json (an adapter-only or non-transformers "
                             f"folder?): give the base model's checkpoint directory, its config.json, a hub id or a "
                             f"catalogue name")
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        real = path.resolve()               # (a Hugging Face cache's snapshot file links to an extension-less blob)
        return real if real.suffix == ".json" else path.absolute()
    first = str(model).split("/")[0]
    if _HUB_ID_RE.match(str(model)) and not path.exists() and Path(first).is_dir():
        raise InputError(f"no model config at {str(model)!r}: {first!r} is a local folder, and this path in it does "
                         f"not exist; give a config.json or checkpoint directory that exists (or a hub id)")
    if _HUB_ID_RE.match(str(model)) and not path.exists():
        from helpers import hub

        found = hub.config_file(str(model))
        if found is not None:
            return found
        raise InputError(
            f"unknown hub id {str(model)!r}: it is not in the catalogue (`python -m helpers models` lists the hub ids "
            f"it knows) nor in the Hugging Face cache ({hub.cache_dir()}), and {hub.why_no_download()}; download that "
            f"model's config.json and pass its path (--model path/to/config.json)")
    raise InputError(
        f"unknown model {str(model)!r}: give a catalogue name ({', '.join(catalogue())}) "
        f"or the path of a causal-LM config.json"
    )


# The dimensions the memory arithmetic multiplies or divides by: each must be a positive integer, at most this (far
# beyond any released model: the largest have hidden 2**15, 2**18 vocabulary entries, ~130 layers, 384 experts).
# Required ones must be in the config (under their name or the model class's alias, e.g. T5's d_model); optional
# ones may be absent or null. Limits keep a meta-device build and a dry run fast and inside 64-bit sizes.
REQUIRED_DIMS = {"hidden_size": 2**20, "num_attention_heads": 2**10, "num_hidden_layers": 2**10,
                 "vocab_size": 2**24, "intermediate_size": 2**22}
OPTIONAL_DIMS = {"num_key_value_heads": 2**10, "head_dim": 2**14, "n_routed_experts": 2**12, "num_local_experts": 2**12,
                 "num_experts": 2**12, "shared_expert_intermediate_size": 2**22,
                 "num_experts_per_tok": 2**12, "moe_intermediate_size": 2**22, "kv_lora_rank": 2**16,
                 "q_lora_rank": 2**16, "qk_nope_head_dim": 2**14, "qk_rope_head_dim": 2**14, "v_head_dim": 2**14}
OPTIONAL_COUNTS = {"n_shared_experts": 2**12, "first_k_dense_replace": 2**10}     # may also be 0


# How each MoE family names its routed-expert count: DeepSeek-V2/V3, Mixtral, Qwen2-MoE / Qwen3-MoE.
EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")


def _positive_int(path, key: str, value, most: int, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        kind = "a positive integer" if least == 1 else "an integer >= 0"
        raise InputError(f"model config {str(path)!r}: {key} must be {kind} (at most {most:,}), got {value!r}")


# keys of a multimodal checkpoint's config.json that hold its non-text towers (transformers' Gemma3Config, Mllama,
# Qwen2-VL, LLaVA, Gemma3n: vision_config / audio_config beside text_config)
VISION_KEYS = ("vision_config", "audio_config")


def check_config_dict(raw, path="config") -> dict:
    """The raw config.json object, checked before transformers reads it: an object with a model_type, every dimension
    the memory arithmetic uses present (required ones), a positive integer in range, and consistent (heads divide
    the hidden size unless head_dim is given; key/value heads divide the heads; active experts <= experts)."""
    if not isinstance(raw, dict):
        raise InputError(f"model config {str(path)!r} must be a JSON object (a Hugging Face config.json), "
                         f"got {type(raw).__name__} {json.dumps(raw)[:60]}")
    if not isinstance(raw.get("model_type"), str) or not raw["model_type"]:
        raise InputError(f"model config {str(path)!r} must name its model_type (e.g. \"llama\"), "
                         f"got {raw.get('model_type')!r}")
    towers = [k for k in VISION_KEYS if isinstance(raw.get(k), dict)]
    if towers:
        raise InputError(f"model config {str(path)!r} is a vision-language checkpoint ({raw['model_type']}, with "
                         f"{' and '.join(towers)}): the memory arithmetic counts text decoders, and this one's vision "
                         f"tower would go uncounted; for a text-only run pass --model with the catalogue's language "
                         f"model of the same family (python -m helpers models) or a complete text-only config.json "
                         f"(every dimension written out), knowing the real figure is higher by the tower's weights")
    for key, most in REQUIRED_DIMS.items():
        if key in raw:
            _positive_int(path, key, raw[key], most)
    for key, most in OPTIONAL_DIMS.items():
        if raw.get(key) is not None:
            _positive_int(path, key, raw[key], most)
    for key, most in OPTIONAL_COUNTS.items():
        if raw.get(key) is not None:
            _positive_int(path, key, raw[key], most, least=0)
    heads, hidden = raw.get("num_attention_heads"), raw.get("hidden_size")
    if heads and hidden and raw.get("head_dim") is None and hidden % heads:
        raise InputError(f"model config {str(path)!r}: hidden_size must be a multiple of num_attention_heads "
                         f"(or head_dim given), got hidden_size {hidden} and num_attention_heads {heads}")
    kv = raw.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise InputError(f"model config {str(path)!r}: num_key_value_heads must divide num_attention_heads "
                         f"({heads}), got {kv}")
    experts = next((raw[k] for k in EXPERT_KEYS if raw.get(k)), None)
    active = raw.get("num_experts_per_tok")
    if experts and active and active > experts:
        raise InputError(f"model config {str(path)!r}: num_experts_per_tok must be at most the number of experts "
                         f"({experts}), got {active}")
    return raw


def read_config_dict(model: str | Path) -> dict:
    """The checked JSON object of a catalogue name or config path (see check_config_dict)."""
    path = config_path(model)
    try:
        raw = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise InputError(f"cannot read model config {str(path)!r}: {exc}") from None
    return check_config_dict(raw, path)


def load_config(model: str | Path):
    """The transformers config object for a catalogue name or path (its JSON checked first, see check_config_dict)."""
    from transformers import AutoConfig

    path = config_path(model)
    read_config_dict(path)
    try:
        with warnings.catch_warnings():          # transformers' deprecation notes about a config's own fields
            warnings.simplefilter("ignore")
            return AutoConfig.from_pretrained(str(path))
    except Exception as exc:     # transformers' own validation (ValueError, TypeError, huggingface_hub's errors)
        first = str(exc).strip().splitlines()
        raise InputError(f"cannot read model config {str(path)!r}: {' '.join(x.strip() for x in first[:2])}") from None


def _check_dims(cfg, raw: dict, path: str) -> None:
    """Every dimension the arithmetic needs is there (under its name or the config class's alias)."""
    aliases = getattr(cfg, "attribute_map", {}) or {}
    for key, most in REQUIRED_DIMS.items():
        if key not in raw and aliases.get(key) not in raw:
            raise InputError(f"model config {path!r} has no {key}: a positive integer (at most {most:,}) is required")
        value = getattr(cfg, key, None)
        _positive_int(path, key, value, most)


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor: its name, element count, FSDP-style group ('embed', 'layer.N' or 'head'), its shape,
    and whether it is the weight of an nn.Linear (what LoRA's "all-linear" adapts)."""

    name: str
    numel: int
    group: str
    ndim: int = 2
    shape: tuple = ()
    linear: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """What memory arithmetic needs from a model: dimensions and the exact parameter inventory."""

    name: str
    path: str             # the config file it was built from
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    tensors: tuple[Tensor, ...]
    q_width: int          # query features per token (heads * query head dim)
    k_width: int          # key features per token, before GQA repetition
    v_width: int          # value features per token, before GQA repetition
    kv_latent: int        # MLA compressed key/value width (kv_lora_rank; 0 for ordinary attention)
    moe_layers: int       # layers whose MLP is a mixture of experts
    experts: int          # routed experts per MoE layer
    experts_active: int   # routed experts each token visits (top-k)
    expert_width: int     # intermediate width of one expert
    shared_width: int     # intermediate width of the always-active shared experts
    norms: int = 2        # hidden-width RMSNorms per layer (Gemma 2/3: 4, with norms after attention and MLP)
    gemma_norm: bool = False      # Gemma's RMSNorm: x * (1 + w) in fp32, cast back after (keeps the fp32 product)
    qk_norm: bool = False         # per-head RMSNorms on queries and keys (Qwen3, Gemma 3)
    logit_softcap: bool = False   # final_logit_softcapping: tanh over the logits (Gemma 2)
    fused_qkv: bool = False       # one qkv_proj (Phi-3): q, k, v are views of one output
    fused_gate_up: bool = False   # one gate_up_proj linear in the dense MLP (Phi-3)
    checkpoint_dtype: str | None = None   # the weights' dtype on disk, as config.json states it ('bf16', 'fp16',
    #                                       'fp32'; None where it states none or another): what from_pretrained reads
    rope: tuple = (0, 0)  # the rotary tables the decoder makes once per forward, per token: (elements in the hidden
    #                       states' dtype, bytes in a dtype of their own): rope_tables

    @property
    def params(self) -> int:
        """Exact parameter count (tied weights counted once)."""
        return sum(t.numel for t in self.tensors)

    @functools.cached_property
    def group_params(self) -> dict[str, int]:
        """Parameters per group, in model order: 'embed', 'layer.0' ... 'layer.N-1', 'head'."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.group] = out.get(t.group, 0) + t.numel
        return out

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the largest group (a layer, the embedding or the output head)."""
        return max(self.group_params.values())

    @property
    def largest_tensor_params(self) -> int:
        """Elements of the largest single parameter tensor."""
        return max(t.numel for t in self.tensors)

    @property
    def for_loop_adam_params(self) -> int:
        """Elements torch's single-tensor AdamW step holds at once, over the parameters in their order: while a
        tensor's denominator is made (exp_avg_sq.sqrt(), then its quotient by the bias correction: two tensors of its
        size), the previous tensor's denominator is still bound to `denom` (torch 2.13 optim/adam.py
        _single_tensor_adam, and 2.0.1's _single_tensor_adamw): 2 n_i + n_(i-1) at its largest."""
        sizes = [t.numel for t in self.tensors]
        return max(2 * n + prev for prev, n in zip([0] + sizes, sizes))

    @property
    def matmul_params(self) -> int:
        """Parameters of the matrices that linear layers read (autocast casts these): not the embedding, not 1-D
        ones, and not MoE experts' 3-D weights, which transformers multiplies with grouped_mm (not on autocast's
        list: it runs in the weights' own dtype)."""
        return sum(t.numel for t in self.tensors if t.ndim == 2 and (t.group != "embed" or self.tied))

    def lora_targets(self, targets: str = "all-linear", converted: bool = False) -> tuple[Tensor, ...]:
        """The weights LoRA adapts: with peft's target_modules="all-linear" every nn.Linear but the output head; with
        LINEAR_NAMES the same names handed to peft as a list (axolotl's lora_target_linear, LLaMA-Factory's
        lora_target: all); or the linear layers whose module name is one of `targets` (comma-separated, e.g.
        "q_proj,v_proj" or "q,v"). `converted` (see `peft_expert_names`): peft converts this MoE architecture's
        transformers 4 names on transformers 5, so each of those names targets the experts' 3-D weight or the router
        it became (`PEFT_MOE_NAMES`), and no linear module of that name."""
        names = self.lora_names(targets)
        v4 = PEFT_MOE_NAMES.get(PEFT_MOE_PATTERN.get(self.model_type), {}) if converted and self.moe_layers else {}
        mapped = {v4[n] for n in v4 if names is None or n in names}
        linear = tuple(t for t in self.tensors if t.linear and t.group.startswith("layer.")
                       and (names is None or t.name.rsplit(".", 2)[-2] in names)
                       and not (v4 and t.name.rsplit(".", 2)[-2] in v4))
        return linear + tuple(t for t in self.tensors if t.group.startswith("layer.") and (
            (t.ndim == 3 and t.name.rsplit(".", 1)[-1] in mapped)
            or ("gate.weight" in mapped and t.name.endswith(".mlp.gate.weight"))))

    def peft_expert_names(self) -> tuple[str, ...]:
        """The transformers 4 module names peft's `_MOE_TARGET_MODULE_MAPPING` maps to this architecture's experts and
        router (empty where peft converts nothing): see PEFT_MOE_PATTERN."""
        return tuple(PEFT_MOE_NAMES.get(PEFT_MOE_PATTERN.get(self.model_type), ())) if self.moe_layers else ()

    def lora_names(self, targets: str) -> frozenset[str] | None:
        """The module names a `lora_targets` value names on this model (None: peft's "all-linear"; LINEAR_NAMES: every
        linear's name): a name that is the model's own (a linear's, or a transformers 4 name peft converts, as
        Mixtral's router `gate`) as written, a LitGPT-style short name (q, v, gate, ...) expanded otherwise."""
        if targets == "all-linear":
            return None
        if targets == LINEAR_NAMES:
            return frozenset(self.linear_names())
        own = set(self.linear_names()) | set(self.peft_expert_names())
        return frozenset(x.strip() if x.strip() in own else LORA_ALIASES.get(x.strip(), x.strip())
                         for x in targets.split(","))

    def peft_named(self, targets: str) -> frozenset[str]:
        """The experts' and router's transformers 4 names that a `lora_targets` value names (all of them for
        "all-linear"; for LINEAR_NAMES those among the linear modules' names, a dense MLP's)."""
        v4 = frozenset(self.peft_expert_names())
        if targets == "all-linear":
            return v4
        return v4 & self.lora_names(targets)

    def peft_fused_names(self) -> tuple[str, ...]:
        """The two transformers 4 names peft fuses into the experts' gate_up_proj (`_MOE_FUSED_TARGETS`): a list naming
        one without the other is refused by peft."""
        names = PEFT_MOE_NAMES.get(PEFT_MOE_PATTERN.get(self.model_type), {}) if self.moe_layers else {}
        return tuple(n for n, new in names.items() if new == "gate_up_proj")

    def lora_params(self, rank: int, targets: str = "all-linear", converted: bool = False) -> int:
        """Trainable parameters of LoRA adapters of `rank` on every target: A (rank x in) + B (out x rank)."""
        return sum(r * (i + o) for r, i, o in (lora_shape(t, rank) for t in self.lora_targets(targets, converted)))

    def max_lora_rank_for(self, targets: str) -> int:
        """max_lora_rank for the weights `targets` names (the experts' too, as peft converts their transformers 4
        names): their smallest dimension (an expert's, not the experts' count), beyond which an adapter is no longer
        low-rank (a one-output gate, as Qwen2-MoE's shared_expert_gate, and the router, one output per expert, do not
        bound it: peft adapts them at any rank, and a bound of 1 or 8 would refuse most LoRA of the model)."""
        return min((min(t.shape[-2:]) for t in self.lora_targets(targets, True)
                    if t.shape and min(t.shape[-2:]) > 1 and (t.linear or t.ndim == 3)), default=0)

    def lora_unmatched(self, targets: str) -> list[str]:
        """The names in `targets` that match no module of this model: peft adapts the others and drops these (a Llama
        list on DeepSeek's MLA attention: k_proj and v_proj)."""
        names = None if targets in ("all-linear", LINEAR_NAMES) else self.lora_names(targets)
        return sorted((names or set()) - set(self.linear_names()) - set(self.peft_expert_names()))

    def linear_names(self) -> list[str]:
        """Module names of the decoder layers' linear layers (what `lora_targets` may name)."""
        return sorted({t.name.rsplit(".", 2)[-2] for t in self.tensors if t.linear and t.group.startswith("layer.")})

    def check_lora_rank(self, rank: int | None, targets: str = "all-linear") -> None:
        """InputError unless `rank` is None or at most max_lora_rank for `targets`, and `targets` names a linear (or a
        transformers 4 name of the experts peft converts, `peft_expert_names`)."""
        if rank is None:
            return
        names = None if targets == LINEAR_NAMES else self.lora_names(targets)
        outside = sorted((names or set()) & OUTSIDE_LAYERS)
        if outside:
            raise InputError(f"lora_targets {targets!r} names {', '.join(outside)}: peft adapts it (the input "
                             f"embedding with lora_embedding_A/B, the output head as a linear, whose adapter adds a "
                             f"logits-sized output), but LoRA outside the decoder layers is not modelled here, so the "
                             f"estimate would be low; leave it out to estimate the rest")
        unknown = sorted((names or set()) - set(self.linear_names()) - set(self.peft_expert_names()))
        if unknown and set(unknown) == set(names or ()):      # peft fails only where no name matches a module
            v4 = self.peft_expert_names()
            raise InputError(f"lora_targets {targets!r} names {', '.join(unknown)}, not a linear layer of {self.name}: "
                             f"its layers' linear modules are {', '.join(self.linear_names())}"
                             + (f" (and the experts' transformers 4 names peft converts: {', '.join(v4)})" if v4 else "")
                             + " (or give all-linear)")
        most = self.max_lora_rank_for(targets)
        if most and rank > most:                          # (0: only a router or one-output gate, which bound nothing)
            raise InputError(f"lora_rank must be at most {most} for {self.name} (the smallest dimension "
                             f"of its adapted linear layers), got {rank}")

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection: the LM head, or a reward model's score head (helpers.estimate.reward);
        0 when tied to the embedding."""
        return sum(t.numel for t in self.tensors if t.name.startswith(("lm_head", "score.")))


def lora_shape(t: Tensor, rank: int) -> tuple[int, int, int]:
    """(adapter rank, in features, out features) of the LoRA adapter of weight `t`: a linear's (out, in) weight gets
    rank `rank`; an MoE's 3-D experts (experts, out, in) get one adapter of rank `rank` per expert, stacked (peft
    ParamWrapper: lora_A = Linear(in, rank * experts)), twice that on a fused gate_up weight (peft's rank_pattern for
    it: r * 2, the gate's and the up projection's ranks side by side)."""
    if t.ndim == 3:
        experts, out_f, in_f = t.shape
        return rank * experts * (2 if t.name.endswith("gate_up_proj") else 1), in_f, out_f
    out_f, in_f = t.shape
    return rank, in_f, out_f


# peft on transformers 5 (peft src/peft/utils/transformers_weight_conversion.py, _convert_peft_config_moe from 0.19.0;
# _resolve_string_target_modules, PR #3232, first released in 0.20.0): a target_modules list naming an MoE
# architecture's transformers 4 names (0.19.0 on), and "all-linear" (0.20.0 on), target the routed experts (now 3-D
# parameters) and the router, as target_parameters (the name -> the parameter it became); linear modules that still
# carry one of those names (a DeepSeek dense MLP, its shared experts) are dropped from target_modules. Which architectures: transformers 5.23.0
# conversion_mapping._MODEL_TO_CONVERSION_PATTERN's entries for the "mixtral" and "qwen2_moe" patterns (peft adds
# "mixtral" itself; "qwen2_moe" has no entry of its own, so Qwen1.5-MoE's experts stay frozen).
PEFT_MOE_NAMES = {"mixtral": {"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"},
                  "qwen2_moe": {"gate": "gate.weight", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
                                "down_proj": "down_proj"}}
PEFT_MOE_PATTERN = {"mixtral": "mixtral", "minimax": "mixtral", "minimax_m2": "mixtral"} | dict.fromkeys((
    "Dots3NoteTextModel", "afmoe", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe", "glm4_moe",
    "glm4_moe_lite", "glm_moe_dsa", "glm4v_moe", "longcat_flash", "solar_open", "mellum", "qwen3_moe", "beam",
    "qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen3_omni_moe_text", "qwen3_next", "hunyuan_v1_moe", "flex_olmo",
    "olmoe", "exaone_moe", "cohere2_moe", "UnlimitedOcrTextModel"), "qwen2_moe")


# lora_targets naming every linear module's name as a list, not peft's "all-linear" string: what axolotl's
# lora_target_linear (loaders/adapter.py find_all_linear_names) and LLaMA-Factory's lora_target: all
# (model/model_utils/misc.py find_all_linear_modules) hand peft. The list holds no router or fused expert (not
# nn.Linear on transformers 5), but does hold a dense MLP's gate_proj/up_proj/down_proj, which peft converts.
LINEAR_NAMES = "all-linear-names"
# modules outside the decoder layers that peft adapts when a target list names them (transformers' names)
OUTSIDE_LAYERS = frozenset({"embed_tokens", "lm_head"})

# LitGPT-style short names for the usual projections (`--lora-targets q,v` is LitGPT's default: query and value).
LORA_ALIASES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                "down": "down_proj"}


def lora_modules(targets: str) -> frozenset[str] | None:
    """The module names a `lora_targets` value selects (None: peft's "all-linear"); short names expanded."""
    if targets == "all-linear":
        return None
    return frozenset(LORA_ALIASES.get(x.strip(), x.strip()) for x in targets.split(","))


def _group_of(name: str) -> str:
    m = _LAYER_RE.search(name)
    if m:
        return f"layer.{int(m.group(1))}"
    if "embed" in name or name.endswith("wte.weight") or name.endswith("wpe.weight"):
        return "embed"
    return "head"


def _dims(cfg, moe_layers: int) -> dict:
    """Attention and MoE dimensions from a config; `moe_layers`: layers built with routed experts (counted on the
    model, so that each family's rule for which layers are sparse — first_k_dense_replace, decoder_sparse_step,
    mlp_only_layers — is transformers' own)."""
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dims = dict(q_width=heads * head_dim, k_width=kv_heads * head_dim, v_width=kv_heads * head_dim, kv_latent=0)
    if getattr(cfg, "kv_lora_rank", None):  # multi-head latent attention (DeepSeek-V2)
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        dims.update(q_width=heads * qk, k_width=heads * qk, v_width=heads * cfg.v_head_dim,
                    kv_latent=cfg.kv_lora_rank)
        head_dim = qk
    experts = next((getattr(cfg, k) for k in EXPERT_KEYS if getattr(cfg, k, None)), 0)
    moe_width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size   # Mixtral: intermediate_size
    shared = ((getattr(cfg, "n_shared_experts", 0) or 0) * moe_width            # DeepSeek: n shared experts
              + (getattr(cfg, "shared_expert_intermediate_size", 0) or 0))     # Qwen2-MoE: one wide shared expert
    dims.update(
        moe_layers=moe_layers if experts else 0,
        experts=experts if moe_layers else 0,
        experts_active=getattr(cfg, "num_experts_per_tok", 0) if experts and moe_layers else 0,
        expert_width=moe_width if experts and moe_layers else 0,
        shared_width=shared if experts and moe_layers else 0,
    )
    return dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, **dims)


_BUILD_LOCK = threading.RLock()


@functools.lru_cache(maxsize=32)
def _spec_from_path(path: str) -> ModelSpec:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        cfg = load_config(path)
        if getattr(cfg, "is_encoder_decoder", False):
            raise InputError(
                f"{path!r} ({cfg.model_type}) is not a decoder-only model with `layers.N` blocks; the memory "
                f"arithmetic covers Llama-style decoders (llama, qwen2, mistral, deepseek_v2, ...)")
        _check_dims(cfg, read_config_dict(path), path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except (ValueError, KeyError, AttributeError, TypeError, ZeroDivisionError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{path!r} is not a causal-LM config transformers can build: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    linear = {f"{n}.weight" for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    tensors = tuple(Tensor(n, p.numel(), _group_of(n), p.dim(), tuple(p.shape), n in linear)
                    for n, p in model.named_parameters())
    if not any(t.group.startswith("layer.") for t in tensors) or getattr(cfg, "is_encoder_decoder", False):
        raise InputError(
            f"{path!r} ({cfg.model_type}) is not a decoder-only model with `layers.N` blocks; the memory arithmetic "
            f"covers Llama-style decoders (llama, qwen2, mistral, deepseek_v2, ...)"
        )
    name = Path(path).stem if Path(path).parent in (MODELS_DIR, SCALED_DIR) else hub_repo_of(path) or path
    moe_layers = len({t.group for t in tensors if ".experts." in f".{t.name}" and t.group.startswith("layer.")})
    if not any(t.numel for t in tensors):
        raise InputError(f"{path!r} builds a model with no parameters; check its dimensions")
    first = [t for t in tensors if t.group == "layer.0"]
    return ModelSpec(
        name=name, path=path, model_type=cfg.model_type, hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
        layers=cfg.num_hidden_layers, vocab=cfg.vocab_size, tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        tensors=tensors, **_dims(cfg, moe_layers),
        norms=sum(t.name.endswith("norm.weight") and t.shape == (cfg.hidden_size,) for t in first),
        gemma_norm=cfg.model_type.startswith("gemma"),
        qk_norm=any(t.name.endswith("q_norm.weight") for t in first),
        logit_softcap=bool(getattr(cfg, "final_logit_softcapping", None)),
        fused_qkv=any(t.name.endswith("qkv_proj.weight") for t in first),
        fused_gate_up=any(t.name.endswith("mlp.gate_up_proj.weight") and t.linear for t in first),
        checkpoint_dtype=checkpoint_dtype(read_config_dict(path)),
        rope=rope_tables(model, cfg),
    )


def rope_tables(model, cfg) -> tuple[int, int]:
    """What the decoder's rotary embedding returns per token, read by calling a copy of the model's own
    `model.rotary_emb` made on the CPU (the meta device refuses dynamic scaling's position check), once per attention
    layer type where it takes one (Gemma 3's local and global tables): (elements in the dtype of the hidden states it
    is given, bytes of tables in a dtype of their own: DeepSeek-V2's complex64 freqs_cis). transformers builds them
    once per forward (position_ids of batch 1 unless given) and every layer's attention saves them for backward.
    (0, 0) for a model without one; a rotary embedding that cannot be called so is taken as Llama's, cos and sin of
    head_dim each."""
    import inspect

    import torch

    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None:
        return 0, 0
    kinds = [None]
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        kinds = sorted(set(getattr(cfg, "layer_types", None) or [None]), key=str)
    follow = fixed = 0
    x = torch.empty(1, 4, cfg.hidden_size, dtype=torch.bfloat16, device="cpu")
    position = torch.arange(4, device="cpu").unsqueeze(0)
    try:
        with torch.device("cpu"):
            copy = type(rotary)(cfg)
        outs = [copy(x, position) if kind is None else copy(x, position, kind) for kind in kinds]
    except (TypeError, ValueError, RuntimeError, AttributeError, KeyError):
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * head_dim, 0
    for out in outs:
        for t in out if isinstance(out, tuple) else (out,):
            if t.dtype == x.dtype:
                follow += t.numel() // 4
            else:
                fixed += t.numel() * t.element_size() // 4
    return follow, fixed


CHECKPOINT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def checkpoint_dtype(cfg: dict) -> str | None:
    """The dtype a config.json says its weights are saved in: transformers 5 writes `dtype`, older releases
    `torch_dtype`; None where neither names one of bfloat16, float16, float32."""
    for key in ("dtype", "torch_dtype"):
        value = cfg.get(key)
        if isinstance(value, str) and value in CHECKPOINT_DTYPES:
            return CHECKPOINT_DTYPES[value]
    return None


def spec(model: str | Path | ModelSpec) -> ModelSpec:
    """The ModelSpec of a catalogue name, config path or scaled twin's config file (built once, then cached)."""
    if isinstance(model, ModelSpec):
        return model
    path = str(config_path(model))
    with _BUILD_LOCK:               # one build at a time: threads share the cache (and transformers' lazy imports)
        return _spec_from_path(path)


# The tiny twin of a model: same architecture class and the same proportions where memory depends on them.
SCALE_HIDDEN = 128        # hidden size of every twin
SCALE_HEADS = 4           # attention heads (head size 32)
SCALE_LAYERS = 2          # decoder layers
SCALE_EXPERTS = 64        # at most this many routed experts in a MoE twin (the active share kept)


def scaled_config(model: str | Path, hidden: int = SCALE_HIDDEN) -> dict:
    """The config of `model`'s tiny twin, derived by a fixed rule (documented in the README):

    hidden 128 (or `hidden`, for a wider twin where a measurement needs more bytes to resolve), 4 heads, 2 layers; the MLP's width, the vocabulary and the share of key/value heads keep their
    ratio to the hidden size (so weights, activations and logits keep their proportions); a tied head stays tied;
    a MoE (any family: DeepSeek, Mixtral, Qwen2/3-MoE) keeps its first dense layers (at most 1), its number of
    routed experts up to SCALE_EXPERTS and its share of active experts (top-k scaled with the count when capped),
    expert and shared-expert widths in proportion; the query width keeps its ratio to the hidden size where
    head_dim is given (Gemma's head_dim x heads != hidden stays so); MLA keeps its layout at 1/8 of each width.
    """
    spec(model)                               # the config checked, and buildable, once
    cfg = read_config_dict(model)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < SCALE_HEADS or hidden % SCALE_HEADS:
        raise InputError(f"a twin's hidden size must be a positive multiple of {SCALE_HEADS}, got {hidden!r}")
    h0, h = cfg["hidden_size"], hidden
    ratio = h / h0
    heads0 = cfg["num_attention_heads"]
    kv0 = cfg.get("num_key_value_heads") or heads0
    out = dict(cfg)
    out.update(
        hidden_size=h, num_attention_heads=SCALE_HEADS, num_hidden_layers=SCALE_LAYERS,
        num_key_value_heads=max(k for k in (1, 2, 4) if k <= max(1, SCALE_HEADS * kv0 // heads0)),  # divides 4
        intermediate_size=max(8, round(cfg["intermediate_size"] * ratio / 8) * 8),
        vocab_size=max(256, round(cfg["vocab_size"] * ratio / 64) * 64),
        max_position_embeddings=min(cfg.get("max_position_embeddings", 4096), 4096),
        bos_token_id=0, eos_token_id=1, rope_scaling=None,
    )
    if cfg.get("head_dim"):                   # query width / hidden kept (Gemma: 8 x 256 against hidden 2304)
        out["head_dim"] = max(8, round(h * heads0 * cfg["head_dim"] / h0 / SCALE_HEADS / 4) * 4)
    width = lambda key: max(8, round(cfg[key] * ratio / 8) * 8)
    experts_key = next((k for k in EXPERT_KEYS if cfg.get(k)), None)
    if experts_key:
        experts, active = cfg[experts_key], cfg.get("num_experts_per_tok") or 1
        twin_experts = min(experts, SCALE_EXPERTS)
        out[experts_key] = twin_experts
        out["num_experts_per_tok"] = max(1, round(active * twin_experts / experts))
        for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if cfg.get(key):
                out[key] = width(key)
        if "first_k_dense_replace" in cfg:
            out["first_k_dense_replace"] = min(1, cfg["first_k_dense_replace"] or 0)
        if "n_group" in cfg:                   # DeepSeek's group-limited routing: one group in a twin
            out.update(n_group=1, topk_group=1)
        if cfg.get("mlp_only_layers"):
            out["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < SCALE_LAYERS]
        if cfg.get("decoder_sparse_step"):
            out["decoder_sparse_step"] = min(cfg["decoder_sparse_step"], SCALE_LAYERS)
    if cfg.get("kv_lora_rank"):
        out.update({k: max(8, cfg[k] // 8) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                       "v_head_dim") if cfg.get(k)})
    return out


def scaled_path(model: str | Path, hidden: int = SCALE_HIDDEN) -> Path:
    """A config file of the tiny twin (written once under ~/.cache/oom-casebook, keyed by content)."""
    import hashlib

    text = json.dumps(scaled_config(model, hidden), indent=1, sort_keys=True)
    name = config_path(model).stem
    repo = hub_repo_of(config_path(model))
    if repo is not None or name == "config":       # a hub id's, or a checkpoint folder's: named by it, not 'config'
        name = (repo or config_path(model).parent.name).replace("/", "--")
    folder = SCALED_DIR
    path = folder / f"{name}-scaled-{hashlib.sha1(text.encode()).hexdigest()[:8]}.json"
    if not path.exists():              # two processes may write the same twin at once: each through its own file
        write_text_atomically(path, text)
    return path
