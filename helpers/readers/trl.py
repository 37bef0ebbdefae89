"""Reader of a TRL command-line YAML (`trl sft --config run.yaml`, or a script parsed with TrlParser): the keys of
TrainingArguments / SFTConfig (or DPOConfig) and ModelConfig in one mapping; with its `deepspeed:` JSON, and with the
accelerate config it is launched under (`accelerate launch --config_file acc.yaml`).

Pairing with accelerate: `helpers.readers.read(["run.yaml", "acc.yaml"])` (either order) reads the TRL file as the
run's config and takes every given accelerate YAML as its companion: the accelerate file gives the strategy
(distributed_type, its DeepSpeed or FSDP section) and the world size (num_processes); the TRL file gives the model,
sizes and precision (TrainingArguments' bf16/fp16 win over accelerate's mixed_precision, as in transformers).

Defaults, read from github:huggingface/trl at commit f2cd577 (2026-07-24, version 1.10.0.dev0):
- `trl/trainer/base_config.py`: gradient_checkpointing True (TRL's own default; transformers' is off), bf16 None ->
  True unless fp16, use_liger_kernel False;
- `trl/trainer/sft_config.py`: max_length 1024, packing False, padding_free False;
- `trl/trainer/model_config.py` (ModelConfig): dtype "float32", attn_implementation None (transformers chooses:
  sdpa), use_peft False, lora_r 16, lora_target_modules None (peft's default for the model type: q_proj and v_proj
  for llama, mistral, qwen2, gemma -- peft utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING),
  load_in_4bit False with bnb_4bit_quant_type "nf4", load_in_8bit False;
- per_device_train_batch_size 8, gradient_accumulation_steps 1, optim: transformers' TrainingArguments (installed).
"""

from __future__ import annotations

import functools
from pathlib import Path

from helpers.estimate import loading
from helpers.readers import accelerate, base, collect, hf_names, model_ref
from helpers.readers.base import ConfigError, Imported
from helpers.readers.provenance import Record, boolean
from helpers.training import COMPLETION_DEFAULT, PROMPT_ASSUMED

NAME = "trl"
TOOL = "TRL 1.10.0.dev0 (commit f2cd577)"
TRL_RELEASE = "trl=1.10.0"    # the release whose loss rules (helpers.versions 'trl_*') a file's run is estimated at
SRC = "github:huggingface/trl@f2cd577 trl/trainer/"
TRAINING_KEYS = {"model_name_or_path", "per_device_train_batch_size", "gradient_accumulation_steps", "max_length",
                 "max_seq_length", "use_peft", "lora_r", "dataset_name", "output_dir", "gradient_checkpointing",
                 "learning_rate", "num_train_epochs"}
ATTENTION = hf_names.ATTENTION
PEFT_QV = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma2"}
DPO_KEYS = {"beta", "loss_type", "max_prompt_length", "precompute_ref_log_probs", "ref_model_init_kwargs",
            "rpo_alpha", "reference_free", "sync_ref_model"}
# KTOConfig's own keys and loss types (kto_config.py @f2cd577): any of them makes the file a KTO run (KTOTrainer)
KTO_KEYS = {"desirable_weight", "undesirable_weight"}
KTO_LOSSES = ("kto", "apo_zero_unpaired")
DPO_0X_KEYS = {"max_prompt_length", "rpo_alpha"}    # DPOConfig fields of TRL 0.x, gone in 1.x (the script drops them)
# SFTConfig.loss_type's values (sft_config.py @f2cd577): a loss_type among them is an SFT file's, not a DPO one's
SFT_LOSSES = ("nll", "dft", "chunked_nll")
# DPOConfig.loss_type's values (dpo_config.py @f2cd577; a list of them combines losses)
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
# GRPOConfig's own keys (trl/trainer/grpo_config.py @f2cd577): any of them makes the file a GRPO run
GRPO_KEYS = {"num_generations", "max_completion_length", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
             "num_iterations", "epsilon", "reward_funcs", "scale_rewards", "mask_truncated_completions",
             "importance_sampling_level", "generation_batch_size", "steps_per_generation", "vllm_enable_sleep_mode",
             "ds3_gather_for_generation"}
