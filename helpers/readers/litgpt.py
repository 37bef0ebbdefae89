"""Reader of a LitGPT fine-tuning config (`litgpt finetune_lora --config lora.yaml`, `litgpt finetune_full --config
full.yaml`; the files of LitGPT's `config_hub/finetune/`): checkpoint_dir, precision, quantize, devices, the LoRA
switches, `train:` (micro/global batch, max_seq_length) and `optimizer:`.

Source read: github:Lightning-AI/litgpt at commit 2685705 (2026-06-29, version 0.5.13):
- `litgpt/finetune/lora.py` setup(): lora_r 8, lora_alpha 16, lora_dropout 0.05, lora_query and lora_value on;
  TrainArgs(global_batch_size 16, micro_batch_size 1, max_seq_length None); optimizer "AdamW"; precision None ->
  `litgpt/utils.py` get_default_supported_precision(training=True): "bf16-mixed" on a GPU with bf16; quantize
  "bnb.*" refused with a mixed precision and with more than one device; devices * num_nodes > 1: Lightning's
  ModelParallelStrategy with `parallelize_fn`: every Block checkpointed (checkpoint_wrapper) and sharded by FSDP2's
  fully_shard, with each trainable Linear; with quantize, bitsandbytes' PagedAdamW (`instantiate_bnb_optimizer`).
- `litgpt/finetune/full.py` setup(): devices * num_nodes > 1: Lightning's FSDPStrategy (FSDP1, FULL_SHARD,
  auto-wrap and activation checkpointing of every Block).
- `litgpt/args.py` TrainArgs: gradient_accumulation_iters = global_batch_size // (devices * num_nodes) //
  micro_batch_size.
- `litgpt/utils.py` instantiate_torch_optimizer: "AdamW" is torch.optim.AdamW (foreach on CUDA by torch's default);
  a dict's class_path and init_args.
The file does not say which script runs it: a file with LoRA keys is read as `finetune_lora`, else `finetune_full`.
"""

from __future__ import annotations

from pathlib import Path

from helpers import models
from helpers.readers import model_ref
from helpers.readers.base import ConfigError, Imported, leaves, lookup, probability
from helpers.readers.provenance import Record, boolean, positive_int

NAME = "litgpt"
TOOL = "LitGPT 0.5.13 (commit 2685705)"
SRC = "github:Lightning-AI/litgpt@2685705 litgpt/finetune/lora.py setup()"
FULL_SRC = "github:Lightning-AI/litgpt@2685705 litgpt/finetune/full.py setup()"

LORA_SWITCHES = {"lora_query": "q_proj", "lora_key": "k_proj", "lora_value": "v_proj", "lora_projection": "o_proj",
                 "lora_mlp": "gate_proj,up_proj,down_proj"}
LORA_DEFAULTS = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_query": True, "lora_key": False,
                 "lora_value": True, "lora_projection": False, "lora_mlp": False, "lora_head": False}
PRECISIONS = {"bf16-true": "bf16", "bf16-mixed": "bf16-mixed", "32-true": "fp32", "16-mixed": "fp16-mixed",
              "16-true": "bf16"}
# Lightning Fabric's legacy spellings (lightning/fabric/connector.py _convert_precision_to_unified_args, with a warning)
LEGACY_PRECISIONS = {"bf16": "bf16-mixed", "16": "16-mixed", "32": "32-true"}
TOP_KEYS = {"checkpoint_dir", "out_dir", "precision", "quantize", "devices", "num_nodes", "resume", "lora_r",
            "lora_alpha", "lora_dropout", "lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp",
            "lora_head", "data", "train", "log", "eval", "optimizer", "logger_name", "seed", "access_token"}
TRAIN_KEYS = {"save_interval", "log_interval", "global_batch_size", "micro_batch_size", "lr_warmup_steps",
              "lr_warmup_fraction", "epochs", "max_tokens", "max_steps", "max_time", "max_seq_length",
              "tie_embeddings", "max_norm", "min_lr"}
QUANTIZE = {"bnb.nf4": "nf4", "bnb.nf4-dq": "nf4-dq", "bnb.fp4": "nf4", "bnb.fp4-dq": "nf4-dq"}
TRAIN_DEFAULTS = {"global_batch_size": 16, "micro_batch_size": 1, "max_seq_length": None}
SEQ_UNKNOWN = 2048
READ = {"checkpoint_dir", "precision", "quantize", "devices", "num_nodes", "train.micro_batch_size",
        "train.global_batch_size", "train.max_seq_length", "optimizer", "optimizer.class_path",
        "optimizer.init_args.fused", "optimizer.init_args.foreach", *LORA_DEFAULTS}
