"""DPO's and KTO's reference model and DPO's pairs of sequences (`run` 'dpo', 'kto'): what a preference run holds
beyond SFT's.

Read in TRL 1.10 (huggingface/trl at f2cd577, trl/trainer/dpo_trainer.py and trl/models/utils.py) and DeepSpeed
0.19.8; the reference's placement measured on the real engines by `helpers.measure.reference`:

- **The pairs.** `_compute_loss` runs the policy once over the collated batch, each example's chosen sequences then
  its rejected ones (`chosen_logps, rejected_logps = logps.chunk(2, dim=0)`): one forward and backward of 2 x batch
  sequences, with 2 x batch's activations and logits (`pairs`).
- **The reference model** (DPOTrainer.__init__): when the model is not a PEFT model and `precompute_ref_log_probs` is
  off, a second copy is loaded with the policy's own `model_init_kwargs` (`create_model_from_path`: float32 unless a
  dtype is given), frozen, and prepared per engine:
  - DeepSpeed (`prepare_deepspeed`): the policy's DeepSpeed config with the stage set to 0 unless it is 3. Stage 0
    casts the module to the compute dtype and keeps all of it on every GPU (engine.py
    `_configure_distributed_model`); stage 3 partitions it as the policy's parameters are, 1/N of each tensor per GPU
    (padded to N), with the policy's `offload_param` (its partitions on the host then).
  - FSDP (`prepare_fsdp`): wrapped with the policy's FSDP plugin: sharded as the policy's parameters are, in the
    dtype it was loaded in.
  - Otherwise (one GPU, DDP): `accelerator.prepare_model(evaluation_mode=True)`: the whole model, as loaded, on every
    GPU.
  The reference's forward runs under `torch.no_grad()` after the policy's forward, while the policy's activations and
  logits are alive: its own logits are scored and dropped, and its layers' intermediates are freed as it goes (under
  ZeRO-3 and FSDP its gathered layers take the place of the policy's, released after the policy's forward).
- **Loading.** Under DeepSpeed and FSDP the policy is still on the host (the engine takes it in `train()`) when the
  reference is loaded, so each rank holds both conversions at once (`helpers.estimate.loading`'s rule, twice);
  without an engine the Trainer has already moved the policy to its GPU.

`reference` says which reference the run has: 'copy' (the above), 'adapters-off' (TRL's and LLaMA-Factory's LoRA
runs: the policy's base with the adapters disabled, `use_adapter` / `disable_adapter`: no weights added) or 'none'
(precompute_ref_log_probs, or a reference-free loss: SimPO, ORPO). OpenRLHF loads a copy even for LoRA.

- **The log-probabilities** (`add_logits`, in place of the cross-entropy's logits): accelerate's native-amp
  wrapper returns a 16-bit forward's outputs in fp32 (accelerate 1.15 `prepare_model`: `convert_outputs_to_fp32`), so
  the policy's logits become an fp32 copy, which TRL's `selective_log_softmax` (fp32 path: the labels' logits
  gathered, less a logsumexp taken one sequence at a time) keeps for its backward. The reference's logits are made
  the same way while the policy's are alive, scored, and dropped. Backward of the log-probabilities holds three more
  fp32 logits-sized buffers at once beside the kept logits: the gather's dense gradient, every sequence's logsumexp
  gradient until they are stacked, and the stacked gradient. Measured by a dry run of the step re-enacted
  (`helpers.measure.dryrun.DPOStep`), to the MiB.
GRPO (`run` 'grpo', TRL 1.10 grpo_trainer.py): the reference is loaded and placed as DPO's (GRPOTrainer.__init__
calls the same prepare_deepspeed / prepare_fsdp) when beta > 0 on a full fine-tune; with LoRA the base with the
adapters disabled; with beta 0.0 (the default) none. It scores the completions in `_generate_and_score_completions`
under no_grad before the step, one micro batch at a time, with no saved activations: that forward holds less than
the step's and is not a moment of its own. In the step, `_get_per_token_logps_and_entropies` asks the model for the
completion's logits alone (`logits_to_keep` = completion + 1), divides them by the temperature in place, takes
`selective_log_softmax` as DPO does, and the entropy under no_grad, 128 rows at a time.

Under DeepSpeed the logits come in the compute dtype (accelerate wraps no native-amp forward there), and TRL's
`selective_log_softmax` takes them row by row: DPO's `_dpo_bf16_logits`, GRPO's `_grpo_bf16_logits`.
KTO (`run` 'kto', TRL 1.10 kto_trainer.py `_compute_loss`): the reference loaded and placed as DPO's; the micro batch
is `batch` unpaired sequences (not doubled), scored as DPO's are. Before the policy's forward the KL term's batch
(each prompt with another example's completion, as many sequences) runs through the policy under no_grad, and
through the reference just before the reference's forward: each holds its logits and their scoring while less is
alive than at the reference's forward (nothing saved yet; then the same size as the reference forward's own), so no
moment of its own: checked by the dry run (`preference_loss.kto_loss`).
Left out: the reference forward's own layer intermediates (freed layer by layer, under no_grad) are below the policy's
saved activations and not counted on top.
"""