GRPO_SRC = "grpo_config.py GRPOConfig"
VLLM_KEYS = {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode"}
REF_SYNC_KEYS = ("sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha")     # GRPOConfig's (and DPO's)
# RewardConfig's own key (trl/trainer/reward_config.py @f2cd577): the file is a reward model's (`trl reward`)
REWARD_KEYS = {"center_rewards_coefficient"}
# ModelConfig.lora_task_type's value for a sequence classifier (model_config.py @f2cd577; default CAUSAL_LM): TRL's
# reward docs and script pass it, and no other TRL trainer trains a sequence classifier
REWARD_TASK = "SEQ_CLS"
REWARD_SRC = "reward_config.py RewardConfig, reward_trainer.py RewardTrainer"
NOT_MODELLED = {
    "use_dora": "DoRA adds a magnitude vector and a weight-norm per adapted layer: the real figure is higher",
    "lora_modules_to_save": "modules trained in full beside LoRA (a trainable copy of each, with its gradient and "
                            "optimizer states): the real figure is higher",
    "torch_compile": "torch.compile changes which activations are kept",
    "gradient_checkpointing_kwargs": "checkpointing options (use_reentrant)",
    "activation_offloading": "activations offloaded to host memory: the real figure is lower",
    "tp_size": "tensor parallelism", "context_parallel_size": "context parallelism",
}


def claims(path: Path, data) -> bool:
    """A YAML mapping of TrainingArguments / ModelConfig keys, not accelerate's own file."""
    return (Path(path).suffix.lower() in (".yaml", ".yml") and isinstance(data, dict)
            and not {"distributed_type", "compute_environment"} & set(data)
            and not {"base_model", "sequence_len", "micro_batch_size"} & set(data)      # axolotl's own keys
            and bool(TRAINING_KEYS & set(data)))


def read(path: Path, data, lines: dict[str, int], given: list[Path]) -> Imported:
    return _Reader(path, data, lines, given).read()


# TRL's own keys the reader reads, with the type of their dataclass field (trl/trainer/sft_config.py, grpo_config.py,
# model_config.py at TOOL's version); TrainingArguments' own come from transformers' HfArgumentParser.
TRL_TYPES = {"use_peft": bool, "lora_r": int, "lora_alpha": int, "lora_dropout": float, "max_length": int,
             "max_seq_length": int, "max_completion_length": int, "max_prompt_length": int, "use_vllm": bool,
             "load_in_4bit": bool, "load_in_8bit": bool, "use_bnb_nested_quant": bool, "num_generations": int,
             "vllm_gpu_memory_utilization": float, "beta": float, "packing": bool}
NOT_NONE = ("per_device_train_batch_size", "gradient_accumulation_steps", "lora_r")


@functools.cache
def _training_argument_types() -> dict:
    """TrainingArguments' fields -> the argparse type HfArgumentParser gives them (string_to_bool, int, float)."""
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.hf_argparser import string_to_bool

    out = {}
    for a in HfArgumentParser(TrainingArguments)._actions:
        if a.type is string_to_bool:
            out[a.dest] = bool
        elif a.type in (int, float):
            out[a.dest] = a.type
    return out


def as_trl_reads(path, data: dict) -> dict:
    """The values as TrlParser reads a YAML: it makes them argparse defaults, and argparse converts a default given as
    text with the argument's type (transformers' string_to_bool for a bool, int, float), so a quoted 'false' is False
    and '1' is 1, and a text it cannot convert stops the run. A null bool is None, which the Trainer takes as off; a
    null batch size or accumulation fails in the Trainer."""
    from transformers.hf_argparser import string_to_bool

    types = _training_argument_types() | TRL_TYPES
    out = dict(data)
    for key, value in data.items():
        kind = types.get(key)
        if kind is None:
            continue
        if isinstance(value, str):
            try:
                out[key] = string_to_bool(value) if kind is bool else kind(value)
            except Exception:
                raise ConfigError(path, f"{key} {value!r}: TRL's parser refuses it (argparse: invalid "
                                        f"{kind.__name__} value)") from None
        elif value is None and kind is bool:
            out[key] = False
        elif value is None and key in NOT_NONE:
            raise ConfigError(path, f"{key} is null: TRL passes None to the Trainer, which needs a number here; give "
                                    f"one or leave the key out")
    return out


class _Reader(collect.TrainerYaml):
    """A TRL config (TrainingArguments, SFTConfig, ModelConfig keys), a topic per method, with the accelerate config
    the run is launched with and the DeepSpeed file it names."""

    NAME, TOOL, SRC = NAME, TOOL, SRC
    TOPICS = ("model_named", "sizes", "precision_keys", "checkpointing", "lora", "quantisation", "engine",
              "grpo_generation_batch", "precision",
              "fsdp_checkpointing", "optimizer", "rest")

    def __init__(self, path, data, lines: dict[str, int], given: list[Path]):
        super().__init__(path, data, lines, given)
        self.data = as_trl_reads(self.path, self.data)
        self.take, self.done = collect.taker(self.data)

    def fsdp_checkpointing(self) -> None:
        """FSDP's own activation checkpointing beside the trainer's: the Trainer refuses the pair."""
        fsdp_ac = any(s.key.endswith("activation_checkpointing") and s.key.startswith("fsdp_config") and s.value is True
                      for s in self.c.settings)
        if fsdp_ac and getattr(self, "gc_on", False):
            raise ConfigError(self.path, "FSDP's activation_checkpointing (fsdp_config) beside the trainer's "
                                         "gradient_checkpointing (TRL's default: true): transformers' Trainer refuses the "
                                         "pair (trainer.py: 'can't both be set to True'); set gradient_checkpointing: "
                                         "false")

    def optimizer(self) -> None:
        """The Trainer's optim (transformers' default where the config leaves it out)."""
        collect.take_optimizer(self.c, self.take, self.strategy, origin=self.hf)

    def model_named(self) -> None:
        """The model the config names; DPO keys noted."""
        c, take, data, path = self.c, self.take, self.data, self.path
        named = take("model_name_or_path")
        self.model, self.named = model, named = model_ref.resolve(named, path)
        if named is None:
            c.unmodelled("model_name_or_path", None, "no model named (a script may pass one itself): pass --model")
        else:
            c.set("model_name_or_path", named, f"model={model}" if model else "model not in the catalogue: pass --model")

        self.grpo = bool((GRPO_KEYS - VLLM_KEYS) & set(data))     # (use_vllm alone: RLOO, online DPO have it too)
        if not self.grpo and VLLM_KEYS & set(data):
            for key in sorted(VLLM_KEYS & set(data)):
                self.done.add(key)
                c.unmodelled(key, data[key], "a generation option (GRPOConfig, RLOOConfig), not SFTConfig's: read as "
                                             "SFT, as no GRPO key (num_generations, max_completion_length, ...) says "
                                             "the file is GRPO's; add one, or pass --run grpo")
        loss_type = data.get("loss_type")
        named = [loss_type] if isinstance(loss_type, str) else loss_type if isinstance(loss_type, list) else []
        unknown = [x for x in named if not isinstance(x, str) or x not in SFT_LOSSES + DPO_LOSSES + KTO_LOSSES]
        if "loss_type" in data and not self.grpo and (unknown or not named):   # (GRPO's own are read with it)
            bad = unknown[0] if unknown else loss_type
            raise ConfigError(path, f"loss_type {bad!r} is none of SFTConfig's ({', '.join(SFT_LOSSES)}), "
                                    f"DPOConfig's ({', '.join(DPO_LOSSES)}) or KTOConfig's ({', '.join(KTO_LOSSES)})"
                              + (base.did_you_mean(bad, SFT_LOSSES + DPO_LOSSES + KTO_LOSSES) if isinstance(bad, str)
                                 else ""))
        sft_loss = isinstance(loss_type, str) and loss_type in SFT_LOSSES
        self.kto = bool(KTO_KEYS & set(data)) or (isinstance(loss_type, str) and loss_type in KTO_LOSSES)
        dpo = sorted(k for k in (DPO_KEYS | KTO_KEYS) & set(data) if not (k == "loss_type" and sft_loss))
        task = data.get("lora_task_type")
        keys = sorted(REWARD_KEYS & set(data)) + (["lora_task_type"] if task == REWARD_TASK else [])
        self.reward = bool(keys) and not self.grpo and not dpo
        if self.reward:
            c.set(keys[0], take(keys[0]), "run=rm (" + ("a RewardConfig key" if keys[0] in REWARD_KEYS else
                                                         "a sequence classifier's LoRA: trl reward's") +
                  "): AutoModelForSequenceClassification with one label, each example's chosen and rejected sequences "
                  "in one forward (the micro batch counts pairs)", run="rm")
            if len(keys) > 1:
                c.set(keys[1], take(keys[1]), "read with run=rm above")
        elif not dpo and not self.grpo:
            self.default("(trainer)", "sft", "SFT; a trl reward file: --run rm (a TRL YAML does not name its "
                         "trainer: read as trl sft's; a reward model's runs twice the sequences, a DPO or KTO run "
                         "keeps a reference model)", "cli.py")
        if dpo and not self.grpo:
            self.dpo(dpo, "kto" if self.kto else "dpo")

    def dpo(self, keys: list[str], run: str) -> None:
        """A DPOConfig or a KTOConfig (dpo_config.py, kto_config.py @f2cd577): run dpo or kto, and a reference model
        unless its log-probs are precomputed (dpo_trainer.py, kto_trainer.py: none either with a PEFT model, which the
        estimate knows from the LoRA rank)."""
        c, take = self.c, self.take
        precompute = take("precompute_ref_log_probs")
        sets = f"run={run} ({run.upper()} keys: {', '.join(k for k in keys if k != 'precompute_ref_log_probs')})"
        c.set(keys[0], self.data[keys[0]], sets, run=run)
        if precompute is None:
            self.default("precompute_ref_log_probs", False, "a reference in the step (copy, or LoRA's base)",
                         f"{run}_config.py {run.upper()}Config")
        elif c.flag("precompute_ref_log_probs", precompute):
            c.set("precompute_ref_log_probs", precompute, "reference=none (log-probs computed before training)",
                  reference="none")
        else:
            c.set("precompute_ref_log_probs", precompute, "a reference in the step (copy, or LoRA's base)")
        for key in sorted(DPO_0X_KEYS & set(self.data)):      # (no memory effect either way)
            c.ignore(key, take(key))
        if "reference_free" in self.data:
            c.unmodelled("reference_free", take("reference_free"),
                         "not a DPOConfig field in TRL 1.x, where it is dropped; TRL 0.x still loaded the reference "
                         "model with it: the reference is counted as the other keys say")

    def sizes(self) -> None:
        """Micro batch, accumulation and sequence length."""
        c, take, data, trl_default, done = self.c, self.take, self.data, self.default, self.done
        self.trainer = collect.trainer_sizes(c, take, self.path.name)
        if self.grpo:
            self.grpo_sizes()
            return
        seq_key = "max_length" if "max_length" in data or "max_seq_length" not in data else "max_seq_length"
        seq = take(seq_key)
        done.add("max_seq_length")
        if seq is None and seq_key == "max_length" and "max_length" in data:
            c.unmodelled("max_length", None, "no truncation: sequences as long as the data's longest; estimated at 1024")
            c.fields["seq"] = 1024
        elif seq is None:
            trl_default("max_length", 1024, "seq=1024", "sft_config.py SFTConfig", seq=1024)
        else:
            c.set(seq_key, seq, f"seq={c.integer(seq_key, seq)}", seq=seq)
            if seq_key == "max_seq_length":             # (an upper bound where the current TRL truncates at 1024)
                c.unmodelled("max_seq_length", seq, "SFTConfig's name before max_length: the current TRL has no such "
                                                    "field and `trl sft` drops it without a word "
                                                    "(fail_with_unknown_args=False), truncating at max_length (1024 "
                                                    "by default); estimated at this value, the older TRL's reading")
        for key in ("packing", "padding_free"):
            value = take(key)
            if value:
                c.set(key, value, "sequences packed / flattened: micro batches are full length (seq as above)")
            elif value is not None:
                c.ignore(key, value)

    def grpo_sizes(self) -> None:
        """A GRPO run (GRPOConfig @f2cd577): each training sequence is a prompt and one of its num_generations
        completions, so the sequence is the prompt's length plus max_completion_length (512 by default); the micro
        batch counts completions. TRL 1.x no longer truncates prompts (max_prompt_length was removed in #4847), so
        the prompt's length is the data's: 512 is assumed (the removed option's default) and said. The reference
        (beta) and the generation (use_vllm and its options) are read with it."""
        c, take, done = self.c, self.take, self.done
        comp = take("max_completion_length")
        if comp is None:
            comp = COMPLETION_DEFAULT
            self.default("max_completion_length", comp, f"completions of up to {comp} tokens (completion={comp})",
                         GRPO_SRC, completion=comp)
        else:
            comp = c.integer("max_completion_length", comp)
        prompt = take("max_prompt_length")
        if prompt is None:
            prompt = PROMPT_ASSUMED
            c.unmodelled("max_prompt_length", None, "TRL 1.x does not truncate GRPO's prompts (max_prompt_length "
                                                    f"was removed, #4847): estimated with {prompt} prompt tokens, the "
                                                    "removed option's default; pass --seq (prompt + completion) for "
                                                    "longer prompts, as the real figure is higher with them")
        else:
            prompt = c.integer("max_prompt_length", prompt)
            c.unmodelled("max_prompt_length", prompt, "removed from GRPOConfig in TRL 1.x (#4847; before, prompts were "
                                                      "truncated to it): TRL 1.10 drops it and keeps prompts whole, "
                                                      "so longer prompts make the real figure higher; estimated with "
                                                      "prompts of this length")
        c.set("max_completion_length", comp, f"seq={prompt + comp} (a prompt of {prompt} + a completion of {comp} "
                                             f"tokens per sequence), completion={comp}", seq=prompt + comp,
              completion=comp)
        for key in ("max_length", "max_seq_length"):
            if key in self.data:
                c.ignore(key, take(key))
        n = take("num_generations")
        sets = "run=grpo: completions per prompt, the micro batch counting completions (per_device_train_batch_size)"
        if n is None:
            self.default("num_generations", 8, sets, GRPO_SRC, run="grpo")
        else:
            c.set("num_generations", n, sets, run="grpo")
        self.grpo_reference()
        self.grpo_generation()
        said = {x.key for x in c.settings + c.not_modelled + c.ignored} | {"generation_batch_size"}
        for key in sorted(GRPO_KEYS | {"loss_type"}):
            if key in self.data and key not in said:
                done.add(key)
                c.ignore(key, self.data[key])              # sampling and loss options: no effect on the step's bytes

    def grpo_reference(self) -> None:
        """GRPOConfig.beta: a KL term against a reference model when above 0.0 (GRPOTrainer.__init__: a frozen copy
        for a full fine-tune, the base with the adapters disabled for a PEFT model), none at 0.0 (the default)."""
        c, take = self.c, self.take
        beta = take("beta")
        if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float))):
            raise ConfigError(self.path, f"beta must be a number (TRL's GRPOConfig.beta: float), got {beta!r}")
        if beta is None:
            self.default("beta", 0.0, "no reference model (beta 0.0)", GRPO_SRC)
        elif float(beta) > 0:
            peft = bool(self.data.get("use_peft"))
            c.set("beta", beta, "a KL term against a reference model: " + (
                "reference=adapters-off (use_peft: the base with the adapters disabled)" if peft else
                "reference=copy (a second, frozen copy of the model, placed as the policy's engine places it)"),
                  reference="adapters-off" if peft else "copy")
        else:
            c.set("beta", beta, "no reference model")
        sync = take("sync_ref_model")
        if sync is not None and boolean(self.path, "sync_ref_model", sync):
            if not beta:
                raise ConfigError(self.path, "sync_ref_model: true with beta 0.0: GRPOTrainer refuses it (no reference "
                                             "model is loaded to synchronize); set beta above 0 or sync_ref_model false")
            if self.data.get("use_peft"):
                raise ConfigError(self.path, "sync_ref_model: true with use_peft: GRPOTrainer refuses it (the PEFT "
                                             "reference is the base with the adapters disabled, nothing to "
                                             "synchronize)")
            c.set("sync_ref_model", sync, "sync_ref: the reference mixed with the policy after a step "
                                          "(SyncRefModelCallback: in place; under ZeRO-3 both gathered whole)",
                  sync_ref=True)
        elif sync is not None:
            c.ignore("sync_ref_model", sync)
        for key in REF_SYNC_KEYS[1:]:
            if key in self.data:
                c.ignore(key, take(key))

    def grpo_generation(self) -> None:
        """use_vllm / vllm_mode / vllm_gpu_memory_utilization / vllm_enable_sleep_mode: what generates the
        completions between steps (GRPOConfig @f2cd577 defaults: False, colocate, 0.3, False)."""
        c, take, path = self.c, self.take, self.path
        vllm, mode = take("use_vllm"), take("vllm_mode")
        vllm = None if vllm is None else boolean(path, "use_vllm", vllm)
        util, sleep = take("vllm_gpu_memory_utilization"), take("vllm_enable_sleep_mode")
        if util is not None and (isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1):
            raise ConfigError(path, f"vllm_gpu_memory_utilization must be a fraction in (0, 1], got {util!r}")
        if mode is not None and mode not in ("colocate", "server"):
            raise ConfigError(path, f"vllm_mode must be 'colocate' or 'server' (GRPOConfig), got {mode!r}")
        sleep = None if sleep is None else boolean(path, "vllm_enable_sleep_mode", sleep)
        if not vllm:
            sets = ("generation=generate (transformers' generate in each process: a KV cache for "
                    "per_device_train_batch_size x steps_per_generation sequences)")
            if vllm is None:
                self.default("use_vllm", False, sets, GRPO_SRC)
            else:
                c.set("use_vllm", vllm, sets)
            for key, value in (("vllm_mode", mode), ("vllm_gpu_memory_utilization", util),
                               ("vllm_enable_sleep_mode", sleep)):
                if value is not None:
                    c.ignore(key, value)
        elif (mode or "colocate") == "server":
            c.set("use_vllm", True, "generation=vllm-server (vLLM on GPUs of its own)", generation="vllm-server")
            c.set("vllm_mode", mode, "read with use_vllm above")
            for key, value in (("vllm_gpu_memory_utilization", util), ("vllm_enable_sleep_mode", sleep)):
                if value is not None:
                    c.ignore(key, value)              # (the server's own flags size it, on its own GPUs)
        else:
            c.set("use_vllm", True, "generation=vllm-colocate (a vLLM engine in each training process)",
                  generation="vllm-colocate")
            if mode is None:
                self.default("vllm_mode", "colocate", "read with use_vllm above (TRL 1.0's default; before, server: "
                                                      "a separate trl vllm-serve, as open-r1's recipes ran it)",
                             GRPO_SRC)
            else:
                c.set("vllm_mode", mode, "read with use_vllm above")
            if util is None:
                self.default("vllm_gpu_memory_utilization", 0.3, "vllm_share=0.3 of each GPU's memory", GRPO_SRC,
                             vllm_share=0.3)
            else:
                c.set("vllm_gpu_memory_utilization", util, f"vllm_share={util:g} of each GPU's memory",
                      vllm_share=float(util))
            if sleep is None:
                self.default("vllm_enable_sleep_mode", False, "vLLM keeps its share through the training step",
                             GRPO_SRC)
            elif sleep:
                c.set("vllm_enable_sleep_mode", True, "vllm_sleep: vLLM's share released during the step",
                      vllm_sleep=True)
            else:
                c.set("vllm_enable_sleep_mode", False, "vLLM keeps its share through the training step")
        tp = take("vllm_tensor_parallel_size")
        if tp is not None and tp != 1 and vllm and (mode or "colocate") == "colocate":
            c.unmodelled("vllm_tensor_parallel_size", tp, "vLLM's weights split over this many GPUs inside the same "
                                                          "share: the share's size is as estimated; only the check "
                                                          "that the share holds vLLM's weights assumes 1")
        elif tp is not None:
            c.ignore("vllm_tensor_parallel_size", tp)
        steps, gbs = take("steps_per_generation"), take("generation_batch_size")
        if steps is not None and gbs is not None:
            raise ConfigError(path, "generation_batch_size and steps_per_generation are both given: GRPOConfig refuses "
                                    "the pair ('can not be both configured at the same time'); keep one")
        if steps is not None:
            c.set("steps_per_generation", steps, f"steps_per_generation={c.integer('steps_per_generation', steps)} "
                                                 f"(micro batches generated at once)", steps_per_generation=steps)
        self.generation_batch = gbs
        for key, why in (("ds3_gather_for_generation", "False generates from ZeRO-3's partitions without gathering "
                                                       "the whole model: estimated gathered, the real figure lower"),
                         ("entropy_coef", "an entropy bonus keeps each chunk's softmax for backward: the real figure "
                                          "higher"),
                         ("cast_lm_head_to_fp32", "the output head in fp32: the real figure higher")):
            value = take(key)
            if value is None:
                continue
            default = {"ds3_gather_for_generation": True, "entropy_coef": 0.0, "cast_lm_head_to_fp32": False}
            if key in default and value == default[key]:
                c.set(key, value, "as estimated")
            else:
                c.unmodelled(key, value, why)

    def grpo_generation_batch(self) -> None:
        """GRPOConfig.generation_batch_size over all processes: steps_per_generation = it / (per-device batch x
        processes), which must divide it (grpo_config.py __post_init__); read once the world size is known."""
        gbs = getattr(self, "generation_batch", None)
        if gbs is None:
            return
        c = self.c
        gbs = c.integer("generation_batch_size", gbs)
        batch, world = c.fields.get("batch", 8), c.fields.get("gpus", 1)
        if gbs % (batch * world):
            raise ConfigError(self.path, f"generation_batch_size ({gbs}) must be divisible by the global batch size "
                                         f"({batch} x {world} processes = {batch * world}), as GRPOConfig requires")
        steps = gbs // (batch * world)
        c.set("generation_batch_size", gbs, f"steps_per_generation={steps} ({gbs} / ({batch} x {world} processes))",
              steps_per_generation=steps)

    def precision_keys(self) -> None:
        """bf16 / fp16 / dtype as the config says them (the precision is decided with the strategy)."""
        c, take, data, lines, trl_default = self.c, self.take, self.data, self.lines, self.default
        self.bf16, self.fp16 = bf16, fp16 = take("bf16"), take("fp16")
        for key, value in (("bf16", bf16), ("fp16", fp16)):
            if value is not None:
                c.flag(key, value)
        if bf16 is None:
            self.bf16 = bf16 = not fp16
            trl_default("bf16", None, f"bf16={bf16} (None -> not fp16)", "base_config.py")
        self.trainer["bf16"] = (bool(bf16), f"{self.path.name} line {lines.get('bf16')}" if "bf16" in data else f"{TOOL} default")
        self.trainer["fp16"] = (bool(fp16), f"{self.path.name} line {lines.get('fp16')}" if "fp16" in data else f"{self.hf} default")
        if bf16 and fp16:
            raise ConfigError(self.path, "bf16 and fp16 are both true: transformers' TrainingArguments refuses that "
                                         "('At most one of fp16 and bf16 can be True'); keep one")
        self.dtype_key = dtype_key = "dtype"      # (TOOL's ModelConfig has no torch_dtype: listed as ignored)
        dtype = take(dtype_key)
        if dtype is not None and dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ConfigError(self.path, f"{dtype_key} must be auto, bfloat16, float16 or float32 (TRL's ModelConfig "
                                         f"choices; loading the model fails on another), got {dtype!r}")
        if dtype == "auto" and self.model is not None:
            from helpers import models

            raw = models.read_config_dict(self.model)
            dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if dtype is None:
            trl_default("dtype", "float32", "weights loaded in fp32", "model_config.py ModelConfig")
            dtype = "float32"
        if "torch_dtype" in self.data:
            self.c.unmodelled("torch_dtype", take("torch_dtype"),
                              "not a field of TRL 1.x's ModelConfig (it is `dtype` there): `trl` has dropped it, so "
                              "the model loads in float32, TRL's default, as estimated; releases before the rename "
                              "read it: name it `dtype` for the dtype it says")
        self.dtype = dtype

    def checkpointing(self) -> None:
        """Gradient checkpointing, Liger kernels, the attention implementation."""
        c, take, path, trl_default = self.c, self.take, self.path, self.default
        gc, ac = take("gradient_checkpointing"), take("activation_checkpointing")
        if ac is not None:              # transformers 5 training_args.py: the new name wins; the old one is its alias
            on = self.gc_on = c.flag("activation_checkpointing", ac)
            c.set("activation_checkpointing", ac, f"checkpointing={'full' if on else 'none'}",
                  checkpointing="full" if on else "none")
            if gc is not None:
                c.ignore("gradient_checkpointing", gc)
        elif gc is None:
            self.gc_on = True
            trl_default("gradient_checkpointing", True, "checkpointing=full", "base_config.py",
                        checkpointing="full")
        else:
            on = self.gc_on = c.flag("gradient_checkpointing", gc)
            c.set("gradient_checkpointing", gc, f"checkpointing={'full' if on else 'none'}",
                  checkpointing="full" if on else "none")
        liger = take("use_liger_kernel")
        if liger is not None and self.grpo and c.flag("use_liger_kernel", liger):
            c.unmodelled("use_liger_kernel", liger, "Liger's fused GRPO loss (LigerFusedLinearGRPOLoss) never makes "
                                                    "the completion's logits: not modelled, they are counted in "
                                                    "full, so the real figure is lower")
        elif liger is not None and self.reward and c.flag("use_liger_kernel", liger):
            c.unmodelled("use_liger_kernel", liger, "Liger's RMSNorm/SwiGLU/RoPE kernels in a reward model are not "
                                                    "modelled (it has no LM head, so no fused cross-entropy): "
                                                    "estimated with transformers' own layers")
        elif liger is not None:
            c.set("use_liger_kernel", liger, f"fused_ce={c.flag('use_liger_kernel', liger)}", fused_ce=liger)
        if self.grpo and "use_liger_loss" in self.data:
            c.unmodelled("use_liger_loss", take("use_liger_loss"),
                         "GRPOConfig's switch before TRL 1.x (now use_liger_kernel): TRL 1.10 drops it, so the "
                         "completion's logits are made in full, as estimated; under the older TRL that read it, "
                         "Liger's fused GRPO loss holds less")
        attn = take("attn_implementation")
        if attn is None:
            trl_default("attn_implementation", None, "attention=sdpa (transformers' default)", "model_config.py")
        elif not isinstance(attn, str):
            raise ConfigError(path, f"attn_implementation must be a name (sdpa, eager, flash_attention_2, ...), "
                                    f"got {attn!r}")
        elif attn in ATTENTION:
            c.set("attn_implementation", attn, f"attention={ATTENTION[str(attn)]}", attention=ATTENTION[str(attn)])
        elif hf_names.attention_known(attn):
            allowed = hf_names.attention_known(attn)
            raise ConfigError(path, f"attn_implementation {attn!r} is none transformers takes ({', '.join(allowed)}, "
                                    f"or a hub kernel org/name): it stops loading the model"
                              + base.did_you_mean(attn, allowed))
        else:
            c.unmodelled("attn_implementation", attn, "attention kernel not modelled: estimated as sdpa")
        if not self.grpo and c.fields.get("run") not in ("dpo", "kto", "rm"):
            self.sft_loss_type(bool(liger))

    def sft_loss_type(self, liger: bool) -> None:
        """SFTConfig.loss_type, as trl_loss_type: what TRL computes for it depends on its release (helpers.versions,
        the 'trl_*' rules; helpers.estimate.sft_loss): the full logits (nll before 1.15), 256 tokens at a time under
        checkpoint (chunked_nll 1.4-1.14, the default from 1.7), or the fused LM head's tiles (every loss_type from
        1.15). With use_liger_kernel and loss_type unset, Liger's fused cross-entropy (fused_ce) instead. dft's
        memory is nll's."""
        value = self.take("loss_type") if "loss_type" in self.data else None
        if value is None and liger:
            return
        self.c.default("(TRL release)", "versions", "1.10.0", "the release this reader follows (TRL_RELEASE)",
                       f"versions={TRL_RELEASE}: its loss rules (--versions trl=X for yours)", versions=TRL_RELEASE)
        if value is None:
            self.default("loss_type", None, "trl_loss_type=unset (the release's default: chunked_nll from 1.7, "
                         "nll before; every loss_type through the fused LM head from 1.15)", "sft_config.py",
                         trl_loss_type="unset")
            return
        if value not in ("nll", "dft", "chunked_nll"):
            raise ConfigError(self.path, f"loss_type {value!r} is none SFTConfig takes (nll, dft, chunked_nll)")
        if liger:
            if value == "chunked_nll":
                self.c.unmodelled("loss_type", value, "chunked_nll with use_liger_kernel: TRL 1.4-1.14 refuses the "
                                  "pair, 1.15 on takes chunked_nll as nll; counted as Liger's fused cross-entropy")
            else:
                self.c.set("loss_type", value, "through Liger's fused cross-entropy (fused_ce)")
            return
        loss = "nll" if value == "dft" else value
        self.c.set("loss_type", value, f"trl_loss_type={loss}" + (" (dft's memory is nll's)" if value == "dft" else ""),
                   trl_loss_type=loss)

    def lora(self) -> None:
        """peft LoRA: rank, targets and dropout."""
        c, take, path = self.c, self.take, self.path
        peft = take("use_peft")
        rank, targets, dropout = take("lora_r"), take("lora_target_modules"), take("lora_dropout")
        if peft is not None and boolean(path, "use_peft", peft):
            c.set("use_peft", peft, "LoRA (lora_r, lora_target_modules below)")
            self.value_or_default("lora_dropout", dropout, "lora_dropout", 0.05, "model_config.py ModelConfig",
                                  lambda k, v: base.probability(path, k, v))
            self.value_or_default("lora_r", rank, "lora_rank", 16, "model_config.py", c.integer)
            if targets is None:
                from helpers import models

                mtype = models.spec(self.model).model_type if self.model else None
                if mtype in PEFT_QV:
                    c.default("peft", "lora_target_modules", None,
                              "peft utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING",
                              f"lora_targets=q_proj,v_proj (peft's default for {mtype})", lora_targets="q_proj,v_proj")
                else:
                    c.unmodelled("lora_target_modules", None, f"peft's default targets for model type {mtype!r} are not "
                                                              f"known here: estimated on every linear layer")
            else:
                if not isinstance(targets, str) and not (isinstance(targets, list)
                                                         and all(isinstance(t, str) for t in targets)):
                    raise ConfigError(path, f"lora_target_modules must be module names (a list or comma-separated) or "
                                            f"all-linear, got {targets!r}")
                one = targets[0] if isinstance(targets, list) and len(targets) == 1 else targets
                if isinstance(one, str) and one != "all-linear":
                    # model_config.py ModelConfig.__post_init__: a one-name list becomes that string, and peft reads
                    # one string as a regular expression over whole module names
                    note = " (TRL turns a one-name list into the string)" if isinstance(targets, list) else ""
                    joined = base.peft_regex(path, "lora_target_modules", one, self.model, note)
                    c.set("lora_target_modules", targets, f"lora_targets={joined} (a regular expression to peft; "
                                                          f"in every layer)", lora_targets=joined)
                    return
                joined = "all-linear" if one == "all-linear" else ",".join(str(t).strip() for t in targets)
                if joined != "all-linear":
                    joined = base.peft_names(path, "lora_target_modules", joined)
                c.set("lora_target_modules", targets, f"lora_targets={joined}", lora_targets=joined)
        elif peft is not None or rank is not None or targets is not None:
            for key, value in (("use_peft", peft), ("lora_r", rank), ("lora_target_modules", targets),
                               ("lora_dropout", dropout)):
                if value is not None:
                    c.ignore(key, value)

    def quantisation(self) -> None:
        """A bitsandbytes base (QLoRA)."""
        c, take = self.c, self.take
        q4, q8 = (None if v is None else boolean(self.path, k, v)
                  for k, v in (("load_in_4bit", take("load_in_4bit")), ("load_in_8bit", take("load_in_8bit"))))
        if q4 and q8:
            raise ConfigError(self.path, "load_in_4bit and load_in_8bit both true: TRL refuses the pair ('You can't use "
                                         "8 bit and 4 bit precision at the same time', trainer/model_config.py); keep "
                                         "one")
        if q4:
            given_type = "bnb_4bit_quant_type" in self.data
            qtype = take("bnb_4bit_quant_type", "nf4")
            if qtype not in ("nf4", "fp4"):          # bitsandbytes functional.py quantize_4bit: these two or an error
                raise ConfigError(self.path, f"bnb_4bit_quant_type must be nf4 or fp4 (bitsandbytes stops on another "
                                             f"when it quantizes the base), got {qtype!r}")
            nested = take("use_bnb_nested_quant")
            if given_type and qtype == "nf4":
                c.set("bnb_4bit_quant_type", qtype, "NF4 codes (as modelled)")
            if qtype == "nf4":
                weights = "nf4-dq" if nested is not None and c.flag("use_bnb_nested_quant", nested) else "nf4"
                c.set("load_in_4bit", True, f"base_weights={weights} (bitsandbytes 4-bit, QLoRA)", base_weights=weights)
                if nested is None:
                    self.default("use_bnb_nested_quant", False, "base_weights=nf4 (no double quantisation)",
                                 "model_config.py", base_weights=weights)
                else:
                    c.set("use_bnb_nested_quant", nested, f"base_weights={weights}", base_weights=weights)
            else:
                c.unmodelled("load_in_4bit", True, f"4-bit {qtype} base weights are not modelled: estimated with the "
                                                   f"base in the compute dtype")
                if nested is not None:
                    c.ignore("use_bnb_nested_quant", nested)
        if q8:
            c.unmodelled("load_in_8bit", True, "8-bit base weights are not modelled: estimated in the compute dtype")

    def engine(self) -> None:
        """The accelerate config the run is launched with, then the DeepSpeed file or FSDP the config names."""
        c, take, path = self.c, self.take, self.path
        hidden = model_ref.hidden_size(self.model)
        accelerate.launcher(c, path, self.given, self.trainer, hidden, own_deepspeed="deepspeed" in self.data)
        ds = take("deepspeed")
        if ds is not None:
            collect.companion_deepspeed(c, ds, self.given, self.trainer, hidden)
        fsdp = take("fsdp")
        if fsdp:
            _fsdp(c, fsdp, take("fsdp_config") or {})
        self.strategy = c.fields.get("strategy", "single")
        acc = take("accelerator_config")            # transformers 5.23 AcceleratorConfig.gradient_accumulation_kwargs
        kwargs = acc.get("gradient_accumulation_kwargs") if isinstance(acc, dict) else None
        if isinstance(kwargs, dict) and "sync_each_batch" in kwargs:
            on = boolean(path, "accelerator_config.gradient_accumulation_kwargs.sync_each_batch",
                         kwargs["sync_each_batch"])
            when = "every micro batch" if on else "at the last micro batch, no_sync before"
            c.set("accelerator_config", acc, f"sync_each_batch={on} (FSDP: gradients reduced {when})",
                  sync_each_batch=on)
        elif acc is not None:
            c.ignore("accelerator_config", acc)

    def precision(self) -> None:
        """The precision, decided after the strategy: DeepSpeed keeps fp32 masters in its bf16 mode."""
        c, data, bf16, fp16, dtype, dtype_key = self.c, self.data, self.bf16, self.fp16, self.dtype, self.dtype_key
        from helpers import strategies

        if "bf16" in data and not (fp16 and bf16 is False):
            c.set("bf16", bf16, "autocast in bf16 (with the dtype below)" if bf16 else "no bf16 autocast")
        # bf16 weights (dtype) train as bf16 whether or not bf16 autocast runs over them (no fp32 master either way)
        pure = not fp16 and dtype in ("bfloat16", "bf16") and strategies.get(self.strategy).torch_optimizer
        if pure:
            c.set(dtype_key, dtype, "precision=bf16 (bf16 weights, gradients and AdamW states; no fp32 master)",
                  precision="bf16")
        elif dtype_key in data:
            c.set(dtype_key, data[dtype_key], f"weights loaded in {dtype}")
        if fp16:
            c.set("fp16", True, "precision=fp16-mixed (torch autocast in fp16 with GradScaler)", precision="fp16-mixed")
        elif not pure:
            c.fields.setdefault("precision", "bf16-mixed" if bf16 else "fp32")
            if strategies.get(self.strategy).engine != "deepspeed":
                c.fields["precision"] = "bf16-mixed" if bf16 else "fp32"
        if dtype in ("float32", "fp32") and (bf16 or fp16) and c.fields.get("lora_rank") is not None:
            self.fp32_base(dtype_key, dtype)
        load = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype)
        if strategies.get(self.strategy).deepspeed and not c.fields.get("base_weights") and load:
            self.also_sets(dtype_key, f"weights loaded in {load}, cast by DeepSpeed", load_dtype=load)

    def spec(self):
        """The named model's ModelSpec, or None where there is none or the catalogue cannot read it (an entry then
        says what it says without a figure)."""
        from helpers import models
        from helpers.errors import InputError

        try:
            return models.spec(self.model) if self.model else None
        except InputError:
            return None

    def also_sets(self, key: str, sets: str, **fields) -> None:
        """The entry already made for `key` (a setting, or TRL's default) also sets `fields`, saying `sets`."""
        import dataclasses

        c = self.c
        c.fields.update(fields)
        entries = c.settings if key in self.data else c.defaults
        for i, e in enumerate(entries):
            if e.key == key:
                entries[i] = dataclasses.replace(e, sets=sets, fields={**e.fields, **fields})

    def fp32_base(self, key: str, dtype: str) -> None:
        """LoRA (or QLoRA) on a base TRL loads in float32 (its default dtype), trained under 16-bit autocast. On
        single and ddp a LoRA base is modelled as it is (base_weights=fp32: 4 bytes per frozen weight, and the 16-bit
        copy autocast makes of each for its matmul, which the linear keeps for backward); a QLoRA base's unquantised
        parts in fp32, or an fp32 base under an engine that shards or re-casts it, is listed with the bytes it adds at
        least."""
        from helpers import strategies
        from helpers.estimate import quantized
        from helpers.units import to_gib

        c = self.c
        qlora, st = bool(c.fields.get("base_weights")), strategies.get(self.strategy)
        if not qlora and st.engine == "deepspeed":
            return      # DeepSpeed's bf16/fp16 mode casts the whole module (engine.py _configure_distributed_model)
        if not qlora and st.autocast:
            self.also_sets(key, "base_weights=fp32 (LoRA on a float32 frozen base under autocast: 4 bytes per frozen "
                                "weight, and each linear keeps the 16-bit copy autocast makes of its weight)",
                           base_weights="fp32")
            return
        m = self.spec()
        extra = ""
        if m is not None:          # (the world size may still change: --gpus is applied after the files are read)
            n = m.params - sum(t.numel for t in quantized.nf4_tensors(m)) if qlora else m.params
            extra = (f" ({to_gib(2 * n):.2f} GiB per GPU for {m.name})" if qlora else
                     f" ({to_gib(2 * n):.2f} GiB for {m.name} in all, divided over the GPUs that shard it)")
        what = "the unquantised embedding, norms and head" if qlora else "the frozen base's shard on each GPU"
        how = ", and the 4-bit matmuls compute in fp32 (bnb_4bit_compute_dtype is the dtype)" if qlora else ""
        where = self.path if key in self.data else f"{TOOL} default"
        c.unmodelled_at(where, self.lines.get(key), key, dtype,
                        f"{'QLoRA' if qlora else 'LoRA'} on a base loaded in float32 (TRL's default dtype) under "
                        f"16-bit autocast is not modelled{'' if qlora else ' on ' + self.strategy}: {what} is fp32, "
                        f"and the estimate counts it in the compute dtype, so the real figure is higher by at least "
                        f"2 bytes per such parameter{extra}{how}; dtype: bfloat16 trains as estimated")

    def rest(self) -> None:
        """Every key not read above: not modelled (listed) or ignored."""
        c, data, done = self.c, self.data, self.done
        if "env" in data and not isinstance(data["env"], dict):      # scripts/utils.py TrlParser
            raise ConfigError(self.path, f"env must be a mapping of environment variables (TRL's parser stops: "
                                         f"'`env` field should be a dict'), got {data['env']!r}")
        for key, value in data.items():
            if key in done or (key in DPO_KEYS | KTO_KEYS and not self.grpo) or collect.evaluation(c, key, value) or collect.saves(c, key, value):
                continue
            if key in NOT_MODELLED:
                c.unmodelled(key, value, NOT_MODELLED[key])
            else:
                collect.refuse_misspelt(self.path, key, done | DPO_KEYS | KTO_KEYS | REWARD_KEYS | GRPO_KEYS, TOOL)
                c.ignore(key, value)


