"""TrainSetup: one training set-up (precision, optimizer, strategy, offload, sizes), and its validation.

Every option has one owner here; the estimator, the runners and the command line all take a TrainSetup.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import InitVar, dataclass, field

from helpers import strategies
from helpers import versions as library_versions
from helpers.degrees import Degrees
from helpers.errors import InputError

PRECISIONS = ("bf16", "bf16-mixed", "fp16-mixed", "fp32")
ADAM_IMPLS = ("foreach", "fused", "for-loop")
OPTIMIZERS = ("adamw", "adamw-8bit")
STRATEGIES = strategies.NAMES
ATTENTIONS = ("eager", "sdpa", "flash")
CHECKPOINTING = ("none", "full", "selective")
RUNS = ("sft", "dpo", "kto", "rm", "grpo")  # what is trained: next-token SFT, DPO (chosen + rejected, a reference
#                                      model), KTO (unpaired, a reference model and a KL batch), a reward model
#                                      (chosen + rejected, a score head instead of the LM head), GRPO
PAIRED_RUNS = ("dpo", "rm")    # runs whose micro batch counts pairs: each example's chosen and rejected in one forward
LOGPS_RUNS = ("dpo", "kto", "grpo")   # runs whose loss is taken from log-probabilities outside the model's forward
PREFERENCE_RUNS = ("dpo", "kto")      # runs whose step scores its batch with the reference model (TRL's)
GENERATIONS = ("generate", "vllm-colocate", "vllm-server")   # GRPO's generation engine (TRL use_vllm, vllm_mode)
COMPLETION_DEFAULT = 512       # TRL 1.10 GRPOConfig.max_completion_length's default
PROMPT_ASSUMED = 512           # a GRPO prompt's tokens where nothing truncates it (TRL 1.x, axolotl): the default of
#                                the max_prompt_length TRL removed (#4847), said as assumed wherever it is used
GRPO_FIELDS = ("completion", "generation", "vllm_share", "vllm_sleep", "steps_per_generation", "sync_ref",
               "engine_sleep", "vllm_tp", "score_batch")
RM_HEADS = ("score", "value-head")   # a reward model's head: transformers' sequence classifier, trl's value-head model
DPO_LOGPS = ("logsumexp", "log-softmax", "openrlhf")   # log-probabilities: TRL's per-sequence logsumexp, LLaMA-Factory's
REFERENCES = ("copy", "adapters-off", "none")   # DPO's reference: a frozen copy, the LoRA base, or none in the step
TRL_LOSS_TYPES = ("unset", "nll", "chunked_nll")   # TRL SFTConfig.loss_type as given (dft is nll's memory)
ADAPTER_DTYPES = ("fp32", "bf16")
LOAD_DTYPES = ("fp32", "bf16", "fp16", "auto")  # the dtype a script loads the model in (auto: the checkpoint's own)
BASE_WEIGHTS = ("fp32", "nf4", "nf4-dq")  # LoRA's frozen base: fp32 under 16-bit autocast; QLoRA's bitsandbytes 4-bit
QUANTIZED_BASES = ("nf4", "nf4-dq")        # NormalFloat, without / with double quantisation (None: the compute dtype)
MAX_GRAD_ACCUM = 4096         # micro batches per optimizer step (real runs use 1 to a few hundred)
MAX_LAYERS = 1024              # decoder layers (checkpoint_every); the largest models have about 128

# Limits beyond which no real training run goes; past them a figure would be meaningless (or overflow 64-bit sizes
# in a dry run), so they are refused with the allowed range in the message.
MAX_TOKENS = 2**24            # batch x seq per micro batch (16,777,216 tokens; real runs stay well under 2**21)
MAX_GPUS = 2**20              # world size (1,048,576; the largest clusters have a few 10**5 GPUs)
MAX_GPUS_PER_NODE = 1024      # GPUs sharing one host (8 on most servers, 72 on an NVL72 rack)
MIN_GIB, MAX_GIB = 2**-10, 2**20   # a capacity of 1 MiB to 1 PiB per GPU or per node (less rounds to no bytes)
MAX_ELEMENTS = 2**40          # DeepSpeed bucket and sub-group sizes, in elements
FLAGS = ("offload_optimizer", "offload_params", "zero3_init", "save_16bit", "sharded_save", "use_orig_params", "reshard_after_forward", "hybrid_shard", "sync_each_batch", "vllm_sleep", "engine_sleep", "sync_ref", "entropy_kept", "checkpoint_saves", "sharded_load", "pin_memory", "fused_ce", "kv_expanded", "outputs_held", "resume")


@dataclass(frozen=True)
class Control:
    """An explorer control of one TrainSetup field (helpers.explore builds the widget from it)."""

    kind: str
    """'slider' (whole numbers lo..hi), 'steps' (a slider over `options`, plus the value shown), 'menu' (a dropdown
    over `options`), 'check' (a checkbox) or 'gib' (a number box)."""
    label: str
    options: tuple = ()
    lo: int = 1
    hi: int = 64
    none: object = None
    """The control's value that stands for the field's None (0 for no LoRA, 'default' for torch's AdamW default)."""
    tooltip: str = ""
    main: bool = False
    """Shown at once (else under 'more options')."""


@dataclass(frozen=True)
class Face:
    """How one TrainSetup field meets a user: its command-line flag, its explorer control, what `fixes` does with it.
    The CLI (helpers.__main__), the explorer (helpers.explore) and the ways out (helpers.fixes) are generated from
    these, so an option is stated once, on its field."""

    flag: str | None
    """'--batch'; None: no flag (`file_only` says why)."""
    help: str = ""
    choices: object = None
    """The allowed values (a tuple, or a function returning one: the strategy registry)."""
    metavar: str | None = None
    negative: str | None = None
    """A bool's flag that sets it False ('--no-pin-memory'); a bool without one is a switch that sets True."""
    alias: tuple | None = None
    """(flag, value, help): another spelling that sets the field to a value ('--grad-checkpointing' = full)."""
    control: Control | None = None
    applies: object = None
    """A test on the set-up's values (a dict): where it fails, a value the user did not give goes back to the field's
    default (LoRA's targets without a LoRA rank; every-Nth-layer checkpointing without full checkpointing)."""
    elsewhere: object = None
    """Where `applies` fails: the fields (a dict) its value becomes instead of the default, the same fact in the
    terms of the set-up's strategy (a float32 LoRA base is base_weights 'fp32' under autocast and load_dtype 'fp32'
    under DeepSpeed, which casts the module it is given)."""
    remedy: tuple | None = None
    """(name, value): a way out `fixes` tries, setting the field to `value` where it is not already."""
    no_time: str = ""
    """Why `fixes` prices no seconds for changing it (a changed run, not a slower one)."""
    file_only: str = ""


def option(default, face: Face):
    """A TrainSetup field with its Face (dataclasses.field metadata 'face')."""
    return field(default=default, metadata={"face": face})


@dataclass(frozen=True)
class TrainSetup:
    """A training set-up. Sizes are per GPU (micro batch); capacities in GiB (2**30 bytes).

    `grad_checkpointing=True` is accepted as input (older code, files and saved results) and means checkpointing
    'full': checkpointing is one field."""

    batch: int = option(1, Face("--batch", "micro batch per GPU", control=Control(
        "slider", "micro batch", lo=1, hi=64, main=True)))
    """Micro batch per GPU (sequences)."""
    run: str = option("sft", Face(
        "--run", "what the run trains: sft (one model, next-token loss), dpo (TRL's, LLaMA-Factory's and "
                 "OpenRLHF's DPO: each example's chosen and rejected sequences in one forward, and a frozen "
                 "reference model beside the policy), kto (TRL's KTOTrainer, axolotl's rl kto: unpaired examples, "
                 "the reference model and a no-grad forward of a mismatched KL batch through both), rm (a reward "
                 "model: TRL's RewardTrainer, LLaMA-Factory's "
                 "stage rm, OpenRLHF's train_rm: chosen and rejected in one forward, a score head of one output "
                 "instead of the LM head) or grpo (TRL's GRPOTrainer: completions generated between steps, "
                 "--generation, and trained on their log-probabilities, --completion)",
        choices=RUNS, control=Control("menu", "run", options=RUNS, tooltip="dpo: chosen + rejected, and a "
                                                                           "reference model; kto: unpaired, a "
                                                                           "reference and a KL batch; rm: chosen + "
                                                                           "rejected, "
                                                                           "a score head; grpo: generated "
                                                                           "completions"),
        no_time="a DPO, KTO, reward-model or GRPO run trains a different objective; its reference forward's and its "
                "generation's time are not modelled"))
    """'sft': one model trained on next-token prediction. 'dpo': direct preference optimisation: the micro batch's
    chosen and rejected sequences run as one forward of 2 x batch sequences, and a frozen reference model scores them
    (helpers.estimate.reference), as `reference` says. 'kto': TRL 1.10's KTOTrainer: `batch` unpaired sequences, the
    reference as DPO's, and the KL term's mismatched sequences run through the policy and the reference under
    no_grad. 'rm': a reward model (AutoModelForSequenceClassification with
    one label): pairs as DPO's, the decoder's last hidden states through a score head of one output, no vocabulary
    logits (helpers.estimate.reward). 'grpo': TRL 1.10's GRPOTrainer: each sequence is a prompt and
    one generated completion (seq = prompt + `completion` tokens), trained on the completion's log-probabilities;
    completions are generated between steps (`generation`, helpers.estimate.generation)."""
    reference: str | None = option(None, Face(
        "--reference", "with --run dpo, kto or grpo: the reference model: copy (a frozen copy beside the policy: TRL's "
                       "and LLaMA-Factory's full fine-tuning, OpenRLHF always; GRPO with beta > 0), adapters-off (a "
                       "LoRA policy with its adapters disabled: TRL's and LLaMA-Factory's LoRA) or none "
                       "(precompute_ref_log_probs, or a reference-free loss: SimPO, ORPO; GRPO's beta 0.0); default: "
                       "dpo and kto: adapters-off with --lora-rank, else copy; grpo: none (TRL's beta 0.0)",
        choices=REFERENCES, control=Control("menu", "reference", options=("default",) + REFERENCES, none="default",
                                            tooltip="dpo, kto: where the reference log-probabilities come from"),
        applies=lambda v: v["run"] in LOGPS_RUNS,
        remedy=("reference log-probs precomputed (precompute_ref_log_probs)", "none"),
        no_time="precomputing the reference's log-probs moves its forward before training"))
    """With run 'dpo' (or 'kto'), where the reference log-probabilities come from (helpers.estimate.reference): 'copy', a
    frozen copy of the model beside the policy; 'adapters-off', the LoRA policy's own base with its adapters disabled
    (no weights added; needs lora_rank); 'none', no reference forward in the step (log-probs precomputed, or a
    reference-free loss). None: 'adapters-off' with LoRA, else 'copy' (TRL's and LLaMA-Factory's rule); with run
    'grpo', None is 'none' (GRPOConfig.beta 0.0: no reference loaded), and the reference scores completions before
    the step (`_generate_and_score_completions`), not in it."""
    dpo_logps: str = option("logsumexp", Face(
        "--dpo-logps", "with --run dpo or grpo: how the log-probabilities are taken from the logits: logsumexp "
                       "(TRL's selective_log_softmax: a logsumexp per sequence, the logits kept for backward), "
                       "log-softmax (dpo: LLaMA-Factory's get_batch_logps: the whole log_softmax kept for backward) "
                       "or openrlhf (grpo: OpenRLHF's Actor, train_ppo_ray: the whole sequence's logits copied to "
                       "fp32 and held until the step is done, flash-attn's Triton cross-entropy with --attention "
                       "flash, else gather less a chunked logsumexp)",
        choices=DPO_LOGPS, control=Control("menu", "log-probs", options=DPO_LOGPS,
                                           tooltip="TRL's per-sequence logsumexp, LLaMA-Factory's log_softmax or "
                                                   "OpenRLHF's actor"),
        applies=lambda v: v["run"] in ("dpo", "grpo"),
        no_time="the same log-probabilities taken another way: its kernel time is not modelled"))
    """With run 'dpo': 'logsumexp', TRL 1.10's `selective_log_softmax` on fp32 logits (the labels' logits gathered,
    less a logsumexp per sequence; the logits kept for backward); 'log-softmax', LLaMA-Factory's `get_batch_logps`
    (`logits.log_softmax(-1)` gathered; its output kept for backward, the logits until the loss returns). With run
    'grpo': 'logsumexp', TRL's GRPOTrainer; 'openrlhf', OpenRLHF's train_ppo_ray actor (helpers.estimate.
    openrlhf_actor): every position's logits, not the completion's alone, copied to fp32 and kept referenced by the
    output through backward and the optimizer step."""
    entropy_kept: bool = option(False, Face(
        "--entropy-kept", "with --dpo-logps openrlhf: OpenRLHF's --actor.entropy_coef given (0 included): the "
                          "entropy of the whole logits computed with autograd, its softmax kept while the output "
                          "lives (through backward and the step)",
        applies=lambda v: v["run"] == "grpo" and v["dpo_logps"] == "openrlhf",
        remedy=("no entropy logged (--actor.entropy_coef left unset)", False),
        no_time="the entropy's kernels are not timed"))
    """OpenRLHF's `return_entropy` (train_ppo_ray `--actor.entropy_coef` not None): `compute_entropy(logits)` with
    autograd, its softmax (fp32, the logits' size) saved by the graph the output keeps."""
    rm_head: str = option("score", Face(
        "--rm-head", "with --run rm: the reward model's head: score (transformers' sequence classifier: TRL's "
                     "RewardTrainer, OpenRLHF, axolotl) or value-head (trl 0.x's AutoModelForCausalLMWithValueHead "
                     "on the causal LM, LLaMA-Factory's stage rm: the LM head kept, its full logits made in the "
                     "forward with an fp32 copy and dropped)",
        choices=RM_HEADS, applies=lambda v: v["run"] == "rm",
        no_time="the value-head model's LM head projection is not priced"))
    """With run 'rm' (helpers.estimate.reward): 'score', the decoder and a score linear of one output, no LM head;
    'value-head', trl 0.24's AutoModelForCausalLMWithValueHead as LLaMA-Factory loads it: the causal LM whole, a
    value head (dropout 0.1, a linear of hidden x 1 with bias) on its last hidden state, and the LM head's logits
    made in every forward, upcast to fp32 and dropped unused."""
    completion: int | None = option(None, Face(
        "--completion", f"with --run grpo: tokens per generated completion (TRL's max_completion_length; default "
                        f"{COMPLETION_DEFAULT}, or seq - 1 when seq is shorter); --seq is prompt + completion",
        metavar="N", applies=lambda v: v["run"] == "grpo"))
    """With run 'grpo': the completion's tokens, the last `completion` of each sequence of `seq`. GRPOTrainer asks the
    model for the logits of these alone (`logits_to_keep` = completion + 1, transformers' head applied to that slice of
    the hidden states). None: TRL's default, 512, or seq - 1 when seq is shorter."""
    generation: str = option("generate", Face(
        "--generation", "with --run grpo: what generates the completions between steps: generate (transformers' "
                        "model.generate in each training process, TRL's default use_vllm false), vllm-colocate (a "
                        "vLLM engine in each training process holding --vllm-share of its GPU: vllm_mode colocate) "
                        "or vllm-server (vLLM on GPUs of its own: vllm_mode server)",
        choices=GENERATIONS, control=Control("menu", "generation", options=GENERATIONS,
                                             tooltip="grpo: model.generate, vLLM beside training, or a vLLM server"),
        applies=lambda v: v["run"] == "grpo",
        remedy=("generation on vLLM's own GPUs (vllm_mode server)", "vllm-server"),
        no_time="generation's time is not modelled"))
    """With run 'grpo': 'generate', the policy's own `generate` (its KV cache, and under ZeRO-3 the whole model
    gathered: ds3_gather_for_generation); 'vllm-colocate', a vLLM engine in the training process
    (`vllm_gpu_memory_utilization` of the GPU, `vllm_share`); 'vllm-server', a vLLM server on other GPUs (nothing on
    the training GPUs but the weights' broadcast). helpers.estimate.generation."""
    sync_ref: bool = option(False, Face(
        "--sync-ref", "with --run grpo and a reference copy: TRL's sync_ref_model, the reference mixed with the "
                      "policy every ref_model_sync_steps (under ZeRO-3 both gathered whole to do it)",
        applies=lambda v: v["run"] == "grpo" and v["reference"] == "copy",
        no_time="the reference's synchronisation is not timed"))
    """TRL's `sync_ref_model` (trainer/callbacks.py SyncRefModelCallback, on_step_end): in place, except under ZeRO-3,
    where `GatheredParameters(policy + reference)` gathers both models whole on every GPU."""
    steps_per_generation: int | None = option(None, Face(
        "--steps-per-generation", "with --run grpo: micro batches whose completions one generation makes at once "
                                  "(TRL's steps_per_generation; default: --grad-accum, TRL's default)",
        metavar="N", applies=lambda v: v["run"] == "grpo",
        no_time="a larger generation batch changes generation's time, which is not modelled"))
    """With run 'grpo': each process generates batch x steps_per_generation completions at once (GRPOConfig: the
    generation batch is per_device_train_batch_size x processes x steps_per_generation); None: grad_accum."""
    vllm_share: float = option(0.3, Face(
        "--vllm-share", "with --generation vllm-colocate: the fraction of each GPU's total memory vLLM takes for its "
                        "weights, KV cache and CUDA graphs (vllm_gpu_memory_utilization; TRL's default 0.3)",
        metavar="F", applies=lambda v: v["run"] == "grpo" and v["generation"] == "vllm-colocate",
        no_time="a smaller KV cache generates with fewer sequences at once: its time is not modelled"))
    """vLLM's `gpu_memory_utilization`: the engine's budget is this fraction of the GPU's total memory (vLLM
    `gpu_worker.py` requested_memory); needs gpu_gib to become bytes."""
    vllm_sleep: bool = option(False, Face(
        "--vllm-sleep", "with --generation vllm-colocate: vLLM sleeps outside generation, releasing its weights and "
                        "KV cache from the GPU during the training step (TRL's vllm_enable_sleep_mode: level 2, the "
                        "weights dropped; OpenRLHF's --vllm.enable_sleep: level 1, the weights kept on the host)",
        applies=lambda v: v["run"] == "grpo" and v["generation"] == "vllm-colocate",
        remedy=("vLLM asleep during the step (vllm_enable_sleep_mode)", True),
        no_time="waking vLLM reloads its weights each generation: its time is not modelled"))
    """TRL's `vllm_enable_sleep_mode`: `llm.sleep(level=2)` after each generation, `wake_up` before the next."""
    vllm_tp: int = option(1, Face(
        "--vllm-tp", "with --generation vllm-colocate: vLLM's tensor_parallel_size (each worker, one per GPU, holds "
                     "1/N of the weights; TRL's vllm_tensor_parallel_size, OpenRLHF's --vllm.tensor_parallel_size)",
        metavar="N", applies=lambda v: v["run"] == "grpo" and v["generation"] == "vllm-colocate",
        no_time="vLLM's parallelism changes generation's time, which is not modelled"))
    """vLLM's tensor parallel degree: a worker's weights are 1/vllm_tp of the model's 16-bit weights (what an
    OpenRLHF engine asleep at level 1 keeps on the host, and what must fit in its share)."""
    score_batch: int | None = option(None, Face(
        "--score-batch", "with --dpo-logps openrlhf: sequences per no-grad forward that scores the samples between "
                         "generation and the step (OpenRLHF's --micro_rollout_batch_size, --rollout.micro_batch_size; "
                         "default --batch)",
        metavar="N", applies=lambda v: v["run"] == "grpo" and v["dpo_logps"] == "openrlhf",
        remedy=("one sequence per scoring forward (--micro_rollout_batch_size / --rollout.micro_batch_size 1)", 1),
        no_time="scoring's forwards are not timed"))
    """OpenRLHF's make_experience (trainer/ppo_utils/experience_maker.py): the actor's, then the reference's (another
    process, after the actor's cache is emptied when colocated) no-grad forwards over `score_batch` sequences at a
    time, each making the whole sequence's logits and their fp32 copy (helpers.estimate.generation). None: batch."""
    engine_sleep: bool = option(False, Face(
        "--engine-sleep", "with --run grpo under DeepSpeed: OpenRLHF's --ds.enable_sleep: between steps the "
                          "optimizer states, fp32 master weights and gradient buffers wait on the host (DeepSpeed "
                          "offload_states), the 16-bit parameters stay on the GPU",
        applies=lambda v: v["run"] == "grpo" and strategies.get(v["strategy"]).deepspeed,
        remedy=("the actor's states on the host while vLLM generates (--ds.enable_sleep)", True),
        no_time="moving the states to the host and back each step is not timed"))
    """OpenRLHF's `--ds.enable_sleep` (ppo_trainer.py ppo_train: reload_states, fit, offload_states;
    utils/deepspeed/deepspeed_utils.py offload_deepspeed_states: optim_states, contiguous_grad_buffer, hp_params,
    lp_grads to pinned host memory, lp_params kept): the generation phase holds the 16-bit parameters alone. No
    effect with the optimizer offloaded (the function returns at once)."""
    seq: int = option(2048, Face("--seq", "sequence length in tokens", control=Control(
        "steps", "seq", options=(128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768), main=True)))
    """Sequence length (tokens)."""
    precision: str = option("bf16-mixed", Face("--precision", "", choices=PRECISIONS, control=Control(
        "menu", "precision", options=PRECISIONS, main=True)))
    """bf16: weights, grads, AdamW states all bf16; bf16-mixed: fp32 master weights and states, bf16 compute;
    fp16-mixed: the same bytes with fp16 compute and torch's GradScaler (the HF Trainer's `fp16`, accelerate's
    mixed_precision fp16: GPUs without bf16, V100 and T4); fp32."""
    adam_impl: str | None = option(None, Face(
        "--adam-impl", lambda: f"torch AdamW implementation ({'/'.join(strategies.names(lambda s: s.torch_optimizer))}: "
                               f"default foreach; {'/'.join(strategies.names(lambda s: s.client_optimizer))}: the HF "
                               f"Trainer's torch AdamW in place of DeepSpeed's own Adam, without optimizer offload)",
        choices=ADAM_IMPLS, control=Control("menu", "AdamW", options=("default",) + ADAM_IMPLS, none="default"),
        applies=lambda v: _takes_client_optimizer(v)))
    """torch AdamW implementation. single/ddp/fsdp2/fsdp1: None means foreach (torch's GPU default). ZeRO: None means
    DeepSpeed's own Adam (an `optimizer` block in the DeepSpeed JSON: FusedAdam, DeepSpeedCPUAdam with offload); a value
    means the HF Trainer's torch AdamW (`optim` adamw_torch = foreach, adamw_torch_fused = fused) handed to DeepSpeed
    as a client optimizer, stepping over its flat fp32 partitions."""
    optimizer: str = option("adamw", Face(
        "--optimizer", lambda: f"adamw or bitsandbytes' adamw-8bit ({'/'.join(strategies.names(lambda s: s.optimizer_8bit))}; "
                               f"under ZeRO as the HF Trainer's client optimizer, without optimizer offload)",
        choices=OPTIMIZERS, control=Control("menu", "optimizer", options=OPTIMIZERS),
        applies=lambda v: v["optimizer"] == "adamw" or _takes_client_optimizer(v),
        no_time="8-bit AdamW changes the optimizer's numerics (block-quantised states); its kernel speed is not "
                "modelled"))
    """adamw: two states in the weights' dtype; adamw-8bit: bitsandbytes' AdamW8bit, block-quantised 8-bit states
    (single and ddp; under ZeRO the HF Trainer's `optim` adamw_bnb_8bit handed to DeepSpeed, over its flat fp32
    partitions)."""
    lora_rank: int | None = option(None, Face(
        "--lora-rank", lambda: f"LoRA adapters of rank R on every linear layer, base frozen "
                               f"({'/'.join(strategies.names(lambda s: s.lora))})", metavar="R",
        control=Control("steps", "LoRA rank", options=(0, 4, 8, 16, 32, 64, 128, 256), none=0,
                        tooltip="0: full fine-tuning"),
        no_time="LoRA changes what is trained (adapters, base frozen): not the same run at a different speed"))
    """LoRA adapters of this rank on every linear layer but the output head (peft's "all-linear"); the base model is
    frozen and kept in the compute dtype. None: full fine-tuning."""
    lora_targets: str = option("all-linear", Face(
        "--lora-targets", "with --lora-rank: all-linear (every linear but the output head), all-linear-names (the "
                          "same names as a list, as axolotl's lora_target_linear and LLaMA-Factory's all pass them) "
                          "or module names separated by commas, e.g. q_proj,v_proj or q,v (LitGPT's default)",
        metavar="T",
        control=Control("menu", "LoRA on", options=("all-linear", "q,v", "q,k,v,o"), tooltip="with a LoRA rank"),
        applies=lambda v: v["lora_rank"] is not None))
    """Which linear layers get adapters: peft's "all-linear" (every one but the output head); "all-linear-names", their
    names handed to peft as a list (axolotl's lora_target_linear, LLaMA-Factory's lora_target: all), which differs on
    an MoE peft converts (`helpers.estimate.adapters`); or module names, comma-separated ("q_proj,v_proj", or
    LitGPT-style "q,v"; k, o, gate, up, down likewise)."""
    lora_dropout: float = option(0.0, Face(
        "--lora-dropout", "with --lora-rank: peft's lora_dropout, the probability each adapter's input is dropped "
                          "(each adapted layer then keeps its own dropped copy and mask)", metavar="P",
        control=Control("steps", "LoRA dropout", options=(0.0, 0.05, 0.1), tooltip="with a LoRA rank"),
        applies=lambda v: v["lora_rank"] is not None, remedy=("LoRA dropout off", 0.0),
        no_time="LoRA dropout is regularisation: turning it off changes the training, and its kernel's speed is not "
                "modelled"))
    """peft's LoraConfig(lora_dropout=P): a torch.nn.Dropout on each adapted layer's input before lora_A (an
    nn.Identity at 0). With P > 0 each adapted layer keeps the dropped input for lora_A's backward and the dropout's
    mask (helpers.estimate.activations.lora_saves). Needs lora_rank."""
    adapter_dtype: str | None = option(None, Face(
        "--adapter-dtype", lambda: f"with --lora-rank: the adapters' dtype, fp32 (peft's autocast_adapter_dtype, its "
                                   f"default, on a bf16 base) or bf16 (autocast_adapter_dtype=False: LitGPT's, "
                                   f"torchtune's and LLaMA-Factory's pure_bf16 LoRA); default: fp32 on "
                                   f"{'/'.join(strategies.names(lambda s: s.adapter_dtype))}, the engine's elsewhere",
        choices=ADAPTER_DTYPES, control=Control("menu", "adapters", options=("default",) + ADAPTER_DTYPES,
                                                none="default", tooltip="LoRA adapters' dtype (with a LoRA rank)"),
        applies=lambda v: v["lora_rank"] is not None and _takes_adapter_dtype(v),
        no_time="the adapters' dtype changes the training's numerics; its speed is not modelled"))
    """The LoRA adapters' dtype on single and ddp. None: peft's default, `get_peft_model(autocast_adapter_dtype=True)`,
    which upcasts adapters on a bf16 base to fp32 (peft 0.21 `tuners_utils.py` `_cast_adapter_dtype`): they keep fp32
    gradients and AdamW states, and without autocast (precision 'bf16') each adapted layer casts its input to fp32
    for them (`_cast_input_dtype`) and keeps that copy. 'bf16': adapters in the base's dtype. Elsewhere the engine
    decides (DeepSpeed's bf16 mode casts the whole module; FSDP2 follows its MixedPrecisionPolicy)."""
    base_weights: str | None = option(None, Face(
        "--base-weights", lambda: f"with --lora-rank: how the frozen base is stored: fp32 (loaded in float32, TRL's "
                                  f"default dtype, computed under 16-bit autocast; "
                                  f"{'/'.join(strategies.names(lambda s: s.autocast))}), or QLoRA's bitsandbytes "
                                  f"4-bit base, nf4 (an fp32 absmax per 64 weights: transformers' BitsAndBytesConfig "
                                  f"default, TRL's) or nf4-dq (double quantisation: axolotl's, LLaMA-Factory's, "
                                  f"OpenRLHF's), computed in the precision's dtype "
                                  f"({'/'.join(strategies.names(lambda s: s.qlora))}); default: the compute dtype",
        choices=BASE_WEIGHTS, control=Control("menu", "LoRA base", options=("bf16",) + BASE_WEIGHTS, none="bf16",
                                              tooltip="fp32: a float32 base under autocast; nf4: QLoRA's 4-bit base "
                                                      "(with a LoRA rank); -dq: double quantisation"),
        applies=lambda v: v["lora_rank"] is not None and not (v["base_weights"] == "fp32"
                                                              and strategies.get(v["strategy"]).deepspeed),
        elsewhere=lambda v: {"base_weights": None} | ({"load_dtype": "fp32"} if v["lora_rank"] is not None else {}),
        no_time="the base's storage changes the model's numerics (bitsandbytes nf4 dequantises in every matmul; an "
                "fp32 base is cast in every matmul); its speed is not modelled"))
    """How LoRA's frozen base is stored. None: in the compute dtype (bf16; fp32 under precision 'fp32'). 'fp32': loaded
    in float32 (`from_pretrained` without a dtype before transformers 5, TRL's ModelConfig default) and trained under
    autocast (precision bf16-mixed / fp16-mixed on single and ddp): 4 bytes per frozen weight, and every linear whose
    input needs a gradient keeps the 16-bit copy autocast makes of its frozen weight (autocast caches casts of leaf
    tensors that require grad only: torch aten/src/ATen/autocast_mode.h `cached_cast`). 'nf4': QLoRA, as transformers'
    BitsAndBytesConfig loads it with `bnb_4bit_use_double_quant=False` (its default); 'nf4-dq': with double
    quantisation (`bnb_4bit_use_double_quant=True`, the absmax itself quantised to 8 bits).
    helpers.estimate.quantized says how. Needs lora_rank."""
    versions: str | None = option(None, Face(
        "--versions", lambda: f"library releases the run uses, comma-separated, e.g. "
                              f"bitsandbytes=0.42.0,transformers=4.44 (libraries with rules that changed across "
                              f"releases: {', '.join(library_versions.LIBRARIES)}; default: the installed ones)",
        metavar="LIB=VER[,LIB=VER]",
        no_time="a library upgrade changes what the step keeps; kernel speeds by release are not modelled"))
    """The releases of the libraries whose behaviour changed across releases (helpers.versions.RULES), as
    'library=version' pairs separated by commas; a library not named is taken at the release installed here."""
    strategy: str = option("single", Face(
        "--strategy", lambda: strategies.help_text(), choices=lambda: strategies.NAMES,
        control=Control("menu", "strategy", options=STRATEGIES, main=True),
        no_time="a different engine/sharding: its communication per step (all-gathers, reduce-scatters) is not timed "
                "here"))
    """One of helpers.strategies.REGISTRY."""
    gpus: int = option(1, Face("--gpus", "world size", control=Control(
        "steps", "GPUs", options=(1, 2, 4, 8, 16, 32, 64, 128, 256), main=True),
        no_time="more GPUs cost money, not step time (fewer tokens per GPU per global batch is not modelled)"))
    """World size: every GPU of the run (data-parallel degree = gpus // (tensor_parallel x context_parallel))."""
    tensor_parallel: int = option(1, Face(
        "--tp", lambda: f"tensor-parallel degree (torchtitan's plan: column/row-wise linears, sequence-parallel norms, "
                        f"loss parallel; {'/'.join(strategies.names(lambda s: s.model_parallel))})", metavar="N",
        control=Control("steps", "TP", options=(1, 2, 4, 8, 16), tooltip="tensor-parallel degree (fsdp2 or ddp)")))
    """Tensor-parallel degree (torchtitan's plan: column/row-wise linears, sequence-parallel norms, loss parallel);
    strategies with `model_parallel` only (fsdp2 as a 2-D mesh, ddp)."""
    context_parallel: int = option(1, Face(
        "--cp", "context-parallel degree: each sequence split over N ranks; data-parallel degree = gpus / (tp x cp)",
        metavar="N", control=Control("steps", "CP", options=(1, 2, 4, 8, 16),
                                     tooltip="context-parallel degree: each sequence over N ranks")))
    """Context-parallel degree: each sequence split over this many ranks (ring attention gathers keys/values)."""
    gpus_per_node: int = option(8, Face("--gpus-per-node", "GPUs sharing one host", control=Control(
        "steps", "GPUs/node", options=(1, 2, 4, 8, 16, 72), tooltip="GPUs sharing one host (host RAM is per node)"),
        no_time="fewer GPUs per node is the same world size on more nodes: it costs nodes, and the slower links "
                "between nodes are not timed"))
    """GPUs sharing one host; host memory is reported per node."""
    offload_optimizer: bool = option(False, Face("--offload-optimizer", "optimizer states (and master weights) on the "
                                                                        "host", control=Control(
        "check", "offload optimizer", main=True)))
    """ZeRO: optimizer states and fp32 master weights on the host. FSDP2: together with offload_params."""
    offload_params: bool = option(False, Face("--offload-params", "parameters on the host", control=Control(
        "check", "offload params", main=True)))
    """ZeRO-3: parameter partitions on the host. FSDP2: CPUOffloadPolicy; FSDP1: CPUOffload(offload_params=True)
    (params, grads, optimizer states)."""
    offload_ratio: float | None = option(None, Face(
        "--offload-ratio", "ZeRO-3 partial offload, in [0, 1]", metavar="R",
        control=Control("steps", "ratio", options=("all",) + tuple(i / 20 for i in range(21)), none="all",
                        tooltip="ZeRO-3 partial offload: the fraction of optimizer sub-groups on the host"),
        applies=lambda v: v["offload_optimizer"]))
    """DeepSpeed offload_optimizer.ratio: fraction of optimizer sub-groups on the host (ZeRO-3 only)."""
    zero3_init: bool = option(True, Face(
        "--zero3-init", "ZeRO-3: the model built already partitioned under deepspeed.zero.Init, as the HF Trainer "
                        "and accelerate do; --no-zero3-init: loaded whole first (a script that calls "
                        "from_pretrained before its TrainingArguments or Accelerator exist), so DeepSpeed moves all "
                        "of it to each GPU before partitioning it", negative="--no-zero3-init",
        control=Control("check", "zero.Init", tooltip="ZeRO-3: the model built already partitioned (the Trainer's "
                                                      "and accelerate's way)"),
        applies=lambda v: strategies.get(v["strategy"]).family == "zero3", remedy=("deepspeed.zero.Init", True),
        no_time="zero.Init changes where the weights are built, not the step"))
    """ZeRO-3 only. True: transformers builds the model under `deepspeed.zero.Init` (already partitioned; it does so
    whenever a stage-3 HfDeepSpeedConfig exists when from_pretrained runs: the HF Trainer's TrainingArguments,
    accelerate's DeepSpeed plugin). False: the model is loaded whole first, and DeepSpeed's engine moves all of it to
    the GPU before ZeRO-3 partitions it (helpers.estimate.loading)."""
    save_16bit: bool = option(True, Face(
        "--save-16bit", "ZeRO-3: stage3_gather_16bit_weights_on_model_save (zero3_save_16bit_model), true in "
                        "LLaMA-Factory's, TRL's and accelerate's ZeRO-3 files: the whole 16-bit model gathered on "
                        "rank 0's host at each save; --no-save-16bit: sharded files only (zero_to_fp32.py after)",
        negative="--no-save-16bit",
        control=Control("check", "16-bit save", tooltip="ZeRO-3: the whole 16-bit model gathered on rank 0's host at "
                                                        "each checkpoint save"),
        applies=lambda v: strategies.get(v["strategy"]).family == "zero3",
        remedy=("no 16-bit gather at save (stage3_gather_16bit_weights_on_model_save false)", False),
        no_time="the files a save writes, not the step"))
    """ZeRO-3 only. True: each checkpoint save gathers the whole 16-bit model on rank 0's host
    (helpers.estimate.saving)."""
    sharded_save: bool = option(False, Face(
        "--sharded-save", "FSDP: save sharded checkpoints (fsdp_state_dict_type SHARDED_STATE_DICT), each rank its "
                          "own shard; without it the Trainer's default FULL_STATE_DICT gathers the whole model and "
                          "optimizer state on rank 0's host",
        control=Control("check", "sharded save", tooltip="FSDP: each rank saves its own shard (SHARDED_STATE_DICT)"),
        applies=lambda v: strategies.get(v["strategy"]).family in ("fsdp1", "fsdp2"),
        remedy=("sharded checkpoints (SHARDED_STATE_DICT)", True),
        no_time="the files a save writes, not the step"))
    """FSDP only. True: SHARDED_STATE_DICT saves (torch.distributed.checkpoint); False: FULL_STATE_DICT on rank 0."""
    use_orig_params: bool = option(False, Face(
        "--use-orig-params", "FSDP1: use_orig_params=True (fsdp_use_orig_params; accelerate's default is false): "
                             "with LoRA every iteration then keeps the first iteration's copies of the adapted "
                             "layers' inputs (the adapters read as fp32 shards between iterations)",
        control=Control("check", "use_orig_params", tooltip="FSDP1: the original parameters as views of the flat "
                                                            "shards between iterations"),
        applies=lambda v: strategies.get(v["strategy"]).family == "fsdp1"))
    """FSDP1 only. True: FullyShardedDataParallel(use_orig_params=True): after each reshard the original parameters
    are views of the sharded FlatParameter (fp32 for trained units under bf16-mixed), so peft casts each adapted
    layer's input in every iteration, not only the first (`helpers.estimate.activations.first_iteration_casts`)."""
    reshard_after_forward: bool = option(True, Face(
        "--reshard-after-forward", "FSDP: each unit's parameters freed after its forward and gathered again for its "
                                   "backward (FSDP1's FULL_SHARD, FSDP2's reshard_after_forward=True: the defaults); "
                                   "--no-reshard-after-forward: FSDP1's SHARD_GRAD_OP, FSDP2's "
                                   "reshard_after_forward=False, every unit kept unsharded from its forward to its "
                                   "backward (the whole 16-bit model at the loss)",
        negative="--no-reshard-after-forward",
        control=Control("check", "reshard after forward", tooltip="FSDP: parameters freed after each unit's forward "
                                                                  "(FULL_SHARD) or kept to its backward "
                                                                  "(SHARD_GRAD_OP)"),
        applies=lambda v: strategies.get(v["strategy"]).family in ("fsdp1", "fsdp2"),
        remedy=("reshard after forward (FULL_SHARD)", True),
        no_time="the second all-gather of each unit in backward, which is not priced"))
    """FSDP only. True: FSDP1's ShardingStrategy.FULL_SHARD, FSDP2's reshard_after_forward=True; False: FSDP1's
    SHARD_GRAD_OP, FSDP2's reshard_after_forward=False (ZeRO-2-like: parameters stay unsharded between a unit's
    forward and its backward; gradients and optimizer states stay sharded)."""
    hybrid_shard: bool = option(False, Face(
        "--hybrid-shard", "FSDP1: HYBRID_SHARD (or _HYBRID_SHARD_ZERO2 with --no-reshard-after-forward): the model "
                          "states sharded over the GPUs of one node only and replicated on every node, so each GPU "
                          "holds 1/(GPUs per node) of them, not 1/(GPUs)",
        control=Control("check", "hybrid shard", tooltip="FSDP1: shard within each node, replicate across nodes"),
        applies=lambda v: strategies.get(v["strategy"]).family == "fsdp1",
        remedy=("shard over every GPU (FULL_SHARD, not HYBRID_SHARD)", False),
        no_time="the all-reduce between nodes that hybrid sharding saves is not priced"))
    """FSDP1 only. True: ShardingStrategy.HYBRID_SHARD: torch 2.13 `fsdp/_init_utils.py`
    _init_process_group_state_for_hybrid_shard makes the intra-node group of `torch.cuda.device_count()` ranks (the
    GPUs of a node) the one FlatParameters are sharded over, and all-reduces each reduce-scattered gradient shard
    with the other nodes' (`_runtime_utils.py` _reduce_grad, in place); `degrees` counts a replica per node."""
    dp_replicate: int = option(1, Face(
        "--dp-replicate", "FSDP2: HSDP, the data-parallel GPUs split into N groups that each shard the model states "
                          "over their own GPUs (a 2-D mesh: torchtitan's data_parallel_replicate_degree, torchtune's "
                          "data_parallel_replicate_dim, accelerate's dp_replicate_size); each GPU holds 1/(data-"
                          "parallel GPUs / N) of them", metavar="N",
        control=Control("steps", "DP replicas", options=(1, 2, 4, 8, 16, 32),
                        tooltip="FSDP2 HSDP: groups that each hold a whole sharded copy"),
        applies=lambda v: strategies.get(v["strategy"]).family == "fsdp2",
        remedy=("shard over every data-parallel GPU (dp_replicate 1)", 1),
        no_time="the all-reduce between replica groups that HSDP saves is not priced"))
    """FSDP2 only. The replicate degree of a (dp_replicate, dp_shard) mesh: fully_shard on a 2-D mesh shards over
    dp_shard and all-reduces the reduce-scattered gradients over dp_replicate (torch 2.13
    `fsdp/_fully_shard/_fsdp_collectives.py` foreach_reduce: all_reduce of the reduce-scatter output, in place).
    Must divide the data-parallel degree gpus // (tp x cp)."""
    checkpoint_saves: bool = option(True, Face(
        "--checkpoint-saves", "the run saves checkpoints as it trains (the HF Trainer's save_strategy steps or epoch, "
                              "torchtitan's checkpoint.enable), and each save is counted after an optimizer step; "
                              "--no-checkpoint-saves: it saves none (save_strategy no; torchtitan's default)",
        negative="--no-checkpoint-saves",
        control=Control("check", "checkpoint saves", tooltip="count saving a checkpoint after an optimizer step"),
        no_time="the files a save writes, not the step"))
    """True: a checkpoint is saved after an optimizer step and counted in it (helpers.estimate.saving); False: the run
    saves none (the Trainer's save_strategy "no", torchtitan without checkpoint.enable)."""
    sharded_load: bool = option(False, Face(
        "--sharded-load", "the model built on the meta device and each rank reading only its own shards of the "
                          "checkpoint (torchtitan's way, torch.distributed.checkpoint): no whole copy on any rank's "
                          "host at load; without it from_pretrained's conversion is counted",
        control=Control("check", "sharded load", tooltip="torchtitan: built on the meta device, each rank loads "
                                                         "its own shards"),
        applies=lambda v: not strategies.get(v["strategy"]).deepspeed,
        no_time="where the weights are read, not the step"))
    """Torch strategies only. True: the model is built on the meta device and each rank loads only its shards
    (torchtitan); False: transformers' from_pretrained loads it whole on every rank (helpers.estimate.loading)."""
    load_dtype: str | None = option(None, Face(
        "--load-dtype", "under DeepSpeed: the dtype the training script loads the model in before DeepSpeed casts it "
                        "to the compute dtype: fp32 (TRL's default dtype, float32), bf16, fp16, or auto (the "
                        "checkpoint's own); a checkpoint in another dtype is converted on every rank's host. Default: "
                        "the compute dtype (LLaMA-Factory, axolotl and OpenRLHF load in it)",
        choices=LOAD_DTYPES, applies=lambda v: strategies.get(v["strategy"]).deepspeed,
        elsewhere=lambda v: {"load_dtype": None} | (
            {"base_weights": "fp32"} if v["load_dtype"] == "fp32" and v["lora_rank"] is not None
            and v["base_weights"] is None and v["precision"] in ("bf16-mixed", "fp16-mixed")
            and strategies.get(v["strategy"]).autocast else {}),
        remedy=("model loaded in its compute dtype (TRL: dtype bfloat16)", None),
        no_time="where the weights are converted at load, not the step"))
    """DeepSpeed strategies only: the dtype `from_pretrained` loads the model in (TRL loads in float32 unless its
    `dtype` says otherwise); None: the compute dtype. Each rank converts a checkpoint in another dtype into private
    host memory before the engine takes the model (helpers.estimate.loading). Under torch strategies the model is
    loaded in the dtype the engine trains its weights in (precision, base_weights)."""
    pin_memory: bool = option(True, Face("--pin-memory", "offloaded buffers page-locked", negative="--no-pin-memory",
                                         control=Control("check", "pin memory")))
    """Offloaded buffers page-locked (DeepSpeed >= 0.19.5 and torchtitan default) or pageable."""
    checkpointing: str = option("none", Face(
        "--checkpointing", "activation checkpointing of every decoder layer: none, full, or selective (torchtitan's "
                           "op-level policy: every other matmul's output and the attention kernel's saved)",
        choices=CHECKPOINTING, alias=("--grad-checkpointing", "full", "the same as --checkpointing full"),
        control=Control("menu", "checkpointing", options=CHECKPOINTING, main=True)))
    """Activation checkpointing: 'none', 'full' (each decoder layer recomputed in backward) or 'selective'
    (torchtitan's op-level policy: each layer keeps the outputs of its attention kernel and of every other matmul,
    recomputes the rest)."""
    checkpoint_every: int = option(1, Face(
        "--checkpoint-every", "with --checkpointing full: only every Nth decoder layer (torchtitan's "
                              "selective_ac_option = N; 1: every layer)", metavar="N",
        control=Control("steps", "ckpt every", options=(1, 2, 3, 4), tooltip="with checkpointing full: every Nth "
                                                                             "layer only"),
        applies=lambda v: v["checkpointing"] == "full"))
    """With checkpointing 'full': checkpoint every Nth decoder layer only (the Nth, 2Nth, ... counted from 1: layers
    N-1, 2N-1, ... from 0), the others keep their activations; torchtitan's layer-level selective checkpointing
    (`mode = "selective"`, `selective_ac_option = "N"`, torchtitan/distributed/activation_checkpoint.py). 1: every
    layer."""
    grad_accum: int = option(1, Face("--grad-accum", "gradient accumulation: N micro batches per optimizer step",
                                     metavar="N", control=Control("steps", "grad accum", options=(1, 2, 4, 8, 16, 32, 64),
                                                                  tooltip="micro batches per optimizer step")))
    """Gradient accumulation: micro batches per optimizer step (the gradients of the first stay alive through the
    forward and backward of the others)."""
    reduce_dtype: str = option("fp32", Face(
        "--reduce-dtype", "FSDP2 under bf16-mixed: the dtype gradients are reduce-scattered in (MixedPrecisionPolicy "
                          "reduce_dtype): fp32 (torchtitan's mixed_precision_reduce default) or bf16 (accelerate's "
                          "policy for bf16: the HF Trainer, TRL, axolotl, LLaMA-Factory)",
        choices=("fp32", "bf16"), control=Control("menu", "reduce dtype", options=("fp32", "bf16"),
                                                  tooltip="FSDP2: gradients reduced in fp32 or bf16"),
        applies=lambda v: strategies.get(v["strategy"]).family == "fsdp2" and v["precision"] == "bf16-mixed",
        no_time="reduce-scatter bytes are not priced"))
    """FSDP2 under bf16-mixed only (elsewhere no effect). MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=...):
    'fp32' as torchtitan (training.mixed_precision_reduce float32); 'bf16' as accelerate 1.15 `utils/dataclasses.py` set_mixed_precision
    builds it (param_dtype = reduce_dtype = bf16), which torch 2.13 `_fsdp_param_group.py` then drops (a reduce dtype
    equal to the parameter dtype is None): no upcast of accumulated gradients, reduce-scatters in bf16, the output cast
    to the fp32 shard's dtype."""
    sync_each_batch: bool = option(False, Face(
        "--sync-each-batch", "FSDP with gradient accumulation: gradients reduce-scattered after every micro batch "
                             "(torchtitan's and torchtune's loops; accelerate's sync_each_batch); without it every "
                             "micro batch but the last runs under no_sync, as the HF Trainer, accelerate's "
                             "accumulate() and LitGPT's Fabric run it, and keeps its unsharded gradients (FSDP2 "
                             "in the reduce dtype, --reduce-dtype) until the last one reduces them",
        control=Control("check", "sync each batch", tooltip="FSDP + accumulation: reduce-scatter after every micro "
                                                            "batch (else no_sync keeps unsharded gradients)"),
        applies=lambda v: strategies.get(v["strategy"]).family in ("fsdp1", "fsdp2"),
        remedy=("gradients reduced every micro batch (sync_each_batch)", True),
        no_time="a reduce-scatter per micro batch instead of one per step is not priced"))
    """FSDP with grad_accum > 1 only (elsewhere no effect). False: the micro batches before the last run under
    no_sync (transformers 5.23 Trainer: `accelerator.no_sync` unless accelerator_config's sync_each_batch; accelerate
    1.15 no_sync: FSDP1's `no_sync()`, FSDP2's `set_requires_gradient_sync(False)`), so each unit's unsharded gradient
    accumulates on every GPU (torch 2.13 FSDP2 `_fsdp_param.py` to_accumulated_grad_if_needed: upcast to the reduce
    dtype); True: every micro batch reduce-scatters, and the sharded gradients accumulate."""
    fused_ce: bool = option(False, Face("--fused-ce", "fused/chunked linear cross-entropy",
                                        control=Control("check", "fused CE"), remedy=("fused cross-entropy", True),
                                        applies=lambda v: v["run"] != "rm"))     # (a reward model has no logits)
    """A fused/chunked linear cross-entropy (Liger, torch's linear_cross_entropy): full logits never exist."""
    trl_loss_type: str | None = option(None, Face(
        "--trl-loss-type", "the loss as TRL's SFTTrainer computes it for its loss_type (nll, chunked_nll, or unset: "
                           "the release's default), by the TRL release in --versions (default: the newest rules): "
                           "full logits before 1.15 for nll, 256-token chunks under checkpoint 1.4-1.14 for "
                           "chunked_nll, tiles of 4096 tokens x 32768 vocabulary entries from 1.15 (default: not "
                           "TRL, transformers' own loss)",
        choices=TRL_LOSS_TYPES, applies=lambda v: not v["fused_ce"] and v["run"] != "rm",   # use_liger_kernel:
        #                                                                   TRL takes Liger's loss; RewardTrainer none
        no_time="TRL's chunked or tiled head recomputes the output head's projection in backward: its time is not "
                "modelled"))
    """TRL's SFT `loss_type` as the run's config gives it ('unset': TRL's default at its release); None: the model's
    own loss (transformers' ForCausalLMLoss). What it computes depends on the TRL release (helpers.versions: the rules
    keyed 'trl_*'; helpers.estimate.sft_loss)."""
    attention: str = option("sdpa", Face(
        "--attention", "", choices=ATTENTIONS, control=Control("menu", "attention", options=ATTENTIONS),
        remedy=("flash attention", "flash"),
        no_time="FlashAttention recomputes the attention scores inside its backward kernel and is usually faster "
                "than eager; its speed is not modelled"))
    """The attention kernel: eager (the scores materialised), sdpa (torch's scaled_dot_product_attention) or flash."""
    kv_expanded: bool = option(False, Face(
        "--expanded-kv", "the attention expands keys and values to every query head before the kernel and keeps the "
        "expanded copies for backward (torchtune's and LitGPT's own models; transformers' 16-bit SDPA keeps them "
        "grouped)"))
    """Keys and values repeated to every query head before a 16-bit SDPA/flash kernel, as torchtune's
    MultiHeadAttention and LitGPT's CausalSelfAttention do (and transformers' SDPA where it cannot pass enable_gqa):
    the kernel saves the expanded copies. Eager and fp32 attention keep them expanded anyway."""
    outputs_held: bool = option(False, Face(
        "--outputs-held", "the training loop keeps each micro batch's logits (and through them its autograd graph) "
        "until the next forward returns: through its backward, the optimizer step and the next forward (LitGPT's "
        "fit loop; the HF Trainer drops them)", applies=lambda v: v["run"] != "rm"))
    """The loop's own variable keeps the model's output alive after the loss is taken (LitGPT's `logits = model(...)`
    in fit(), rebound only when the next forward returns): the logits live through backward, the step and the next
    forward, and so does the graph they reference (freed tensors aside: a ctx attribute such as bitsandbytes < 0.43.2
    MatMul4Bit's kept input stays)."""
    gpu_gib: float | None = option(None, Face("--gpu-gib", "GPU capacity in GiB", metavar="X", control=Control(
        "gib", "GPU GiB", none=0.0, tooltip="0: no capacity")))
    """Capacity of one GPU in GiB, for the out-of-memory verdict."""
    host_gib: float | None = option(None, Face("--host-gib", "host RAM per node in GiB", metavar="Y", control=Control(
        "gib", "host GiB", none=0.0, tooltip="0: no capacity"),
        no_time="more host RAM is hardware: it costs money, not step time"))
    """Host RAM of one node in GiB, for the out-of-memory verdict."""
    resume: bool = option(False, Face("--resume", "add the resume-from-checkpoint phase", control=Control(
        "check", "resume phase", tooltip="the optimizer states loaded from a checkpoint beside the live buffers")))
    """Add the resume phase: optimizer states loaded from a checkpoint beside the live buffers."""
    reduce_bucket_size: int = option(500_000_000, Face("--reduce-bucket-size", "DeepSpeed reduce_bucket_size in "
                                                                              "elements", metavar="N"))
    """DeepSpeed reduce_bucket_size (elements); DeepSpeed's default."""
    sub_group_size: int = option(1_000_000_000, Face("--sub-group-size", "DeepSpeed ZeRO-3 sub_group_size in elements",
                                                     metavar="N"))
    """DeepSpeed ZeRO-3 sub_group_size (elements); DeepSpeed's default."""
    optimizer_groups: str = option("decay", Face(
        "--optimizer-groups", "DeepSpeed ZeRO-3: the optimizer's parameter groups, which DeepSpeed splits into "
                              "sub-groups one group at a time (so which sub-groups an offload ratio moves): decay (the "
                              "weights, then the biases and norm weights without weight decay, as the HF Trainer's "
                              "create_optimizer and OpenRLHF build them) or one (every parameter in one group: a "
                              "DeepSpeed JSON's own optimizer block under the HF Trainer)",
        choices=("decay", "one"), applies=lambda v: v["strategy"] == "zero3", no_time="the same parameters either way"))
    """DeepSpeed 0.19.8 stage3.py `_create_fp16_partitions_with_defragmentation` makes each parameter group's
    sub-groups (`_create_fp16_sub_groups`) in the optimizer's group order, and `_create_fp32_partitions` puts sub-group
    i on the host when i >= int((1 - ratio) x n). 'decay': transformers 5.23 Trainer.create_optimizer (decay
    parameters, then the rest at weight_decay 0: biases and norm weights) and OpenRLHF 3c3be623
    get_optimizer_grouped_parameters (no_decay_name_list: bias, norm weights) both make two groups, the second a small
    last sub-group; 'one': transformers' deepspeed_optim_sched hands DeepSpeed `DummyOptim(model_parameters)` when the
    JSON names an optimizer, one group."""
    prefetch_bucket_size: int = option(50_000_000, Face("--prefetch-bucket-size", "DeepSpeed ZeRO-3 "
                                                        "stage3_prefetch_bucket_size in elements", metavar="N"))
    """DeepSpeed ZeRO-3 stage3_prefetch_bucket_size (elements); DeepSpeed's default."""
    overlap_comm: bool | None = option(None, Face("--overlap-comm", "DeepSpeed overlap_comm on (double reduce "
                                                                    "buckets; DeepSpeed's default: on for ZeRO-3 only)",
                                                  negative="--no-overlap-comm"))
    """DeepSpeed overlap_comm (double reduce buckets); None = DeepSpeed's default (on for ZeRO-3 only)."""
    grad_checkpointing: InitVar[bool | None] = None

    def __post_init__(self, grad_checkpointing):
        """checkpointing as one field: grad_checkpointing=True means 'full', None (a saved result's) means 'none'."""
        if grad_checkpointing is not None and not isinstance(grad_checkpointing, bool):
            raise InputError(f"grad_checkpointing must be True or False, got {grad_checkpointing!r}")
        if grad_checkpointing:
            if self.checkpointing not in (None, "none", "full"):
                raise InputError(f"grad_checkpointing=True means checkpointing 'full', got checkpointing "
                                 f"{self.checkpointing!r}: give one of them")
            object.__setattr__(self, "checkpointing", "full")
        elif self.checkpointing is None:
            object.__setattr__(self, "checkpointing", "none")

    @property
    def adam(self) -> str:
        """The optimizer implementation in effect: 'foreach', 'fused' or 'for-loop' (torch AdamW; under ZeRO the HF
        Trainer's client optimizer), 'bitsandbytes' (AdamW8bit) or 'deepspeed' (ZeRO's own Adam)."""
        if self.optimizer == "adamw-8bit":
            return "bitsandbytes"
        if not self.strat.torch_optimizer:
            return self.adam_impl or self.strat.engine
        return self.adam_impl or "foreach"

    @property
    def mixed(self) -> bool:
        """fp32 weights computed in a 16-bit dtype under autocast (bf16-mixed, fp16-mixed)."""
        return self.precision in ("bf16-mixed", "fp16-mixed")

    @property
    def ref(self) -> str | None:
        """DPO's, KTO's or GRPO's reference as the run has it ('copy', 'adapters-off', 'none'); None for SFT."""
        if self.run not in LOGPS_RUNS:
            return None
        if self.run == "grpo":
            return self.reference or "none"
        return self.reference or ("adapters-off" if self.lora_rank is not None else "copy")

    def _check_grpo(self) -> None:
        """GRPO's own fields: each with run 'grpo' only, a completion shorter than the sequence, a fraction."""
        _choice("generation", self.generation, GENERATIONS)
        if self.completion is not None:
            _integer("completion", self.completion, MAX_TOKENS)
        if not isinstance(self.vllm_share, (int, float)) or isinstance(self.vllm_share, bool) \
                or not math.isfinite(self.vllm_share) or not 0 < self.vllm_share <= 1:
            raise InputError(f"vllm_share must be a fraction of the GPU's memory in (0, 1] (vLLM's "
                             f"gpu_memory_utilization), got {self.vllm_share!r}")
        if self.steps_per_generation is not None:
            _integer("steps_per_generation", self.steps_per_generation, MAX_GRAD_ACCUM)
        if self.sync_ref and self.run == "grpo" and self.ref != "copy":        # (bools checked with FLAGS)
            raise InputError(f"sync_ref (TRL's sync_ref_model) needs a reference copy (reference 'copy'), got "
                             f"reference {self.ref!r}: TRL refuses it with beta 0.0 and with PEFT")
        default = {f.name: f.default for f in dataclasses.fields(self)}
        given = [f for f in GRPO_FIELDS if getattr(self, f) != default[f]]
        if self.run != "grpo" and given:
            raise InputError(f"{given[0]} is a GRPO option: use it with run 'grpo', got run {self.run!r}")
        if self.generation != "vllm-colocate":
            for f in ("vllm_share", "vllm_sleep", "vllm_tp"):
                if getattr(self, f) != default[f]:
                    raise InputError(f"{f} is vLLM's colocated engine's option: use it with generation "
                                     f"'vllm-colocate', got generation {self.generation!r}")
        _integer("vllm_tp", self.vllm_tp, MAX_GPUS)
        if self.score_batch is not None:
            _integer("score_batch", self.score_batch, MAX_TOKENS)
            if self.dpo_logps != "openrlhf":
                raise InputError(f"score_batch is OpenRLHF's rollout micro batch: use it with dpo_logps 'openrlhf', "
                                 f"got dpo_logps {self.dpo_logps!r}")
        if self.engine_sleep and not self.strat.deepspeed:
            raise InputError(f"engine_sleep (OpenRLHF's --ds.enable_sleep) offloads DeepSpeed's states: use it with a "
                             f"DeepSpeed strategy, got {self.strategy!r}")
        if self.run == "grpo" and self.completion is not None and self.completion >= self.seq:
            raise InputError(f"completion ({self.completion} tokens) must be shorter than seq ({self.seq}: prompt + "
                             f"completion)")
        if self.run == "grpo" and self.seq < 2:
            raise InputError(f"run 'grpo' needs seq of at least 2 tokens (a prompt and a completion), got {self.seq}")

    @property
    def completion_tokens(self) -> int:
        """GRPO's completion length in tokens (`completion`, or its default within seq); seq for other runs."""
        if self.run != "grpo":
            return self.seq
        return self.completion or min(COMPLETION_DEFAULT, self.seq - 1)

    @property
    def half(self) -> str:
        """The 16-bit compute dtype's name: 'fp16' for fp16-mixed, else 'bf16'."""
        return "fp16" if self.precision == "fp16-mixed" else "bf16"

    @property
    def adapters_fp32(self) -> bool:
        """LoRA adapters kept in fp32 (see `adapter_dtype`); False without LoRA."""
        if self.lora_rank is None:
            return False
        if self.precision == "fp32":
            return True
        if self.adapter_dtype is not None:
            return self.adapter_dtype == "fp32"
        st = self.strat
        if st.adapter_dtype:                  # peft's default on a bf16 base
            return True
        return st.engine in ("fsdp2", "fsdp1") and self.precision == "bf16-mixed"    # fp32 originals, cast to bf16

    @property
    def quantized(self) -> bool:
        """QLoRA: a bitsandbytes 4-bit base (base_weights 'nf4' or 'nf4-dq')."""
        return self.base_weights in QUANTIZED_BASES

    @property
    def base_fp32(self) -> bool:
        """LoRA on a float32 frozen base computed under 16-bit autocast (base_weights 'fp32')."""
        return self.base_weights == "fp32"

    @property
    def double_quant(self) -> bool:
        """A 4-bit base with bitsandbytes' double quantisation (base_weights 'nf4-dq')."""
        return self.base_weights == "nf4-dq"

    @property
    def client_optimizer(self) -> bool:
        """Under ZeRO: the HF Trainer's optimizer (torch AdamW or AdamW8bit) handed to DeepSpeed in place of its own
        Adam (`Strategy.client_optimizer`)."""
        return not self.strat.torch_optimizer and self.adam != self.strat.engine

    @property
    def strat(self) -> strategies.Strategy:
        """The strategy object of `strategy` (what it shards, its engine, the options it takes)."""
        return strategies.get(self.strategy)

    @property
    def overlap(self) -> bool:
        return self.strat.overlap_comm_default if self.overlap_comm is None else self.overlap_comm

    @property
    def ratio(self) -> float:
        """Fraction of optimizer state offloaded (1.0 = all, DeepSpeed's meaning of no ratio)."""
        if not self.offload_optimizer:
            return 0.0
        return 1.0 if self.offload_ratio is None else self.offload_ratio

    @property
    def degrees(self) -> Degrees:
        """The parallel degrees (world, tp, cp, dp, shard, replicate), computed once: helpers.degrees."""
        replicas = self.dp_replicate
        if self.hybrid_shard:                                # FSDP1: a node's GPUs shard, each node a replica
            replicas = self.gpus // self.ranks_per_node
        return Degrees(self.gpus, self.tensor_parallel, self.context_parallel, self.strat.sharded, replicas)

    @property
    def ranks_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    def replace(self, **changes) -> "TrainSetup":
        """A copy with some fields changed (validated); grad_checkpointing=True/False sets checkpointing 'full' / back
        to 'none' from 'full'."""
        if "grad_checkpointing" in changes and "checkpointing" not in changes:
            on = changes.pop("grad_checkpointing")
            if not isinstance(on, bool):
                raise InputError(f"grad_checkpointing must be True or False, got {on!r}")
            changes["checkpointing"] = "full" if on else "none" if self.checkpointing == "full" else self.checkpointing
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)} - {"grad_checkpointing"})
        if unknown:
            raise InputError(f"unknown set-up option {unknown[0]!r}: allowed are "
                             f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes).validate()

    def changed(self, **changes) -> "TrainSetup":
        """A copy with `changes` made and every other field restated where it no longer applies (`with_applicable`:
        what a strategy change means for a float32 LoRA base, TRL's loss under a fused cross-entropy), validated:
        a way out as the user would make it, not a bare field swap."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            return self.replace(**changes)                  # (its one-line refusal)
        return with_applicable(dataclasses.replace(self, **changes), keep=changes).validate()

    def validate(self) -> "TrainSetup":
        """Raise InputError naming the bad value and what is allowed; return self when all is well.

        Types first (an int where an int is meant, a bool for a switch, a finite number for a capacity), then the
        ranges in MAX_*, then the combinations."""
        _choice("precision", self.precision, PRECISIONS)
        st = strategies.get(self.strategy)
        _choice("checkpointing", self.checkpointing, CHECKPOINTING)
        _choice("attention", self.attention, ATTENTIONS)
        if self.outputs_held and (self.fused_ce or self.strategy not in ("single", "ddp")):
            raise InputError("outputs_held is modelled with strategies single and ddp without fused_ce (LitGPT's loop on "
                             f"one GPU), got strategy {self.strategy!r}" + (" with fused_ce" if self.fused_ce else ""))
        if self.kv_expanded and self.checkpointing == "selective":
            raise InputError("kv_expanded with checkpointing 'selective' (torchtitan's policy, whose model keeps them "
                             "grouped) is not modelled: use checkpointing 'full' or 'none'")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.adam_impl is not None:
            _choice("adam_impl", self.adam_impl, ADAM_IMPLS)
        for name in FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.overlap_comm is not None and not isinstance(self.overlap_comm, bool):
            raise InputError(f"overlap_comm must be True, False or None (DeepSpeed's default), got {self.overlap_comm!r}")
        for name, most in (("batch", MAX_TOKENS), ("seq", MAX_TOKENS), ("gpus", MAX_GPUS),
                           ("gpus_per_node", MAX_GPUS_PER_NODE), ("reduce_bucket_size", MAX_ELEMENTS),
                           ("sub_group_size", MAX_ELEMENTS), ("prefetch_bucket_size", MAX_ELEMENTS),
                           ("grad_accum", MAX_GRAD_ACCUM), ("tensor_parallel", MAX_GPUS),
                           ("context_parallel", MAX_GPUS), ("checkpoint_every", MAX_LAYERS),
                           ("dp_replicate", MAX_GPUS)):
            _integer(name, getattr(self, name), most)
        if self.run in PAIRED_RUNS and 2 * self.batch * self.seq > MAX_TOKENS:
            raise InputError(f"with run {self.run!r}, 2 x batch x seq (chosen and rejected) must be at most {MAX_TOKENS:,} "
                             f"tokens per micro batch, got 2 x {self.batch} x {self.seq}")
        if self.batch * self.seq > MAX_TOKENS:
            raise InputError(f"batch x seq must be at most {MAX_TOKENS:,} tokens per micro batch (2^24; no real run "
                             f"comes near it), got {self.batch} x {self.seq} = {self.batch * self.seq:,}")
        for name in ("gpu_gib", "host_gib"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or not MIN_GIB <= value <= MAX_GIB):
                raise InputError(f"{name} must be a positive, finite number of GiB, from 1/1024 (1 MiB) to "
                                 f"{MAX_GIB:,} (None for no capacity), got {value!r}")
        if self.lora_rank is not None and (isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int)
                                           or self.lora_rank < 1):
            raise InputError(f"lora_rank must be a positive integer (or None for full fine-tuning), got {self.lora_rank!r}")
        if self.checkpoint_every != 1 and self.checkpointing != "full":
            raise InputError(f"checkpoint_every {self.checkpoint_every} (checkpoint every Nth layer) needs checkpointing "
                             f"'full', got checkpointing {self.checkpointing!r}: torchtitan's layer-level option checkpoints whole "
                             f"layers")
        if not isinstance(self.lora_targets, str) or \
                not re.fullmatch(r"all-linear(-names)?|\w+(,\w+)*", self.lora_targets):
            raise InputError(f"lora_targets must be all-linear, all-linear-names or linear module names separated by "
                             f"commas (e.g. q_proj,v_proj or q,v), got {self.lora_targets!r}")
        if isinstance(self.lora_dropout, bool) or not isinstance(self.lora_dropout, (int, float)) \
                or not 0 <= self.lora_dropout < 1:
            raise InputError(f"lora_dropout must be a number in [0, 1) (peft's dropout probability), got "
                             f"{self.lora_dropout!r}")
        if self.lora_dropout and self.lora_rank is None:
            raise InputError(f"lora_dropout {self.lora_dropout} needs lora_rank (LoRA adapters' rank)")
        if self.lora_targets != "all-linear" and self.lora_rank is None:
            raise InputError(f"lora_targets {self.lora_targets!r} needs lora_rank (LoRA adapters' rank)")
        if self.adapter_dtype is not None:
            _choice("adapter_dtype", self.adapter_dtype, ADAPTER_DTYPES)
            if self.lora_rank is None:
                raise InputError(f"adapter_dtype {self.adapter_dtype!r} needs lora_rank (LoRA adapters' rank)")
            if not st.adapter_dtype:
                raise InputError(f"adapter_dtype is modelled with strategies "
                                 f"{strategies.listing(lambda x: x.adapter_dtype, 'and')}, got {self.strategy!r}: "
                                 f"there the engine decides (DeepSpeed's bf16 mode casts the adapters with the model; "
                                 f"FSDP2 follows its MixedPrecisionPolicy)")
            if self.precision == "fp16-mixed" and self.adapter_dtype == "bf16":
                raise InputError("adapter_dtype 'bf16' with precision 'fp16-mixed': GradScaler unscales only fp32 "
                                 "gradients ('Attempting to unscale FP16 gradients'), so fp16 runs keep fp32 adapters; "
                                 "use adapter_dtype fp32 (the default)")
            if self.precision == "fp32" and self.adapter_dtype == "bf16":
                raise InputError("adapter_dtype 'bf16' with precision 'fp32': an fp32 base keeps its adapters in fp32 "
                                 "(peft only upcasts); use precision bf16 or bf16-mixed")
        if self.lora_rank is not None and self.checkpointing == "selective":
            raise InputError("checkpointing 'selective' is modelled for full fine-tuning; with lora_rank the adapters' "
                             "extra matmuls change which outputs the policy saves: use checkpointing 'full' or 'none'")
        library_versions.parse(self.versions)
        if not self.save_16bit and st.family != "zero3":
            raise InputError(f"save_16bit False (no 16-bit gather at save) is a ZeRO-3 option: use it with strategy "
                             f"{strategies.listing(lambda x: x.family == 'zero3', 'or')}, got {self.strategy!r}")
        if self.sharded_save and st.family not in ("fsdp1", "fsdp2"):
            raise InputError(f"sharded_save (FSDP's SHARDED_STATE_DICT) is an FSDP option: use it with strategy "
                             f"{strategies.listing(lambda x: x.family in ('fsdp1', 'fsdp2'), 'or')}, got "
                             f"{self.strategy!r}")
        if not self.reshard_after_forward and st.family not in ("fsdp1", "fsdp2"):
            raise InputError(f"reshard_after_forward False (SHARD_GRAD_OP) is an FSDP option: use it with strategy "
                             f"{strategies.listing(lambda x: x.family in ('fsdp1', 'fsdp2'), 'or')}, got "
                             f"{self.strategy!r}")
        _choice("reduce_dtype", self.reduce_dtype, ("fp32", "bf16"))    # (no effect but FSDP2's under bf16-mixed)
        if self.hybrid_shard:
            if st.family != "fsdp1":
                raise InputError(f"hybrid_shard (FSDP1's HYBRID_SHARD) is an FSDP1 option: use it with strategy "
                                 f"{strategies.listing(lambda x: x.family == 'fsdp1', 'or')}, got {self.strategy!r} "
                                 f"(FSDP2's hybrid sharding is dp_replicate)")
            if self.gpus % self.ranks_per_node:
                raise InputError(f"hybrid_shard with gpus={self.gpus} and gpus_per_node={self.gpus_per_node}: "
                                 f"HYBRID_SHARD shards over each node's GPUs, so the world size must be a whole "
                                 f"number of nodes (give --gpus-per-node with --gpus)")
        if self.dp_replicate > 1:
            if st.family != "fsdp2":
                raise InputError(f"dp_replicate={self.dp_replicate} (HSDP) is an FSDP2 option: use it with strategy "
                                 f"{strategies.listing(lambda x: x.family == 'fsdp2', 'or')}, got {self.strategy!r} "
                                 f"(FSDP1's is hybrid_shard)")
            dp = self.gpus // (self.tensor_parallel * self.context_parallel)
            if dp % self.dp_replicate:
                raise InputError(f"dp_replicate={self.dp_replicate} must divide the data-parallel degree {dp} "
                                 f"(gpus {self.gpus} // (tensor_parallel x context_parallel)): a 2-D mesh of "
                                 f"dp_replicate x dp_shard")
        if self.use_orig_params and st.family != "fsdp1":
            raise InputError(f"use_orig_params is an FSDP1 option (FullyShardedDataParallel; FSDP2 always keeps the "
                             f"original parameters): use it with strategy "
                             f"{strategies.listing(lambda x: x.family == 'fsdp1', 'or')}, got {self.strategy!r}")
        _choice("run", self.run, RUNS)
        if self.run in LOGPS_RUNS + ("rm",) and (self.tensor_parallel > 1 or self.context_parallel > 1):
            raise InputError(f"run {self.run!r} with tensor_parallel or context_parallel is not modelled ("
                             + ("the score head's plan" if self.run == "rm" else "the reference model's placement")
                             + " under a DTensor plan is not read): use tensor_parallel=1 and context_parallel=1")
        if self.run == "rm":
            for name, why in (("fused_ce", "a fused linear cross-entropy"), ("trl_loss_type", "TRL's SFT loss"),
                              ("outputs_held", "LitGPT's loop holding the logits")):
                if getattr(self, name):
                    raise InputError(f"{name} with run 'rm': a reward model's loss takes no vocabulary logits (a "
                                     f"value head's are made and dropped unused), so {why} does not apply; leave "
                                     f"{name} unset")
        if self.reference is not None:
            _choice("reference", self.reference, REFERENCES)
            if self.run not in LOGPS_RUNS:
                raise InputError(f"reference {self.reference!r} is a DPO, KTO and GRPO option: use it with run "
                                 f"'dpo', 'kto' or 'grpo', got run {self.run!r}")
            if self.reference == "adapters-off" and self.lora_rank is None:
                raise InputError("reference 'adapters-off' (the policy's base with its LoRA adapters disabled) needs "
                                 "lora_rank; a full fine-tune's reference is a copy ('copy') or none ('none')")
        _choice("dpo_logps", self.dpo_logps, DPO_LOGPS)
        self._check_grpo()
        if self.trl_loss_type is not None:
            _choice("trl_loss_type", self.trl_loss_type, TRL_LOSS_TYPES)
            if self.fused_ce:
                raise InputError(f"trl_loss_type {self.trl_loss_type!r} with fused_ce: TRL takes use_liger_kernel's "
                                 f"loss instead of its own (and refuses chunked_nll with it); leave one of them unset")
        _choice("rm_head", self.rm_head, RM_HEADS)
        if self.rm_head != "score" and self.run != "rm":
            raise InputError(f"rm_head {self.rm_head!r} is a reward model's option: use it with run 'rm', got run "
                             f"{self.run!r}")
        if self.dpo_logps == "log-softmax" and self.run != "dpo":
            raise InputError(f"dpo_logps {self.dpo_logps!r} is a DPO option: use it with run 'dpo', got run "
                             f"{self.run!r}")
        if self.dpo_logps == "openrlhf" and self.run != "grpo":
            raise InputError(f"dpo_logps {self.dpo_logps!r} is OpenRLHF's actor (train_ppo_ray): use it with run "
                             f"'grpo', got run {self.run!r}")
        if self.entropy_kept and self.dpo_logps != "openrlhf":
            raise InputError("entropy_kept is OpenRLHF's actor option (--actor.entropy_coef): use it with run 'grpo' "
                             f"and dpo_logps 'openrlhf', got dpo_logps {self.dpo_logps!r}")

        if self.sharded_load and st.deepspeed:
            raise InputError(f"sharded_load (built on the meta device, each rank reading its shards) is a torch "
                             f"strategy's option (torchtitan); under DeepSpeed zero3_init is its like: got strategy "
                             f"{self.strategy!r}")
        if self.load_dtype is not None:
            _choice("load_dtype", self.load_dtype, LOAD_DTYPES)
            if not st.deepspeed:
                raise InputError(f"load_dtype {self.load_dtype!r} is a DeepSpeed option (DeepSpeed casts the model it "
                                 f"is given): under strategy {self.strategy!r} the model is loaded in the dtype the "
                                 f"engine trains its weights in (set precision or base_weights instead)")
            if self.quantized:
                raise InputError(f"load_dtype {self.load_dtype!r} with a 4-bit base (base_weights "
                                 f"{self.base_weights!r}): bitsandbytes quantises the base as it loads; leave "
                                 f"load_dtype out")
        if not self.zero3_init and st.family != "zero3":
            raise InputError(f"zero3_init False (the model loaded whole before DeepSpeed partitions it) is a ZeRO-3 "
                             f"option: use it with strategy {strategies.listing(lambda x: x.family == 'zero3', 'or')}, "
                             f"got {self.strategy!r}")
        s = self.strategy
        if self.base_weights is not None:
            _choice("base_weights", self.base_weights, BASE_WEIGHTS)
            if self.lora_rank is None:
                raise InputError(f"base_weights {self.base_weights!r} (how LoRA's frozen base is stored) needs "
                                 f"lora_rank: without adapters every weight is trained, in the precision's dtypes")
            if self.base_fp32:
                if not (self.mixed and st.autocast):
                    raise InputError(f"base_weights 'fp32' (a float32 base under 16-bit autocast) is modelled with "
                                     f"precision bf16-mixed or fp16-mixed on strategies "
                                     f"{strategies.listing(lambda x: x.autocast, 'and')}, got precision "
                                     f"{self.precision!r} on {s!r}"
                                     + (": under precision fp32 the base is fp32 already (leave base_weights out)"
                                        if self.precision == "fp32" else
                                        ": there the engine computes with its own 16-bit copies of the weights"
                                        if self.mixed else ": precision bf16 computes in the weights' own dtype"))
                if self.adapter_dtype == "bf16":
                    raise InputError("adapter_dtype 'bf16' with base_weights 'fp32': peft gives adapters the base's "
                                     "dtype or upcasts them, never lower; use adapter_dtype fp32 (the default)")
            elif not st.qlora:
                raise InputError(f"base_weights {self.base_weights!r} is modelled with strategies "
                                 f"{strategies.listing(lambda x: x.qlora, 'and')}, got {s!r} (bitsandbytes' quantisation "
                                 f"state under an engine's sharding or re-casting is not modelled here)")
            if self.degrees.model_parallel > 1:
                raise InputError(f"base_weights {self.base_weights!r} is modelled without tensor or context parallelism "
                                 f"(a 4-bit weight's quantisation state, or autocast's casts of a frozen sharded "
                                 f"weight, split over ranks is not modelled), got "
                                 f"tensor_parallel={self.tensor_parallel}, context_parallel={self.context_parallel}")
        if self.lora_rank is not None and not st.lora:
            raise InputError(f"lora_rank is modelled with strategies {strategies.listing(lambda x: x.lora, 'and')}, "
                             f"got {s!r} (FSDP1's flat parameters holding frozen and trainable weights together are "
                             f"not modelled here)")
        if self.optimizer == "adamw-8bit":
            if not st.optimizer_8bit:
                raise InputError(f"optimizer 'adamw-8bit' (bitsandbytes) is modelled with strategies "
                                 f"{strategies.listing(lambda x: x.optimizer_8bit, 'and')}, got {s!r}: "
                                 + ("under ZeRO-3 a scaled run of DeepSpeed 0.19.8 with it keeps more fp32 gradient at "
                                    "the step than the rules place (not modelled)" if st.deepspeed else
                                    "FSDP's sharded states are not modelled with it"))
            if self.adam_impl is not None:
                raise InputError(f"adam_impl {self.adam_impl!r} chooses torch AdamW's implementation; optimizer "
                                 f"'adamw-8bit' has its own kernel: leave adam_impl unset")
        if not st.multi_gpu and self.gpus != 1:
            raise InputError(f"strategy {s!r} runs on one GPU, got gpus={self.gpus}: use "
                             f"{strategies.listing(lambda x: x.multi_gpu)}")
        _model_parallel(self, st)
        client = self.adam_impl is not None or self.optimizer == "adamw-8bit"
        if not st.torch_optimizer and client and not st.client_optimizer:
            raise InputError(
                f"adam_impl {self.adam_impl!r} is for torch's AdamW (strategies "
                f"{strategies.listing(lambda x: x.torch_optimizer or x.client_optimizer)}); strategy {s!r} uses "
                f"its own optimizer"
            )
        if not st.torch_optimizer and client and self.offload_optimizer:
            what = f"adam_impl {self.adam_impl!r}" if self.adam_impl else "optimizer 'adamw-8bit'"
            raise InputError(
                f"{what} with offload_optimizer: DeepSpeed then steps on the host with DeepSpeedCPUAdam, which "
                f"accelerate swaps in for the Trainer's optimizer (accelerate/utils/deepspeed.py "
                f"map_pytorch_optim_to_deepspeed) and DeepSpeed alone insists on (zero_force_ds_cpu_optimizer): leave "
                f"adam_impl unset and optimizer 'adamw'"
            )
        if self.precision == "fp16-mixed" and self.degrees.model_parallel > 1:
            raise InputError(f"precision 'fp16-mixed' with tensor or context parallelism is not modelled (GradScaler "
                             f"over DTensor gradients), got tensor_parallel={self.tensor_parallel}, "
                             f"context_parallel={self.context_parallel}: use bf16-mixed there")
        if self.precision == "fp16-mixed" and self.precision not in st.precisions:
            raise InputError(
                f"precision 'fp16-mixed' is modelled with strategies "
                f"{strategies.listing(lambda x: 'fp16-mixed' in x.precisions, 'and')} (torch autocast with GradScaler), "
                f"got {s!r}: {'DeepSpeed' if st.deepspeed else st.title}'s own fp16 path (its loss scaler and overflow "
                f"checks) is not modelled; bf16-mixed keeps the same bytes per value where the GPU has bf16"
            )
        if self.precision not in st.precisions:
            raise InputError(
                f"precision {self.precision!r} (everything in bf16) is not how DeepSpeed trains: its bf16 mode keeps "
                f"fp32 master weights and states; use precision {' or '.join(repr(p) for p in st.precisions)} with "
                f"strategy {s!r}"
            )
        if not st.offload and (self.offload_optimizer or self.offload_params):
            raise InputError(f"strategy {s!r} cannot offload: offload needs "
                             f"{strategies.listing(lambda x: bool(x.offload))}")
        if self.offload_params and "offload_params" not in st.offload:
            raise InputError(f"offload_params needs {strategies.listing(lambda x: 'offload_params' in x.offload)} "
                             f"(DeepSpeed offloads parameters only in stage 3), got {s!r}")
        if st.offload_together and self.offload_optimizer != self.offload_params:
            raise InputError(
                f"{st.title} offloads parameters, gradients and optimizer states together "
                f"({'CPUOffload(offload_params=True)' if st.engine == 'fsdp1' else 'CPUOffloadPolicy'}): "
                "set both offload_optimizer and offload_params, or neither"
            )
        if self.offload_ratio is not None:
            r = self.offload_ratio
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
                raise InputError(f"offload_ratio must be a number in [0, 1], got {r!r}")
            if "offload_ratio" not in st.offload:
                raise InputError(
                    f"offload_ratio is honoured only by "
                    f"{' and '.join(strategies.get(n).title for n in strategies.names(lambda x: 'offload_ratio' in x.offload))} "
                    f"(partial offload; strategy {strategies.listing(lambda x: 'offload_ratio' in x.offload)}), got strategy {s!r}"
                )
            if not self.offload_optimizer:
                raise InputError("offload_ratio needs offload_optimizer (it splits the offloaded optimizer states)")
        return self


def _model_parallel(s: TrainSetup, st: strategies.Strategy) -> None:
    """Tensor/context parallelism: the degrees divide the world size, and the strategy composes with DTensor."""
    tp, cp = s.tensor_parallel, s.context_parallel
    if tp == 1 and cp == 1:
        return
    if not st.model_parallel:
        raise InputError(f"tensor_parallel={tp} and context_parallel={cp} are modelled with strategies "
                         f"{strategies.listing(lambda x: x.model_parallel)}, got {s.strategy!r} (DeepSpeed's ZeRO "
                         f"partitions the flat model itself; torch's DTensor plans compose with FSDP2 and DDP)")
    if s.gpus % (tp * cp):
        raise InputError(f"gpus={s.gpus} must be a multiple of tensor_parallel x context_parallel = {tp} x {cp} = "
                         f"{tp * cp} (data-parallel degree = gpus // (tp x cp))")
    if cp > 1 and s.seq % (2 * cp):
        raise InputError(f"seq={s.seq} must be a multiple of 2 x context_parallel = {2 * cp}: context parallelism "
                         f"splits each sequence into 2 x cp chunks (load-balanced ring attention)")
    if s.lora_rank is not None:
        raise InputError("lora_rank with tensor_parallel or context_parallel is not modelled: use tensor_parallel=1 "
                         "and context_parallel=1 with LoRA")
    if s.fused_ce:
        raise InputError("fused_ce with tensor_parallel or context_parallel is not modelled (loss parallel shards "
                         "the logits instead): leave fused_ce off")
    if s.kv_expanded:
        raise InputError("kv_expanded with tensor_parallel or context_parallel is not modelled: leave it off")


def _takes_client_optimizer(values: dict) -> bool:
    """A torch AdamW implementation or AdamW8bit applies: torch strategies, and ZeRO's client optimizer without
    optimizer offload (an unknown strategy is left to `validate` to refuse)."""
    st = strategies.REGISTRY.get(values["strategy"])
    return st is None or st.torch_optimizer or (st.client_optimizer and not values["offload_optimizer"])


def _takes_adapter_dtype(values: dict) -> bool:
    st = strategies.REGISTRY.get(values["strategy"])
    return st is None or st.adapter_dtype


def _choice(name: str, value, allowed: tuple) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"unknown {name} {value!r}: allowed are {', '.join(allowed)}")


def _integer(name: str, value, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    if value > most:
        raise InputError(f"{name} must be at most {most:,}, got {value:,}")


def checked(setup) -> TrainSetup:
    """`setup` validated; InputError if it is not a TrainSetup at all (the runners' and the estimator's entry)."""
    if not isinstance(setup, TrainSetup):
        raise InputError(f"setup must be a helpers.training.TrainSetup, got {type(setup).__name__} {setup!r}")
    return setup.validate()


FACES = {f.name: f.metadata["face"] for f in dataclasses.fields(TrainSetup)}
"""Every TrainSetup field's Face, in field order."""