from __future__ import annotations

from helpers.estimate import activations, loading, openrlhf_actor
from helpers.estimate.items import ALWAYS, BWD_START, GATHER, LOAD, LOSS
from helpers.estimate.states import Builder
from helpers.models import ModelSpec
from helpers.training import PAIRED_RUNS
from helpers.units import fmt

SOURCE = ("TRL 1.10 dpo_trainer.py DPOTrainer.__init__ (grpo_trainer.py GRPOTrainer.__init__ alike) and "
          "models/utils.py prepare_deepspeed, prepare_fsdp")
OPENRLHF_SOURCE = ("OpenRLHF 3c3be623 trainer/ray/launcher.py ReferenceModelActor (another process on the actor's GPU "
                   "when colocated), utils/deepspeed/deepspeed.py get_ds_eval_config: stage 3 with the actor's stage "
                   "3, else 0")
ENTROPY_CHUNK = 128      # TRL 1.10 utils.py entropy_from_logits(chunk_size=128): rows per chunk


def pairs(setup):
    """The set-up as the step sees it: DPO's (and a reward model's) micro batch is `batch` chosen and `batch` rejected sequences in one
    forward (2 x batch), and a fused cross-entropy (fused_ce: Liger's, CCE) does not reach DPO's or GRPO's
    log-probabilities, which take the full logits (counted in full: Liger's own fused DPO and GRPO losses would hold
    less); SFT's unchanged."""
    if setup.run in PAIRED_RUNS:                   # (a reward model's pairs alike: helpers.estimate.reward)
        return setup.replace(batch=2 * setup.batch, fused_ce=False)
    return setup.replace(fused_ce=False) if setup.run == "grpo" and setup.fused_ce else setup


def holds_copy(setup) -> bool:
    """Whether the run keeps a separate frozen reference model (DPO with reference 'copy')."""
    return setup.ref == "copy"


def words(setup) -> str | None:
    """What the reference is for `setup`, in a clause; None for SFT."""
    if setup.ref is None:
        return None
    if setup.ref == "adapters-off":
        return "the policy's base with the LoRA adapters disabled (peft), no copy"
    if setup.ref == "none":
        if setup.dpo_logps == "openrlhf":
            return "none on the actor's GPUs (OpenRLHF: on GPUs of its own, or no KL term)"
        return ("none (beta 0.0: no KL term, no reference loaded)" if setup.run == "grpo"
                else "none in the step (precomputed log-probs or a reference-free loss)")
    fam = setup.strat.family
    if fam == "zero12":
        return "a frozen copy in DeepSpeed's stage 0, whole on every GPU in the compute dtype"
    if fam == "zero3":
        return ("a frozen copy partitioned by ZeRO-3 like the policy"
                + (", its partitions on the host (offload_param)" if setup.offload_params else ""))
    if fam in ("fsdp1", "fsdp2"):
        return "a frozen copy sharded by FSDP like the policy, in the dtype it was loaded in"
    return "a frozen copy, whole on every GPU, in the dtype it was loaded in"