def _fsdp(c: Record, fsdp, config: dict) -> None:
    """transformers' own FSDP options (`fsdp: "full_shard auto_wrap"`, `fsdp_config: {version: 2, ...}`)."""

    if not isinstance(fsdp, (str, list)) or (isinstance(fsdp, list) and not all(isinstance(w, str) for w in fsdp)):
        raise ConfigError(c.path, f"fsdp must be FSDP options as a string or a list (e.g. \"full_shard auto_wrap\"), "
                                  f"got {fsdp!r}")
    words = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
    if not isinstance(config, dict):
        raise ConfigError(c.path, f"fsdp_config must be a mapping, got {config!r}")
    strategies = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
    for w in words:                         # transformers 5.23 training_args.py (_process_fsdp_args): these or an error
        if w.upper() not in strategies and w not in ("offload", "auto_wrap"):
            raise ConfigError(c.path, f"fsdp option {w!r} is none of transformers' (full_shard, shard_grad_op, "
                                      f"no_shard, hybrid_shard, hybrid_shard_zero2, offload, auto_wrap): its "
                                      f"TrainingArguments stop on it ('Unknown `fsdp` option')")
    version = config.get("version", config.get("fsdp_version"))
    if version is None:
        version = 2
        c.default("transformers 5.23.0", "fsdp_config.version", 2, "training_args.py: int(fsdp_config.get('version', "
                  "2)): FSDP2 unless the file asks for version 1")
    if version == 2 and any(w.upper() in strategies[2:] for w in words):
        raise ConfigError(c.path, f"fsdp {fsdp!r} under FSDP2 (fsdp_config version 2, transformers' default): only "
                                  f"full_shard and shard_grad_op exist there, and transformers stops ('only available "
                                  f"with FSDP1'); set fsdp_config version: 1 or use full_shard")
    c.set("fsdp", fsdp, f"strategy=fsdp{2 if version == 2 else 1} (fsdp_config version {version})",
          strategy="fsdp2" if version == 2 else "fsdp1")
    if version == 2:                                 # the Trainer builds accelerate's FSDP plugin
        accelerate.reduce_in_bf16(c)
    # training_args.py _apply_legacy_fsdp_to_config: the first sharding word sets fsdp_config reshard_after_forward
    # (setdefault: a value the file gives there wins); FSDP2 reads it as a bool, FSDP1 as a strategy name
    key, shard = "fsdp_config.reshard_after_forward", config.get("reshard_after_forward")
    if shard is None:
        key, shard = "fsdp", next((w.lower() for w in words if w.upper() in strategies), None)
    if shard is None:
        return _fsdp_rest(c, config, version, words, fsdp)
    if version == 2:
        if isinstance(shard, str) and shard.lower() in ("full_shard", "shard_grad_op") and key == "fsdp":
            shard = shard.lower() == "full_shard"
        on = boolean(c.path, key, shard)
        c.set(key, shard, f"reshard_after_forward={on}", reshard_after_forward=on)
    else:
        name = str(shard).upper()
        if name not in strategies:
            raise ConfigError(c.path, f"{key} {shard!r} under FSDP1 is none of its sharding strategies (full_shard, "
                                      f"shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2)")
        if name == "NO_SHARD":
            c.unmodelled(key, shard, "FSDP1's NO_SHARD (every state replicated, as DDP) is not modelled: estimated as "
                                     "full shard")
        else:
            hybrid, raf = name.startswith("HYBRID"), name in ("FULL_SHARD", "HYBRID_SHARD")
            c.set(key, shard, f"hybrid_shard={hybrid}, reshard_after_forward={raf}", hybrid_shard=hybrid,
                  reshard_after_forward=raf)
    _fsdp_rest(c, config, version, words, fsdp)