def with_applicable(setup: TrainSetup, keep=()) -> TrainSetup:
    """`setup` with every field whose Face's `applies` fails on it back at its default (LoRA's targets without a LoRA
    rank, every-Nth-layer checkpointing without full checkpointing), or as its `elsewhere` restates it for the
    strategy now set (a float32 LoRA base under DeepSpeed), except the fields in `keep` (what a user gave: an
    inapplicable value given is refused by `validate`, never dropped). Not validated."""
    values = {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)}
    back = {}
    for f in dataclasses.fields(setup):
        face = FACES[f.name]
        if face.applies is None or f.name in keep or values[f.name] == f.default or face.applies(values):
            continue
        instead = face.elsewhere(values) if face.elsewhere else {f.name: f.default}
        back.update({k: v for k, v in instead.items() if k not in keep})
    return dataclasses.replace(setup, **back) if back else setup


_DATACLASS_INIT = TrainSetup.__init__


def _init(self, *args, **kwargs):
    """TrainSetup(...) naming an option it does not have: one InputError with the nearest, like the CLI (a
    dataclass's own TypeError otherwise)."""
    unknown = [k for k in kwargs if k not in TrainSetup.__dataclass_fields__]
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0], list(TrainSetup.__dataclass_fields__), n=1, cutoff=0.6)
        raise InputError(f"TrainSetup has no option {unknown[0]!r}" + (f": did you mean {near[0]!r}?" if near else
                         " (its options: help(helpers.training.TrainSetup))"))
    _DATACLASS_INIT(self, *args, **kwargs)


TrainSetup.__init__ = _init