def _sharded(m: ModelSpec, n: int) -> int:
    """Elements of one rank's share when every tensor is split n ways, each padded to a multiple of n."""
    return sum(-(-t.numel // n) for t in m.tensors)


def add_reference(b: Builder, m: ModelSpec, lifecycle: bool = True) -> None:
    """The reference model's weights from set-up on (through the checkpoint's save: they stay on the GPU, and a save
    writes the policy alone) and, with `lifecycle`, its conversion beside the policy's while loading."""
    s = b.setup
    if not holds_copy(s):
        return
    fam = s.strat.family
    compute = loading.compute_dtype(s)
    loaded = loading.loaded_dtype(s, m) or compute
    n = s.degrees.shard
    name = f"reference model (frozen, {s.run.upper()})"
    openrlhf = s.dpo_logps == "openrlhf"
    src, prep = (OPENRLHF_SOURCE, "get_ds_eval_config") if openrlhf else (SOURCE, "prepare_deepspeed")
    if fam == "zero12":
        nbytes = m.params * loading.BYTES[compute]
        b.gpu(name, "parameters", nbytes, ALWAYS,
              f"{prep} sets ZeRO stage 0 for a reference under stage 1/2: the engine casts it to {compute} "
              f"and keeps all of it on every GPU: {m.params:,} x {loading.BYTES[compute]} B = {fmt(nbytes)} ({src}; "
              f"DeepSpeed 0.19.8 engine.py _configure_distributed_model)")
    elif fam == "zero3":
        nbytes = _sharded(m, n) * loading.BYTES[compute]
        why = (f"{prep} keeps stage 3 for the reference: each tensor partitioned 1/{n} per rank in "
               f"{compute}, {fmt(nbytes)} per rank ({src})")
        if s.offload_params:
            b.host(f"{name}, partitions offloaded", "parameters", nbytes, ALWAYS,
                   why + "; the policy's offload_param puts them on the host", pinned=s.pin_memory)
        else:
            b.gpu(name, "parameters", nbytes, ALWAYS, why)
    elif fam in ("fsdp1", "fsdp2"):
        nbytes = _sharded(m, n) * loading.BYTES[loaded]
        b.gpu(name, "parameters", nbytes, ALWAYS,
              f"prepare_fsdp wraps the reference with the policy's FSDP plugin: sharded {n} ways in the dtype it was "
              f"loaded in ({loaded}), {fmt(nbytes)} per GPU ({src})")
    else:
        nbytes = m.params * loading.BYTES[loaded]
        b.gpu(name, "parameters", nbytes, ALWAYS,
              f"accelerator.prepare_model(evaluation_mode=True): the whole reference on every GPU as loaded "
              f"({loaded}, create_model_from_path with the policy's model_init_kwargs): {m.params:,} x "
              f"{loading.BYTES[loaded]} B = {fmt(nbytes)} ({src})")
    if lifecycle and (s.strat.deepspeed or fam in ("fsdp1", "fsdp2")):
        copy = loading.host_copy(s, m)
        b.host("the reference model converted as it loads, beside the policy's", "parameters", copy, LOAD,
               ("the ReferenceModelActor (another process on the same node) loads its copy as the actor loads "
                "its own" if openrlhf else
                f"{s.run.upper()}Trainer.__init__ loads the reference while the policy is still on the host (the "
                f"engine takes it in train())")
               + f": a second conversion of {fmt(copy)} per rank ({src}; the conversion rule of "
                 f"helpers.estimate.loading)")


def _log_softmax_logits(b: Builder, m: ModelSpec, E: int) -> None:
    """LLaMA-Factory's DPO (`dpo_logps` 'log-softmax'): `concatenated_forward` takes the logits in fp32
    (`.to(torch.float32)`, or accelerate's fp32 output) and `get_batch_logps` gathers the labels from
    `logits[:, :-1].log_softmax(-1)`, whose output autograd keeps; the fp32 logits stay referenced until the loss
    returns (its metrics read them). The reference runs the same function under no_grad."""
    s = b.setup
    L = s.batch * (s.seq - 1) * m.vocab           # the shifted logits' log_softmax
    src = ("LLaMA-Factory src/llamafactory/train/dpo/trainer.py concatenated_forward, train/trainer_utils.py "
           "get_batch_logps; measured by a dry run")
    b.gpu("policy logits in fp32 (referenced until the loss returns)", "logits", 4 * E, LOSS,
          f"{s.batch} sequences x seq x vocab = {E:,} elements x 4 B ({src})")
    b.gpu("policy log_softmax output (saved for backward)", "logits", 4 * L, LOSS | BWD_START,
          f"log_softmax of the shifted logits, {L:,} elements x 4 B, kept for its backward ({src})")
    if s.ref != "none":
        b.gpu("reference logits in fp32 and their log_softmax (scored, then dropped)", "logits", 4 * E + 4 * L, LOSS,
              f"the reference's concatenated_forward under no_grad while the policy's are alive ({src})")
    b.gpu("the log-probabilities' gradients (gather's, log_softmax's)", "logits", 8 * L, BWD_START,
          f"the gather's dense gradient and log_softmax's input gradient, fp32, at once ({src})")
    activations.add_softcap(b, m, (4 if s.precision == "fp32" else 2) * E)


def _grpo_bf16_logits(b: Builder, m: ModelSpec, E: int) -> None:
    """GRPO under DeepSpeed: accelerate wraps no native-amp forward there, so the completion's logits stay in the
    module's 16-bit dtype and TRL's `selective_log_softmax` takes its 16-bit way, a log_softmax per sequence, each
    output kept for its backward. At the entropy (no_grad, after the log-probabilities) the logits, the kept outputs,
    the sliced logits' contiguous copy (more than one sequence) and 128 rows' log_softmax, exp and product are alive
    at once. In backward the largest moment is TRL's in-place temperature division (`logits.div_` on a view of the
    logits): autograd's CopySlices clones the whole logits' gradient and the slice's, so the incoming gradient, its
    clone (both the size of the logits), the slice's clone and the division's output (both the size of the
    completion's) are alive at once; measured by the dry run."""
    s = b.setup
    C, V = s.completion_tokens, m.vocab
    rows = 2 * s.batch * C * V
    src = ("TRL 1.10 grpo_trainer.py _get_per_token_logps_and_entropies, utils.py selective_log_softmax (16-bit "
           "branch), entropy_from_logits; accelerate 1.15 prepare_model (no native amp under DeepSpeed); measured by "
           "a dry run of the step re-enacted")
    b.gpu("policy logits in bf16 (until the log-probabilities are taken)", "logits", 2 * E, LOSS,
          f"{s.batch} sequences x (completion + 1) x vocab = {E:,} elements x 2 B, left in the module's dtype "
          f"({src})")
    b.gpu("each sequence's log_softmax in bf16 (kept for backward)", "logits", rows, LOSS,
          f"{s.batch} x {C} x {V:,} x 2 B = {fmt(rows)} ({src})")
    chunk = ENTROPY_CHUNK * V * 2
    copy = rows if s.batch > 1 else 0
    b.gpu("entropy of the completion's logits (no_grad working set)", "logits", copy + 3 * chunk, LOSS,
          (f"the sliced logits copied contiguous by reshape, {fmt(copy)}, then " if copy else "")
          + f"{ENTROPY_CHUNK} rows x vocab in bf16 as log_softmax, its exp and their product, {fmt(chunk)} each "
            f"({src})")
    for name, nbytes in (("the logits' gradient, into CopySlices", 2 * E), ("its clone (CopySlices)", 2 * E),
                         ("the completion slice's gradient, cloned (CopySlices)", rows),
                         ("the temperature division's gradient output", rows)):
        b.gpu(name, "logits", nbytes, BWD_START,
              f"logits.div_(temperature) on a view: CopySlices' backward holds the logits' gradient and its clone "
              f"({fmt(2 * E)} each), the slice's clone and the division's output ({fmt(rows)} each) at once ({src})")
    activations.add_softcap(b, m, 2 * E)


def _grpo_loss_transient(b: Builder, m: ModelSpec, E: int, c: int, src: str) -> None:
    """GRPO's largest transient at its loss, beside the kept fp32 logits: the larger of two that never coexist, the
    16-bit output until accelerate's fp32 copy of it is made, and later the entropy's working set: with more than
    one sequence the sliced logits (`[:, :-1][:, -completion:]`, not contiguous) are copied whole by
    `reshape(-1, vocab)`, then 128 rows at a time hold their log_softmax, its exp and their product."""
    s = b.setup
    C, V = s.completion_tokens, m.vocab
    chunk = ENTROPY_CHUNK * V * 4
    copy = 4 * s.batch * C * V if s.batch > 1 else 0
    entropy = copy + 3 * chunk
    returned = c * E if c == 2 else 0
    what = ("the entropy's working set (utils.py entropy_from_logits under no_grad, entropy_coef 0.0: "
            + (f"the {s.batch} sequences' sliced logits copied contiguous by reshape, {fmt(copy)}, then " if copy
               else "") + f"{ENTROPY_CHUNK} rows x vocab in fp32 as log_softmax, its exp and their product, "
            f"{fmt(chunk)} each)")
    if entropy >= returned:
        b.gpu("entropy of the completion's logits (no_grad working set)", "logits", entropy, LOSS,
              what + (f"; the 16-bit output ({fmt(returned)}) is gone by then" if returned else "") + f" ({src})")
    else:
        b.gpu("policy logits as returned, until their fp32 copy is made", "logits", returned, LOSS,
              f"the 16-bit output and its fp32 copy at once, {fmt(returned)}: larger than {what}, which comes after "
              f"it ({src})")


def _dpo_bf16_logits(b: Builder, m: ModelSpec, E: int) -> None:
    """DPO under DeepSpeed: accelerate wraps no native-amp forward there, so the logits stay in the module's 16-bit
    dtype, and TRL's `selective_log_softmax` takes its 16-bit way, a log_softmax per sequence, each output kept for
    its backward; `outputs` keeps the logits referenced until `_compute_loss` returns. The reference's forward (no_grad)
    then holds its own 16-bit logits and one sequence's log_softmax at a time. In backward the sequences' gradients
    are stacked (unbind's backward) and the shift's slice backward writes them into a zeroed logits-sized gradient,
    both alive at once; measured by a dry run of the step re-enacted."""
    s = b.setup
    V = m.vocab
    rows = 2 * s.batch * (s.seq - 1) * V
    row = 2 * (s.seq - 1) * V
    src = (f"TRL 1.10 {s.run}_trainer.py _compute_loss, utils.py selective_log_softmax (16-bit branch); accelerate 1.15 "
           "prepare_model (no native amp under DeepSpeed); measured by a dry run of the step re-enacted")
    b.gpu("policy logits in bf16 (referenced until the loss is computed)", "logits", 2 * E, LOSS,
          f"{s.batch} sequences x seq x vocab = {E:,} elements x 2 B, left in the module's dtype ({src})")
    b.gpu("each sequence's log_softmax in bf16 (kept for backward)", "logits", rows, LOSS,
          f"{s.batch} x {s.seq - 1} x {V:,} x 2 B = {fmt(rows)} ({src})")
    if s.ref != "none":
        b.gpu("reference logits in bf16 and one sequence's log_softmax (no_grad: scored, then dropped)", "logits",
              2 * E + row, LOSS, f"the reference forward after the policy's, {fmt(2 * E)}, scored one sequence at a "
                                 f"time ({fmt(row)}) while the policy's are alive ({src})")
    b.gpu("the sequences' log-probability gradients, stacked", "logits", rows, BWD_START,
          f"unbind's backward stacks every sequence's {s.half} gradient, {fmt(rows)} ({src})")
    b.gpu("the logits' gradient (the shift's slice backward)", "logits", 2 * E, BWD_START,
          f"a zeroed logits-sized {s.half} gradient the stacked one is written into, {fmt(2 * E)}, alive with it "
          f"({src})")
    activations.add_softcap(b, m, 2 * E)


def add_logits(b: Builder, m: ModelSpec) -> None:
    """DPO's logits and log-probabilities over the 2 x batch sequences (`b.setup` is `pairs` of the set-up), or
    GRPO's over each sequence's completion: the policy's fp32 logits kept for backward, the reference's scored beside
    them (DPO; GRPO's reference scores before the step), or the policy's 16-bit output before its fp32 copy when no
    reference runs in the step, and the log-probabilities' backward."""
    s = b.setup
    if s.dpo_logps == "openrlhf":
        openrlhf_actor.add_logits(b, m)
        return
    grpo = s.run == "grpo"
    E = s.batch * (s.completion_tokens + 1 if grpo else s.seq) * m.vocab
    c = 4 if s.precision == "fp32" else 2
    if s.dpo_logps == "log-softmax":
        _log_softmax_logits(b, m, E)
        return
    if s.strat.deepspeed:
        (_grpo_bf16_logits if grpo else _dpo_bf16_logits)(b, m, E)
        return
    if s.mixed:
        b.gpu("policy logits as the forward returns them (16-bit, autocast's weight cache still alive)", "logits",
              c * E, GATHER, f"the head's {s.half} output, {fmt(c * E)}, made inside accelerate's autocast, which "
                             f"clears its cache only on exit, before the fp32 copy (accelerate 1.15 prepare_model: "
                             f"convert_outputs_to_fp32 around the autocast forward; measured by a dry run). Counted at "
                             f"the moment that also holds the last layer's working set, freed before the head runs: "
                             f"over by that much where it is the forward's peak")
    if grpo:
        src = ("TRL 1.10 grpo_trainer.py _compute_loss, _get_per_token_logps_and_entropies (logits_to_keep = "
               "completion + 1), utils.py selective_log_softmax; accelerate 1.15 convert_outputs_to_fp32")
        _grpo_loss_transient(b, m, E, c, src)
    else:
        src = (f"TRL 1.10 {s.run}_trainer.py _compute_loss, utils.py selective_log_softmax; accelerate 1.15 "
               "convert_outputs_to_fp32")
    how = "in fp32" if c == 4 else "converted to fp32 by accelerate"
    b.gpu("policy logits in fp32 (kept for the log-probabilities' backward)", "logits", 4 * E, LOSS | BWD_START,
          f"{s.batch} sequences x {'(completion + 1)' if grpo else 'seq'} x vocab = {E:,} elements x 4 B: the "
          f"forward's output {how}, kept by the per-sequence logsumexp ({src})")
    if s.ref != "none" and not grpo:
        b.gpu("reference logits, as returned and in fp32 (scored, then dropped)", "logits", c * E + (4 * E if c == 2 else 0),
              LOSS, f"the reference forward (no_grad) after the policy's: its logits {f'({c} B) and their fp32 copy ' if c == 2 else ''}"
                    f"alive together while the policy's are kept ({src})")
    elif c == 2 and not grpo:
        b.gpu("policy logits as returned, until their fp32 copy is made", "logits", c * E, LOSS,
              f"the 16-bit output and its fp32 copy at once (no reference forward in the step: {src})")
    b.gpu("the log-probabilities' gradients (gather's, each sequence's logsumexp's, stacked)", "logits", 12 * E,
          BWD_START, f"three fp32 logits-sized buffers at once in the log-probabilities' backward: the gather's dense "
                     f"gradient, every sequence's logsumexp gradient until stacked, the stacked gradient ({src}; "
                     f"measured by a dry run)")
    activations.add_softcap(b, m, c * E)
