"""Reader of a LLaMA-Factory training YAML (`llamafactory-cli train run.yaml`), with the DeepSpeed JSON its
`deepspeed:` key names (looked up beside the YAML, then among the files given).

Defaults and meanings are LLaMA-Factory's own, read from github:hiyouga/LLaMA-Factory at commit ff6d4d1 (2026-08-18,
version 0.9.6.dev0):
- `src/llamafactory/hparams/finetuning_args.py`: stage "sft", finetuning_type "lora", lora_rank 8, lora_target "all"
  (every linear layer), pure_bf16 False, use_galore/use_apollo/use_badam False, freeze_trainable_layers 2;
- `src/llamafactory/hparams/model_args.py`: flash_attn "auto" (transformers chooses: sdpa), disable_gradient_checkpointing
  False, enable_liger_kernel False, use_unsloth False, quantization_bit None, quantization_type "nf4";
- `src/llamafactory/hparams/data_args.py`: cutoff_len 2048, packing None (on for stage pt only, parser.py),
  neat_packing False;
- `src/llamafactory/model/model_utils/checkpointing.py` `prepare_model_for_training`: gradient checkpointing is enabled
  unless disable_gradient_checkpointing ("if not model_args.disable_gradient_checkpointing: ...
  gradient_checkpointing_enable");
- `src/llamafactory/hparams/parser.py`: compute dtype bf16 when bf16 or pure_bf16, pure_bf16 refused with ZeRO-3.
Training-loop keys (per_device_train_batch_size, gradient_accumulation_steps, bf16, fp16, optim, deepspeed) are
transformers' TrainingArguments, whose defaults are the installed transformers'.
"""

from __future__ import annotations

import functools
from pathlib import Path

from helpers import strategies
from helpers.models import LINEAR_NAMES
from helpers.readers import accelerate, base, collect, model_ref
from helpers.readers.base import ConfigError, Imported

NAME = "llamafactory"


@functools.cache
def known_keys() -> frozenset[str]:
    """Every key LLaMA-Factory's parser takes: its own arguments (data/tool_keys/llamafactory.json, with the commit
    they were read at) and transformers' TrainingArguments fields, of the installed release and of 4.57.1 (a run on
    transformers 4 takes warmup_ratio, which 5.15 dropped)."""
    import dataclasses
    import json

    from transformers import Seq2SeqTrainingArguments

    from helpers.models import DATA_DIR

    own = json.loads((DATA_DIR / "tool_keys" / "llamafactory.json").read_text())["keys"]
    v4 = json.loads((DATA_DIR / "tool_keys" / "transformers-4.57.1-training-args.json").read_text())["keys"]
    return frozenset(own) | frozenset(v4) | {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}


def _refuse_unknown(path, key) -> None:
    """ConfigError for a key no LLaMA-Factory argument has: its parser refuses the file (allow_extra_keys=False,
    hparams/parser.py, unless ALLOW_EXTRA_ARGS is set), so the run never starts with it."""
    import difflib

    known = known_keys()
    if str(key) in known:
        return
    if str(key) in MEGATRON_KEYS:
        raise ConfigError(path, f"{key} is a Megatron setting: LLaMA-Factory takes it only when run with USE_MCA=1 or "
                                f"USE_MEGATRON_BRIDGE=1 (hparams/parser.py get_train_args), its Megatron-Core "
                                f"trainers, which this package does not model; without them its parser refuses the "
                                f"key")
    near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    raise ConfigError(path, f"unknown key {key!r}" + (f": did you mean {near[0]!r}?" if near else "") + " (LLaMA-Factory "
                            "refuses keys its arguments do not have, unless ALLOW_EXTRA_ARGS=1 is set)")
# The Megatron trainers' keys (hparams/megatron_bridge_args.py MegatronBridgeArguments, and examples/megatron/*.yaml
# for mcore_adapter's, at ff6d4d1): LLaMA-Factory's own parser takes them only under USE_MCA / USE_MEGATRON_BRIDGE.
MEGATRON_KEYS = frozenset((
    "tensor_model_parallel_size pipeline_model_parallel_size expert_model_parallel_size context_parallel_size "
    "virtual_pipeline_model_parallel_size sequence_parallel recompute_granularity recompute_method "
    "recompute_num_layers account_for_embedding_in_pipeline_split account_for_loss_in_pipeline_split "
    "bias_activation_fusion apply_rope_fusion masked_softmax_fusion cross_entropy_loss_fusion moe_grouped_gemm "
    "moe_token_dispatcher_type calculate_per_token_loss use_distributed_optimizer overlap_param_gather "
    "overlap_grad_reduce use_packed_sequences mixed_precision megatron_pretrained_checkpoint export_hf_on_finish "
    "extra_config").split())