def _fsdp_rest(c: Record, config: dict, version, words: list, fsdp) -> None:
    """The rest of transformers' FSDP options: offload, checkpointing, saves, loading, use_orig_params."""
    if "offload" in words:
        c.set("fsdp", fsdp, "offload_optimizer=True, offload_params=True (offload)", offload_optimizer=True,
              offload_params=True)
    if config.get("activation_checkpointing"):
        c.set("fsdp_config.activation_checkpointing", True, "checkpointing=full", checkpointing="full")
    if "state_dict_type" in config:      # training_args.py: fsdp_plugin_args["state_dict_type"], FULL_STATE_DICT unset
        sharded = base.fsdp_sharded_save(c.path, "fsdp_config.state_dict_type", config["state_dict_type"])
        c.set("fsdp_config.state_dict_type", config["state_dict_type"], f"sharded_save={sharded}", sharded_save=sharded)
    if "cpu_ram_efficient_loading" in config:
        on = boolean(c.path, "fsdp_config.cpu_ram_efficient_loading", config["cpu_ram_efficient_loading"])
        c.set("fsdp_config.cpu_ram_efficient_loading", on, loading.ram_efficient_words(on))
    if version != 2:                     # training_args.py: FSDP1 reads use_orig_params, "true" where it is unset
        if "use_orig_params" in config:
            on = boolean(c.path, "fsdp_config.use_orig_params", config["use_orig_params"])
            c.set("fsdp_config.use_orig_params", on, f"use_orig_params={on}", use_orig_params=on)
        else:
            c.default("transformers 5.23.0", "fsdp_config.use_orig_params", True, "training_args.py: "
                      "str_to_bool(fsdp_config.get('use_orig_params', 'true')) under FSDP1", use_orig_params=True)