NOT_MODELLED = {
    "train.tie_embeddings": "tying the embedding to the head changes what is trained",
    "resume": "resuming loads the optimizer states",
}
MODEL_DIFFERENCES = (
    "LitGPT's own GPT model is estimated with the catalogue's transformers rules plus its expanded keys and values "
    "(kv_expanded); its loss is chunked_cross_entropy over 128-token "
    "chunks{head}, which holds less than transformers' whole fp32 logits: lower{held}")
HELD_UNMODELLED = ("; and its fit loop keeps each micro batch's logits (and graph) until the next forward returns, "
                   "modelled on one GPU only (outputs_held): higher")
LORA_HEAD = ", and finetune_lora's forward computes the head in 128-token chunks (lm_head_chunk_size=128)"


UNTIED = ("LitGPT never ties the embedding and the output head in fine-tuning (litgpt/model.py builds lm_head as its "
          "own nn.Linear; finetune/lora.py and full.py refuse train.tie_embeddings; convert_hf_checkpoint.py copies the "
          "embedding into the head), while the catalogue's {model} ties them: the real figure is higher by a second "
          "{params:.0f} M-parameter matrix, and by its gradient and optimizer states where it is trained")


def claims(path: Path, data) -> bool:
    """A YAML mapping with LitGPT's `checkpoint_dir` (or `out_dir`) beside its `train:` section or `precision`."""
    return (Path(path).suffix.lower() in (".yaml", ".yml") and isinstance(data, dict)
            and bool({"checkpoint_dir", "out_dir"} & set(data))
            and (isinstance(data.get("train"), dict) or "precision" in data or "quantize" in data)
            and not {"base_model", "model_name_or_path", "model"} & set(data))


def read(path: Path, data, lines: dict[str, int], given: list[Path]) -> Imported:
    if "checkpoint_dir" not in data:
        raise ConfigError(path, "a LitGPT config without checkpoint_dir (a pretraining config?): only the fine-tuning "
                                "configs of finetune_lora and finetune_full are read")
    _refuse_unknown(path, data)
    return _Reader(path, data, lines).read()


def _refuse_unknown(path: Path, data: dict) -> None:
    """LitGPT's CLI (jsonargparse over setup()'s arguments and TrainArgs) refuses a key they do not have: so does
    this reader, naming the nearest key (a misspelt lora_r never trains at its default)."""
    import difflib

    for key in ("train", "eval", "data", "optimizer"):
        if key in data and data[key] is not None and not isinstance(data[key], (dict, str)) or \
                key == "train" and isinstance(data.get(key), str):
            raise ConfigError(path, f"{key} must be a mapping of its settings (LitGPT's {key} arguments), got "
                                    f"{data[key]!r}")
    for key, known, where in [(k, TOP_KEYS, "") for k in data] + \
            [(k, TRAIN_KEYS, "train.") for k in (data.get("train") or {}) if isinstance(data.get("train"), dict)]:
        if key not in known:
            near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            hint = f": did you mean {where}{near[0]!r}?" if near else ""
            raise ConfigError(path, f"unknown key {where}{key!r}{hint} (LitGPT's finetune_lora / finetune_full take "
                                    f"{', '.join(sorted(known))})")