# LLaMA-Factory's v1 trainer (examples/v1/*.yaml at ff6d4d1): its own format, keys the v0 parser does not have
V1_KEYS = {"model", "model_class", "dist_config", "kernel_config", "train_dataset", "micro_batch_size",
           "sample_backend", "peft_config", "quant_config", "batching_strategy", "init_config", "optim_config"}
TOOL = "LLaMA-Factory 0.9.6.dev0 (commit ff6d4d1)"
QUANTIZATION_METHODS = ("bnb", "gptq", "awq", "aqlm", "quanto", "eetq", "hqq", "mxfp4", "fp8")   # extras/constants.py
SRC = "github:hiyouga/LLaMA-Factory@ff6d4d1 src/llamafactory/hparams/"

# Keys only LLaMA-Factory has: one of them in a YAML makes it LLaMA-Factory's.
OWN_KEYS = {"finetuning_type", "cutoff_len", "lora_target", "template", "quantization_bit",
            "disable_gradient_checkpointing",
            "flash_attn", "enable_liger_kernel", "pure_bf16", "use_unsloth", "neat_packing", "freeze_trainable_layers",
            "dataset_dir", "preprocessing_num_workers", "stage"}
FULL_LIKE = {"full", "lora", "freeze", "oft"}
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
PREF_LOSSES = ("sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo")    # finetuning_args.py pref_loss Literal
ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "flash", "disabled": "eager"}

NOT_MODELLED = {
    "use_galore": "GaLore keeps low-rank projected optimizer states",
    "use_apollo": "APOLLO optimizer states",
    "use_badam": "BAdam updates one block at a time (optimizer states of one block only)",
    "use_dora": "DoRA adds a magnitude vector and a weight-norm per adapted layer",
    "use_unsloth": "unsloth's kernels and offloaded checkpointing",
    "use_unsloth_gc": "unsloth's offloaded gradient checkpointing",
    "additional_target": "extra modules trained in full beside LoRA",
    "lora_alpha": None,
    "use_llama_pro": "LLaMA Pro expanded blocks", "train_mm_proj_only": "multimodal projector only",
    "freeze_vision_tower": None, "image_max_pixels": "image tokens", "video_max_pixels": "video tokens",
    "shift_attn": "S^2-attention", "rope_scaling": "RoPE scaling", "moe_aux_loss_coef": None,
    "fsdp": "FSDP through transformers' Trainer (not read by this reader)",
    "fsdp_config": "FSDP through transformers' Trainer (not read by this reader)",
    "max_grad_norm": None, "torch_compile": "torch.compile changes which activations are kept",
    "train_from_scratch": None,
}


STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")     # finetuning_args.py `stage`: a LLaMA-Factory file's own key


def claims(path: Path, data) -> bool:
    """A YAML mapping with keys only LLaMA-Factory has (finetuning_type, cutoff_len, template, ...)."""
    return (Path(path).suffix.lower() in (".yaml", ".yml") and isinstance(data, dict)
            and bool((OWN_KEYS - {"stage"}) & set(data) or data.get("stage") in STAGES)
            and not {"base_model", "datasets"} & set(data))


def read(path: Path, data, lines: dict[str, int], given: list[Path]) -> Imported:
    return _Reader(path, data, lines, given).read()


