"""The model catalogue: configs by name (data/models/NAME.json) or path, and the parameter inventory of a config.

Nothing is downloaded: a model is a Hugging Face `config.json`; its parameter shapes come from a meta-device build
(no memory is allocated), cached per config file.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import InputError
from helpers.files import write_text_atomically

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MODELS_DIR = DATA_DIR / "models"
SCALED_DIR = Path.home() / ".cache" / "oom-casebook" / "scaled"   # the tiny twins' configs (derived, see scaled_config)

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def catalogue() -> list[str]:
    """Names of the models that ship in data/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def config_path(model: str | Path) -> Path:
    """The config file for a catalogue name or a path to a config.json; InputError if there is none."""
    if not isinstance(model, (str, Path)):
        raise InputError(f"model must be a catalogue name ({', '.join(catalogue())}) or the path of a config.json, "
                         f"got {type(model).__name__} {model!r}")
    if str(model) in catalogue():
        return MODELS_DIR / f"{model}.json"
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        return path.resolve()
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
                 "num_experts_per_tok": 2**12, "moe_intermediate_size": 2**22, "kv_lora_rank": 2**16,
                 "q_lora_rank": 2**16, "qk_nope_head_dim": 2**14, "qk_rope_head_dim": 2**14, "v_head_dim": 2**14}
OPTIONAL_COUNTS = {"n_shared_experts": 2**12, "first_k_dense_replace": 2**10}     # may also be 0


def _positive_int(path, key: str, value, most: int, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        kind = "a positive integer" if least == 1 else "an integer >= 0"
        raise InputError(f"model config {str(path)!r}: {key} must be {kind} (at most {most:,}), got {value!r}")


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
    experts = raw.get("n_routed_experts") or raw.get("num_local_experts")
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
    def matmul_params(self) -> int:
        """Parameters of the matrices that matmuls read (autocast casts these): not the embedding, not 1-D ones."""
        return sum(t.numel for t in self.tensors if t.ndim >= 2 and (t.group != "embed" or self.tied))

    def lora_targets(self) -> tuple[Tensor, ...]:
        """The weights LoRA adapts with peft's target_modules="all-linear": every nn.Linear but the output head."""
        return tuple(t for t in self.tensors if t.linear and t.group.startswith("layer."))

    def lora_params(self, rank: int) -> int:
        """Trainable parameters of LoRA adapters of `rank` on every target: A (rank x in) + B (out x rank)."""
        return sum(rank * (t.shape[0] + t.shape[1]) for t in self.lora_targets())

    @property
    def max_lora_rank(self) -> int:
        """The largest useful LoRA rank: the smallest dimension of an adapted weight (a higher rank adds no
        expressiveness, only parameters)."""
        return min((min(t.shape) for t in self.lora_targets() if t.shape), default=0)

    def check_lora_rank(self, rank: int | None) -> None:
        """InputError unless `rank` is None or at most max_lora_rank."""
        if rank is not None and rank > self.max_lora_rank:
            raise InputError(f"lora_rank must be at most {self.max_lora_rank} for {self.name} (the smallest dimension "
                             f"of its adapted linear layers), got {rank}")

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection (0 when tied to the embedding)."""
        return sum(t.numel for t in self.tensors if t.name.startswith("lm_head"))


def _group_of(name: str) -> str:
    m = _LAYER_RE.search(name)
    if m:
        return f"layer.{int(m.group(1))}"
    if "embed" in name or name.endswith("wte.weight") or name.endswith("wpe.weight"):
        return "embed"
    return "head"


def _dims(cfg) -> dict:
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dims = dict(q_width=heads * head_dim, k_width=kv_heads * head_dim, v_width=kv_heads * head_dim, kv_latent=0)
    if getattr(cfg, "kv_lora_rank", None):  # multi-head latent attention (DeepSeek-V2)
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        dims.update(q_width=heads * qk, k_width=heads * qk, v_width=heads * cfg.v_head_dim,
                    kv_latent=cfg.kv_lora_rank)
        head_dim = qk
    experts = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None) or 0
    first_dense = getattr(cfg, "first_k_dense_replace", 0) or 0
    dims.update(
        moe_layers=max(cfg.num_hidden_layers - first_dense, 0) if experts else 0,
        experts=experts,
        experts_active=getattr(cfg, "num_experts_per_tok", 0) if experts else 0,
        expert_width=getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size if experts else 0,
        shared_width=(getattr(cfg, "n_shared_experts", 0) or 0) * (getattr(cfg, "moe_intermediate_size", 0) or 0),
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
    name = Path(path).stem if Path(path).parent in (MODELS_DIR, SCALED_DIR) else path
    if not any(t.numel for t in tensors):
        raise InputError(f"{path!r} builds a model with no parameters; check its dimensions")
    return ModelSpec(
        name=name, path=path, model_type=cfg.model_type, hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
        layers=cfg.num_hidden_layers, vocab=cfg.vocab_size, tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        tensors=tensors, **_dims(cfg),
    )


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
SCALE_EXPERTS = 8         # routed experts of a MoE twin (2 active, at most)


def scaled_config(model: str | Path, hidden: int = SCALE_HIDDEN) -> dict:
    """The config of `model`'s tiny twin, derived by a fixed rule (documented in the README):

    hidden 128 (or `hidden`, for a wider twin where a measurement needs more bytes to resolve), 4 heads, 2 layers; the MLP's width, the vocabulary and the share of key/value heads keep their
    ratio to the hidden size (so weights, activations and logits keep their proportions); a tied head stays tied;
    a MoE keeps its first dense layers (at most 1), 8 experts with 2 active, expert width in proportion;
    MLA keeps its layout at 1/8 of each width.
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
    if "head_dim" in cfg:
        out["head_dim"] = h // SCALE_HEADS
    if cfg.get("n_routed_experts"):
        out.update(n_routed_experts=SCALE_EXPERTS, num_experts_per_tok=min(2, cfg["num_experts_per_tok"]),
                   moe_intermediate_size=max(8, round(cfg["moe_intermediate_size"] * ratio / 8) * 8),
                   first_k_dense_replace=min(1, cfg.get("first_k_dense_replace", 0)), n_group=1, topk_group=1)
    if cfg.get("kv_lora_rank"):
        out.update({k: max(8, cfg[k] // 8) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                       "v_head_dim") if cfg.get(k)})
    return out


def scaled_path(model: str | Path, hidden: int = SCALE_HIDDEN) -> Path:
    """A config file of the tiny twin (written once under ~/.cache/oom-casebook, keyed by content)."""
    import hashlib

    text = json.dumps(scaled_config(model, hidden), indent=1, sort_keys=True)
    name = config_path(model).stem
    folder = SCALED_DIR
    path = folder / f"{name}-scaled-{hashlib.sha1(text.encode()).hexdigest()[:8]}.json"
    if not path.exists():              # two processes may write the same twin at once: each through its own file
        write_text_atomically(path, text)
    return path