class _Reader:
    def __init__(self, path: Path, data: dict, lines: dict):
        self.path, self.data, self.lines = Path(path), data, lines
        self.d = Record(NAME, path, lines)
        self.lora = any(k in data for k in LORA_DEFAULTS)
        self.src = SRC if self.lora else FULL_SRC

    def value(self, key: str, default):
        """(present, value): the file's value of a dotted key, or the script's default."""
        return lookup(self.data, key, default)

    def read(self) -> Imported:
        model, named = self.model()
        world = self.world()
        self.precision(world)
        self.sizes(world)
        self.lora_keys(model)
        self.optimizer()
        d = self.d
        d.default(TOOL, "attention", "sdpa", "litgpt/model.py CausalSelfAttention.scaled_dot_product_attention: "
                  "torch's F.scaled_dot_product_attention (flash on a GPU that has it)", attention="flash")
        d.default(TOOL, "(attention)", "keys and values expanded", "litgpt/model.py CausalSelfAttention: k and v "
                  "expanded to every head before scaled_dot_product_attention ('flash attention requires it in "
                  "training mode'), which saves the copies", kv_expanded=True)
        one = d.fields.get("strategy", "single") == "single"
        if one:
            d.default(TOOL, "(fit loop)", "logits = model(input_ids, ...)", "litgpt/finetune/lora.py and full.py fit(): "
                      "the logits stay bound through backward, the optimizer step and the next forward",
                      outputs_held=True)
        d.unmodelled("(LitGPT's model)", "litgpt.model.GPT", MODEL_DIFFERENCES.format(
            head=LORA_HEAD if self.lora else "", held="" if one else HELD_UNMODELLED))
        if model is not None and models.spec(model).tied:
            head = models.spec(model).group_params["embed"]
            d.unmodelled("(LitGPT's output head)", "lm_head", UNTIED.format(model=model, params=head / 1e6))
        for key, why in NOT_MODELLED.items():
            present, v = self.value(key, None)
            if present and v not in (None, False):
                d.unmodelled(key, v, why)
        for key, v in leaves(self.data, opaque=("optimizer",)):
            if key not in READ and key not in NOT_MODELLED:         # (the optimizer's mapping is one leaf, read)
                d.ignore(key, v)
        return d.finish(model, named)

    def model(self):
        """checkpoint_dir: LitGPT's `checkpoints/<org>/<name>` is the hub id <org>/<name>; a directory holding a
        config.json is read as it is."""
        named = self.data["checkpoint_dir"]
        if not isinstance(named, str) or not named.strip():
            raise ConfigError(self.path, f"checkpoint_dir must be a path, got {named!r}")
        text = named.strip().rstrip("/")
        model, _ = model_ref.resolve(text, self.path, "checkpoint_dir") if Path(text).expanduser().is_dir() else \
            (None, None)
        parts = text.split("/")
        local = text.startswith(("/", "./", "../", "~")) and not Path(text).expanduser().is_dir()
        hub = text if local or len(parts) < 2 else "/".join(parts[-2:])
        if model is None and not local:
            model, _ = model_ref.resolve(hub, self.path, "checkpoint_dir")
        self.d.set("checkpoint_dir", named, sets=model_ref.sets_words(
            model, f"{hub!r}: no such local directory: pass --model" if local else
            f"{hub!r} is not in the catalogue or the local cache: pass --model"))
        return model, hub

    def world(self) -> int:
        d = self.d
        present, devices = self.value("devices", 1)
        if isinstance(devices, str) and (devices.strip().lstrip("-").isascii() and devices.strip().lstrip("-").isdigit()):
            devices = int(devices)
        if devices in ("auto", -1):
            d.unmodelled("devices", devices, "every visible GPU: the count is not in the file (pass --gpus N)")
            devices = None
        elif isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ConfigError(self.path, f"devices must be a positive integer, 'auto' or -1, got {devices!r}")
        _, nodes = self.value("num_nodes", 1)
        nodes = positive_int(self.path, "num_nodes", nodes)
        self.devices = devices
        if devices is None:
            return 0
        world = devices * nodes
        if world > 1 and self.lora:
            d.set("devices", devices, strategy="fsdp2", gpus=world, checkpointing="full",
                  sets=f"strategy='fsdp2', gpus={world}, checkpointing='full' (ModelParallelStrategy: parallelize_fn "
                       f"checkpoints and fully_shards every Block)")
        elif world > 1:
            d.set("devices", devices, strategy="fsdp1", gpus=world, checkpointing="full",
                  sets=f"strategy='fsdp1', gpus={world}, checkpointing='full' (FSDPStrategy: FULL_SHARD, every Block "
                       f"wrapped and checkpointed)")
        elif present:
            d.set("devices", devices, strategy="single", gpus=1)
        else:
            d.default(TOOL, "devices", 1, self.src, strategy="single", gpus=1)
        if nodes > 1:
            d.set("num_nodes", nodes, sets=f"{world} GPUs in all ({devices} per node)", gpus_per_node=devices)
        return world

    def precision(self, world: int) -> None:
        d, f = self.d, self.path
        present, p = self.value("precision", None)
        if isinstance(p, (str, int)) and not isinstance(p, bool) and str(p) in LEGACY_PRECISIONS:
            d.unmodelled("precision", p, f"Lightning's legacy spelling of {LEGACY_PRECISIONS[str(p)]!r} (it warns and "
                                         f"uses that): read as {LEGACY_PRECISIONS[str(p)]!r}")
            p = LEGACY_PRECISIONS[str(p)]
            d.set("precision", p, precision=PRECISIONS[p])
        elif p is None:
            p = "bf16-mixed"
            d.default(TOOL, "precision", None, "litgpt/utils.py get_default_supported_precision(training=True): "
                      "'bf16-mixed' on a GPU with bf16 ('16-mixed' without)", precision="bf16-mixed")
        elif p not in PRECISIONS:
            raise ConfigError(f, f"precision must be one of {', '.join(PRECISIONS)}, got {p!r}")
        else:
            d.set("precision", p, precision=PRECISIONS[p])
            if p == "16-true":
                d.unmodelled("precision", p, "pure fp16 (weights, gradients and states in fp16) is estimated as pure "
                                             "bf16: the same bytes per value")
        if self.lora and p != "32-true":
            if p.endswith("-mixed") and world > 1:
                d.unmodelled("precision", p, "Lightning's mixed precision over ModelParallelStrategy is estimated as "
                                             "FSDP2's bf16 MixedPrecisionPolicy over fp32 parameters")
            elif p.endswith("-mixed"):
                d.default(TOOL, "(LoRA base)", "fp32", "Lightning's mixed precision keeps the model in fp32 and "
                          "autocasts: the frozen base and the adapters are fp32", base_weights="fp32",
                          adapter_dtype="fp32")
            elif world <= 1:
                d.default(TOOL, "(LoRA adapters)", p, "LitGPT's LoRA layers are made in the model's dtype",
                          adapter_dtype="bf16")
        present_q, q = self.value("quantize", None)
        if q is None:
            return
        if q not in (*QUANTIZE, "bnb.int8-training"):
            raise ConfigError(f, f"quantize must be one of {', '.join([*QUANTIZE, 'bnb.int8-training'])}, got {q!r}")
        if p.endswith("-mixed"):
            raise ConfigError(f, f"quantize {q} with precision {p}: LitGPT refuses quantization with a mixed precision "
                                 f"(finetune/lora.py: 'Quantization and mixed precision is not supported')")
        if world > 1:
            raise ConfigError(f, f"quantize {q} with {world} GPUs: LitGPT refuses quantization on more than one device")
        if not self.lora:
            d.unmodelled("quantize", q, "a quantized base without LoRA (finetune_full) is not modelled")
            return
        if q == "bnb.int8-training":
            d.unmodelled("quantize", q, "bitsandbytes' 8-bit base (Linear8bitLt) is not modelled: estimated with a "
                                        "16-bit base, which holds more")
            return
        d.set("quantize", q, base_weights=QUANTIZE[q])
        d.unmodelled("quantize", q, "Lightning's BitsandbytesPrecision quantizes every nn.Linear, the output head "
                                    "too (estimated with a 16-bit head), and LitGPT then steps the adapters with "
                                    "bitsandbytes' PagedAdamW (fp32 states in CUDA unified memory, estimated as "
                                    "torch's AdamW)" + (": fp4 is stored as nf4 is, 4 bits and the same statistics"
                                                        if "fp4" in q else ""))

    def sizes(self, world: int) -> None:
        d, f = self.d, self.path
        train = self.data.get("train", {})
        if train is not None and not isinstance(train, dict):
            raise ConfigError(f, f"train must be a mapping of TrainArgs fields, got {train!r}")
        values = {}
        for key, default in TRAIN_DEFAULTS.items():
            present, v = self.value(f"train.{key}", default)
            values[key] = (present, v)
        present, micro = values["micro_batch_size"]
        micro = positive_int(f, "train.micro_batch_size", micro)
        (d.set("train.micro_batch_size", micro, batch=micro) if present else
         d.default(TOOL, "train.micro_batch_size", micro, self.src, batch=micro))
        present_g, glob = values["global_batch_size"]
        glob = positive_int(f, "train.global_batch_size", glob)
        ranks = world or 1
        accum = glob // ranks // micro
        if accum < 1:
            raise ConfigError(f, f"train.global_batch_size {glob} over {ranks} GPU(s) gives fewer samples per GPU than "
                                 f"micro_batch_size {micro}: LitGPT's gradient_accumulation_iters asserts > 0")
        why = f"grad_accum={accum} ({glob} // {ranks} GPU(s) // micro_batch_size {micro})"
        (d.set("train.global_batch_size", glob, sets=why, grad_accum=accum) if present_g else
         d.default(TOOL, "train.global_batch_size", glob, self.src, sets=why, grad_accum=accum))
        present, seq = values["max_seq_length"]
        if seq is None:
            d.default("not in the files", "train.max_seq_length", None,
                      "None: each batch is as long as its longest sample (up to the model's context); the estimate "
                      f"takes {SEQ_UNKNOWN} tokens: pass --seq N for your data's longest sample", seq=SEQ_UNKNOWN,
                      sets=f"seq={SEQ_UNKNOWN} assumed: pass --seq N (your longest sample)")
        else:
            seq = positive_int(f, "train.max_seq_length", seq)
            d.set("train.max_seq_length", seq, sets=f"seq={seq} (the cap: batches are padded to their longest "
                                                    f"sample, at most this)", seq=seq)

    def lora_keys(self, model: str | None) -> None:
        d, f = self.d, self.path
        if not self.lora:
            d.default(TOOL, "(method)", "finetune_full", "the file has no lora_* keys: read as "
                      "`litgpt finetune_full` (every weight trained)", sets="full fine-tuning (lora_rank None)")
            return
        present, r = self.value("lora_r", 8)
        r = positive_int(f, "lora_r", r)
        (d.set("lora_r", r, lora_rank=r) if present else d.default(TOOL, "lora_r", r, SRC, lora_rank=r))
        present, p = self.value("lora_dropout", 0.05)
        p = probability(f, "lora_dropout", p)
        (d.set("lora_dropout", p, lora_dropout=p) if present else
         d.default(TOOL, "lora_dropout", p, SRC, lora_dropout=p))
        present, alpha = self.value("lora_alpha", 16)
        if present:
            d.ignore("lora_alpha", alpha)
        targets = []
        for key, modules in LORA_SWITCHES.items():
            present, on = self.value(key, LORA_DEFAULTS[key])
            if boolean(f, key, on):
                targets.append(modules)
        present, head = self.value("lora_head", False)
        if boolean(f, "lora_head", head):
            d.unmodelled("lora_head", head, "an adapter on the output head is not modelled (its input and gradients "
                                            "add to the figure)")
        if not targets:
            raise ConfigError(f, "every lora_query/key/value/projection/mlp switch is off: LoRA adapts no layer")
        joined = ",".join(model_ref.module_names(targets, model))
        given = [k for k in LORA_SWITCHES if k in self.data]
        if given:
            d.set(given[0], self.data[given[0]], lora_targets=joined,
                  sets=f"lora_targets={joined!r} (with {', '.join(given[1:]) or 'no other switch'} and finetune_lora's "
                       f"defaults for the rest; LitGPT's own LoRA layers, estimated as peft's)")
        else:
            d.default(TOOL, "lora_query/key/value/projection/mlp", joined, "finetune_lora's defaults (query and value "
                      "on); LitGPT's own LoRA layers, estimated as peft's on the same projections", lora_targets=joined)

    def optimizer(self) -> None:
        d, f = self.d, self.path
        present, opt = self.value("optimizer", "AdamW")
        name = opt.get("class_path") if isinstance(opt, dict) else opt
        if not isinstance(name, str):
            raise ConfigError(f, f"optimizer must be a name or a mapping with class_path, got {opt!r}")
        short = name.rsplit(".", 1)[-1]
        key = "optimizer.class_path" if isinstance(opt, dict) else "optimizer"
        if short in ("AdamW8bit", "PagedAdamW8bit"):
            d.set(key, name, optimizer="adamw-8bit")
            return
        if short not in ("AdamW", "Adam"):
            d.unmodelled(key, name, "only AdamW (torch's, or bitsandbytes' 8-bit) is modelled: estimated as AdamW")
            return
        impl = "foreach"
        args = opt.get("init_args") or {} if isinstance(opt, dict) else {}
        if args.get("fused"):
            impl = "fused"
        elif args.get("foreach") is False:
            impl = "for-loop"
        sets = f"optimizer='adamw', adam_impl={impl!r}" + ("" if impl != "foreach" else
                                                           " (torch's default on CUDA)")
        (d.set(key, name, sets=sets, optimizer="adamw", adam_impl=impl) if present else
         d.default(TOOL, "optimizer", name, self.src + " (torch.optim.AdamW)", sets=sets, optimizer="adamw",
                   adam_impl=impl))