class _Reader(collect.TrainerYaml):
    """A LLaMA-Factory YAML, a topic per method, with the DeepSpeed file it names."""

    NAME, TOOL, SRC = NAME, TOOL, SRC
    TOPICS = ("model_named", "stage_method", "quantisation", "sizes", "precision", "checkpointing", "deepspeed",
              "reference_dtype", "optimizer", "adapters", "rest")

    def model_named(self) -> None:
        """The model the config names."""
        c, take, path = self.c, self.take, self.path
        v1 = sorted(V1_KEYS & set(self.data))
        if "model_name_or_path" not in self.data and len(v1) >= 2:
            raise ConfigError(path, f"a LLaMA-Factory v1 config ({', '.join(v1[:4])}: its examples/v1 trainer), "
                                    f"which this package does not read; the v0 format (model_name_or_path, "
                                    f"finetuning_type, per_device_train_batch_size, ...) is read")
        for key in self.data:                     # a misspelt key before a missing one: LLaMA-Factory names it so
            if key not in known_keys():
                _refuse_unknown(path, key)
        named = take("model_name_or_path")
        if named is None:
            raise ConfigError(path, "model_name_or_path is missing (LLaMA-Factory requires it)")
        self.model, self.named = model, named = model_ref.resolve(named, path)
        c.set("model_name_or_path", named, model_ref.sets_words(model))

    def stage_method(self) -> None:
        """Stage and fine-tuning method."""
        c, take, path, lf_default = self.c, self.take, self.path, self.default
        stage = take("stage")
        if stage is None:
            lf_default("stage", "sft", "one model, one sequence per example", "finetuning_args.py")
            stage = "sft"
        elif not isinstance(stage, str) or stage not in STAGES:
            raise ConfigError(path, f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        elif stage in ("pt", "sft"):
            c.set("stage", stage, "one model, one sequence per example")
        elif stage == "dpo":
            c.set("stage", stage, "run=dpo, dpo_logps=log-softmax (chosen and rejected in one forward; the reference "
                                  "model below; train/dpo/trainer.py get_batch_logps)", run="dpo",
                  dpo_logps="log-softmax")
        elif stage == "rm":
            c.set("stage", stage, "run=rm, rm_head=value-head (train/rm/workflow.py: load_model(add_valuehead=True), "
                                  "trl's AutoModelForCausalLMWithValueHead; trainer.py compute_loss: chosen and "
                                  "rejected in one forward, the LM head's logits made and dropped)", run="rm",
                  rm_head="value-head")
        else:
            c.unmodelled("stage", stage, {"kto": "LLaMA-Factory's own KTO trainer (train/kto/trainer.py: a "
                                                 "reference, its KL batch run after the policy's forward, copies of "
                                                 "the fp32 logits per label) is not modelled; estimated as SFT of one "
                                                 "model, or with --run kto as TRL's KTOTrainer, which holds less",
                                          "ppo": "PPO keeps policy, value, reference and reward models; estimated as "
                                                 "SFT of one model"}[stage]
                         + ", so the real figure is higher")
        self.stage = stage
        ft = take("finetuning_type")
        if ft is None:
            lf_default("finetuning_type", "lora", "LoRA (lora_rank, lora_target below)", "finetuning_args.py")
            ft = "lora"
        elif not isinstance(ft, str) or ft not in FULL_LIKE:
            raise ConfigError(path, f"finetuning_type must be full, lora, freeze or oft, got {ft!r}")
        else:
            c.set("finetuning_type", ft, "full fine-tuning" if ft == "full" else ft)
        if ft in ("freeze", "oft"):
            c.unmodelled("finetuning_type", ft, "freeze: only the last freeze_trainable_layers layers train; oft: "
                                                "orthogonal adapters; estimated as full fine-tuning")
        if stage == "dpo":
            self.reference(ft)
        rank, target, dropout = take("lora_rank"), take("lora_target"), take("lora_dropout")
        if ft == "lora":
            self.value_or_default("lora_dropout", dropout, "lora_dropout", 0.0, "finetuning_args.py",
                                  lambda k, v: base.probability(path, k, v))
            self.value_or_default("lora_rank", rank, "lora_rank", 8, "finetuning_args.py", c.integer)
            if isinstance(target, list) and all(isinstance(t, str) for t in target):
                target = ",".join(target)          # finetuning_args.py split_arg: a list is taken as it is
            if target is not None and not isinstance(target, str):
                raise ConfigError(path, f"lora_target must be module names separated by commas (or all), got {target!r}")
            if target is None or str(target).strip() == "all":
                targets = LINEAR_NAMES      # model/adapter.py: find_all_linear_modules, a list of module names
                says = ("every linear module's name but the output head, handed to peft as a list "
                        "(model/model_utils/misc.py find_all_linear_modules): lora_targets=all-linear-names")
                if target is None:
                    lf_default("lora_target", "all", says, "finetuning_args.py", lora_targets=targets)
                else:
                    c.set("lora_target", target, says, lora_targets=targets)
            else:
                targets = base.peft_names(path, "lora_target", ",".join(t.strip() for t in str(target).split(",")
                                                                     if t.strip()))
                c.set("lora_target", target, f"lora_targets={targets}", lora_targets=targets)
        else:
            for key, value in (("lora_rank", rank), ("lora_target", target), ("lora_dropout", dropout)):
                if value is not None:
                    c.ignore(key, value)

    def quantisation(self) -> None:
        """Quantisation."""
        c, take, path = self.c, self.take, self.path
        bits = take("quantization_bit")
        if bits is not None:
            if isinstance(bits, bool) or not isinstance(bits, int) or bits not in (2, 3, 4, 5, 6, 8):
                raise ConfigError(path, f"quantization_bit must be 2, 3, 4, 5, 6 or 8, got {bits!r}")
            method = take("quantization_method", "bnb")
            if method not in QUANTIZATION_METHODS:
                raise ConfigError(path, f"quantization_method must be one of {', '.join(QUANTIZATION_METHODS)} "
                                        f"(LLaMA-Factory's QuantizationMethod), got {method!r}")
            kind = self.data.get("finetuning_type", "lora")
            if kind not in ("lora", "oft"):
                raise ConfigError(path, f"quantization_bit with finetuning_type {kind!r}: LLaMA-Factory refuses it "
                                        f"('Quantization is only compatible with the LoRA or OFT method', "
                                        f"hparams/parser.py)")
            if method == "bnb" and bits not in (4, 8):
                raise ConfigError(path, f"quantization_bit {bits} with bitsandbytes (quantization_method bnb, the "
                                        f"default): LLaMA-Factory refuses it ('Bitsandbytes only accepts 4-bit or "
                                        f"8-bit quantization', model/model_utils/quantization.py); 4 or 8")
            qtype = take("quantization_type", "nf4")
            if qtype not in ("fp4", "nf4"):
                raise ConfigError(path, f"quantization_type must be fp4 or nf4, got {qtype!r}")
            double = take("double_quantization")
            lora = self.c.fields.get("lora_rank") is not None
            if not lora:
                c.unmodelled("quantization_bit", bits, "a quantised base is modelled with LoRA (QLoRA) only; "
                                                       "finetuning_type is not lora here: estimated with the base in "
                                                       "the compute dtype")
                if double is not None:
                    c.ignore("double_quantization", double)
            elif bits == 4 and method == "bnb" and qtype == "nf4":
                weights = "nf4-dq" if double is None or c.flag("double_quantization", double) else "nf4"
                c.set("quantization_bit", bits, f"base_weights={weights} (bitsandbytes 4-bit NF4 base, QLoRA)",
                      base_weights=weights)
                if double is None:
                    self.default("double_quantization", True, "base_weights=nf4-dq (double quantisation)",
                                 "model_args.py", base_weights=weights)
                else:
                    c.set("double_quantization", double, f"base_weights={weights}", base_weights=weights)
            else:
                what = f"{bits}-bit bitsandbytes {qtype}" if method == "bnb" else f"{bits}-bit {method}"
                c.unmodelled("quantization_bit", bits, f"{what} base weights are not modelled; estimated with the "
                                                       f"base in the compute dtype")
                if double is not None:
                    c.unmodelled("double_quantization", double, "belongs to the bitsandbytes 4-bit base above, which "
                                                                "is not modelled")

    def sizes(self) -> None:
        """Sizes."""
        c, take, path, lf_default = self.c, self.take, self.path, self.default
        self.trainer = collect.trainer_sizes(c, take, Path(path).name)
        cutoff = take("cutoff_len")
        if cutoff is None:
            lf_default("cutoff_len", 2048, "seq=2048", "data_args.py", seq=2048)
        else:
            c.set("cutoff_len", cutoff, f"seq={c.integer('cutoff_len', cutoff)} (the longest sequence; shorter ones pad "
                                        f"to the batch's longest)", seq=cutoff)
        packing, neat = take("packing"), take("neat_packing")
        for key, value in (("packing", packing), ("neat_packing", neat)):
            if value is not None:
                c.flag(key, value)
        if packing or neat or (packing is None and self.stage == "pt"):
            key = "neat_packing" if neat else "packing"
            c.set(key, True if packing is None and not neat else (neat or packing),
                  "sequences packed to cutoff_len: every micro batch is full length (seq as above)")
        elif packing is not None:
            c.set("packing", packing, "no packing")

    def precision(self) -> None:
        """Precision."""
        c, take, data, path, lines = self.c, self.take, self.data, self.path, self.lines
        bf16, fp16, pure = take("bf16"), take("fp16"), take("pure_bf16")
        self.pure = pure
        for key, value in (("bf16", bf16), ("fp16", fp16), ("pure_bf16", pure)):
            if value is not None:
                c.flag(key, value)
        if fp16 and c.flag("fp16", fp16) and bf16 and c.flag("bf16", bf16):
            raise ConfigError(path, "bf16 and fp16 both true: transformers' TrainingArguments refuses the pair ('At "
                                    "most one of fp16 and bf16 can be True', training_args.py); keep one")
        if pure:
            c.set("pure_bf16", True, "precision=bf16 (weights, gradients and Adam states in bf16, no fp32 master)",
                  precision="bf16")
        elif bf16:
            c.set("bf16", True, "precision=bf16-mixed", precision="bf16-mixed")
        elif fp16:
            c.set("fp16", True, "precision=fp16-mixed (torch autocast in fp16 with GradScaler)", precision="fp16-mixed")
        else:
            c.default(self.hf, "bf16", False, "transformers/training_args.py TrainingArguments.bf16/fp16", "precision=fp32",
                      precision="fp32")
        for key, value in (("bf16", bf16 or pure), ("fp16", fp16)):
            self.trainer[key] = (bool(value), f"{Path(path).name} line {lines.get(key)}" if key in data else f"{self.hf} default")

    def adapters(self) -> None:
        """LoRA adapters' dtype: LLaMA-Factory casts the trainable parameters to fp32 and gives peft
        autocast_adapter_dtype=True unless pure_bf16 (model/adapter.py init_adapter: cast_trainable_params_to_fp32);
        with pure_bf16 on one GPU or DDP they stay bf16 (under DeepSpeed its bf16 mode decides)."""
        fields = self.c.fields
        if self.pure and fields.get("lora_rank") is not None \
                and strategies.get(fields.get("strategy", "single")).adapter_dtype:
            self.c.default(self.TOOL, "cast_trainable_params_to_fp32", False, "github:hiyouga/LLaMA-Factory@ff6d4d1 "
                           "src/llamafactory/model/adapter.py", "adapter_dtype=bf16 (pure_bf16: the adapters stay "
                           "bf16, get_peft_model(autocast_adapter_dtype=False))", adapter_dtype="bf16")

    def checkpointing(self) -> None:
        """Checkpointing, kernels, attention."""
        c, take, path, lf_default = self.c, self.take, self.path, self.default
        off = take("disable_gradient_checkpointing")
        if off is None:
            lf_default("disable_gradient_checkpointing", False, "checkpointing=full (LLaMA-Factory enables it "
                       "unless disabled: model/model_utils/checkpointing.py prepare_model_for_training)", "model_args.py",
                       checkpointing="full")
        else:
            on = not c.flag("disable_gradient_checkpointing", off)
            c.set("disable_gradient_checkpointing", off, f"checkpointing={'full' if on else 'none'}",
                  checkpointing="full" if on else "none")
        liger = take("enable_liger_kernel")
        if liger is not None and self.stage == "rm" and c.flag("enable_liger_kernel", liger):
            c.unmodelled("enable_liger_kernel", liger, "Liger's kernels on a reward model: its fused cross-entropy "
                                                       "needs labels, which the value-head model is not given, so the "
                                                       "LM head's logits are made in full (as estimated); its RMSNorm/"
                                                       "SwiGLU/RoPE kernels are not modelled")
        elif liger is not None:
            c.set("enable_liger_kernel", liger, f"fused_ce={c.flag('enable_liger_kernel', liger)} (Liger's fused linear "
                                                f"cross-entropy: no full logits)", fused_ce=liger)
        attn = take("flash_attn")
        if attn is None:
            lf_default("flash_attn", "auto", "attention=sdpa (auto: transformers' default implementation)", "model_args.py")
        elif not isinstance(attn, str) or attn not in ATTENTION:
            raise ConfigError(path, f"flash_attn must be auto, sdpa, fa2 or disabled, got {attn!r}")
        else:
            c.set("flash_attn", attn, f"attention={ATTENTION[str(attn)]}", attention=ATTENTION[str(attn)])

    def deepspeed(self) -> None:
        """DeepSpeed (after the trainer values it takes "auto" from)."""
        c, take, path = self.c, self.take, self.path
        ds, pure = take("deepspeed"), self.pure
        accelerate.launcher(c, path, self.given, self.trainer, model_ref.hidden_size(self.model),
                         own_deepspeed="deepspeed" in self.data)
        if ds is not None:
            collect.companion_deepspeed(c, ds, self.given, self.trainer, model_ref.hidden_size(self.model))
            if pure and c.fields.get("strategy") == "zero3":
                raise ConfigError(path, "pure_bf16 is incompatible with DeepSpeed ZeRO-3 (LLaMA-Factory refuses it, "
                                        "hparams/parser.py)")
            if pure:
                if strategies.get(c.fields.get("strategy", "single")).deepspeed:
                    c.unmodelled("pure_bf16", True, "DeepSpeed's bf16 mode keeps fp32 master weights and Adam states "
                                                    "whatever the model's dtype: estimated as bf16-mixed")
                    c.fields["precision"] = "bf16-mixed"
                else:
                    c.fields["precision"] = "bf16"
        self.strategy = c.fields.get("strategy", "single")

    def optimizer(self) -> None:
        """Optimizer."""
        c, take = self.c, self.take
        collect.take_optimizer(c, take, self.strategy, origin=self.hf)

    def reference(self, ft: str) -> None:
        """DPO's reference (finetuning_args.py use_ref_model, train/trainer_utils.py create_ref_model): none for the
        reference-free losses (pref_loss orpo, simpo); a model named by ref_model is loaded as a copy, LoRA or not;
        else a LoRA run's reference is its base with the adapters disabled and a full fine-tune's a copy."""
        c, take, path = self.c, self.take, self.path
        loss, ref = take("pref_loss"), take("ref_model")
        if loss is None:
            self.default("pref_loss", "sigmoid", "a reference in the step", "finetuning_args.py")
        elif loss not in PREF_LOSSES:
            raise ConfigError(path, f"pref_loss must be one of {', '.join(PREF_LOSSES)} (finetuning_args.py; "
                                    f"LLaMA-Factory refuses another), got {loss!r}")
        elif loss in ("orpo", "simpo"):
            c.set("pref_loss", loss, "reference=none (a reference-free loss: use_ref_model false)", reference="none")
            return
        else:
            c.set("pref_loss", loss, "a reference in the step")
        if ref is not None:
            c.set("ref_model", ref, "reference=copy (a second model loaded frozen, LoRA or not)", reference="copy")
        self.ref_copy = ("ref_model", ref) if ref is not None else ("stage", "dpo") if ft != "lora" else None
        for key in ("ref_model_adapters", "ref_model_quantization_bit"):
            value = take(key)
            if value is not None:
                c.unmodelled(key, value, "the reference's own adapters or quantisation are not modelled: counted as "
                                         "a full copy in the compute dtype, so the real figure is lower")

    def reference_dtype(self) -> None:
        """A reference copy without DeepSpeed: LLaMA-Factory loads it in the checkpoint's dtype (model/loader.py
        torch_dtype "auto"; is_trainable False: no fp32 upcast), where the estimate counts the policy's load dtype."""
        copy = getattr(self, "ref_copy", None)
        if copy and not strategies.get(self.strategy).deepspeed:
            self.c.unmodelled(copy[0], copy[1],
                              f"LLaMA-Factory loads the reference in the checkpoint's dtype (torch_dtype auto, bf16 "
                              f"for most checkpoints; DeepSpeed's stage 0 casts it to bf16 too); with strategy "
                              f"{self.strategy} the estimate counts it as the policy is loaded (fp32 for bf16 mixed "
                              f"precision): the real figure is lower by up to 2 bytes per parameter")

    def rest(self) -> None:
        """Everything else."""
        c, done, data = self.c, self.done, self.data
        for key, value in data.items():
            if key in done:
                continue
            if collect.evaluation(c, key, value) or collect.saves(c, key, value):   # evaluation listed when on
                continue
            if key in NOT_MODELLED and NOT_MODELLED[key]:
                c.unmodelled(key, value, NOT_MODELLED[key])
            else:
                collect.refuse_misspelt(self.path, key, done, TOOL)
                _refuse_unknown(self.path, key)
                c.ignore(key, value)
