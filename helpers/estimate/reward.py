"""A reward model (`run` 'rm'): what it holds in place of a causal LM's output head and logits.

Read in TRL 1.10 (huggingface/trl at f2cd577, trl/trainer/reward_trainer.py), transformers 5.23
(`modeling_layers.py` GenericForSequenceClassification) and peft 0.21 (`tuners/tuners_utils.py`
`_maybe_include_all_linear_layers`, `peft_model.py` PeftModelForSequenceClassification); the step re-enacted by
`helpers.measure.dryrun.RewardStep`:

- **The model.** RewardTrainer loads the checkpoint with `AutoModelForSequenceClassification` and `num_labels=1`:
  the decoder (`model.*`) and a `score` linear of hidden x 1 without bias; the LM head's weight is not loaded, and
  an embedding tied to it is the embedding alone (`spec`). OpenRLHF's train_rm (`get_llm_for_sequence_regression`:
  the base model and a value head of one output) and axolotl's reward_model hold the same.
- **The value-head model** (`rm_head` 'value-head': LLaMA-Factory's stage rm, trl 0.24's
  AutoModelForCausalLMWithValueHead): the causal LM whole, its LM head's full logits made in every forward, upcast to
  fp32 and dropped unused, every hidden state held until the forward returns, and a value head (dropout, hidden x 1
  with a bias) on the last one (`_add_value_head`); the LM head takes no gradient (`states.head_unused`).
- **The pairs.** The collator puts each example's chosen sequences then its rejected ones in one batch
  (`DataCollatorForPreference`): one forward and backward of 2 x batch sequences (`reference.pairs`).
- **The head.** `score(hidden_states)` over every position: batch x seq x 1, pooled at each sequence's last token
  that is not padding; the loss is -logsigmoid(chosen - rejected). Nothing of the vocabulary's size exists: the
  largest moment of the loss's backward is the decoder's last layer's (`activations.no_full_logits`).
- **LoRA.** With peft's `task_type` SEQ_CLS, "all-linear" leaves the score head out and `modules_to_save` trains a
  copy of it whole: a hidden x 1 weight, its gradient and Adam's states, counted with the adapters
  (`states.lora_adapters`).
"""

from __future__ import annotations

import dataclasses

from helpers.estimate import activations
from helpers.estimate.items import BWD_START, FORWARDS, LOSS
from helpers.estimate.states import Builder
from helpers.models import ModelSpec, Tensor

SOURCE = ("TRL 1.10 reward_trainer.py RewardTrainer (AutoModelForSequenceClassification, num_labels=1; compute_loss), "
          "transformers 5.23 modeling_layers.py GenericForSequenceClassification")


VH_SOURCE = "trl 0.24 models/modeling_value_head.py AutoModelForCausalLMWithValueHead"
VALUE_HEAD_DROPOUT = 0.1     # trl 0.24 models/modeling_value_head.py ValueHead: summary_dropout_prob's default


def spec(m: ModelSpec, head: str = "score") -> ModelSpec:
    """`m` as a reward model. 'score': a sequence classifier of one label, its LM head's weight gone (a tied one was
    the embedding's: it stays, untied), a `score.weight` of 1 x hidden in its place. 'value-head': the causal LM
    whole and trl's value head beside it (`v_head.summary`, hidden x 1 and a bias)."""
    if any(t.name in ("score.weight", "v_head.summary.weight") for t in m.tensors):
        return m                                 # (already a reward model's)
    if head == "value-head":
        return dataclasses.replace(m, tensors=m.tensors + (
            Tensor("v_head.summary.weight", m.hidden, "head", 2, (1, m.hidden), True),
            Tensor("v_head.summary.bias", 1, "head", 1, (1,), False)))
    kept = tuple(t for t in m.tensors if not t.name.startswith("lm_head"))
    score = Tensor("score.weight", m.hidden, "head", 2, (1, m.hidden), True)
    return dataclasses.replace(m, tensors=kept + (score,), tied=False)


def add_score(b: Builder, m: ModelSpec) -> None:
    """The score head's output over every position, its pooled rewards and loss, and their gradients; with the
    value-head model, the LM head's logits it makes and drops, the hidden states it asks for, and what its value head
    saves."""
    s = b.setup                                  # (2 x batch sequences: reference.pairs)
    c = 4 if s.precision == "fp32" else 2
    T = s.batch * s.seq
    if s.rm_head == "value-head":
        _add_value_head(b, m, c, T)
    b.gpu("the score head's output (batch x seq x 1) and the pooled rewards", "logits", T * c + s.batch * 4, LOSS,
          f"{SOURCE}: score(hidden_states) at every position, then the last non-padding token's picked out")
    b.gpu("the score output's gradient (batch x seq x 1)", "logits", T * c, BWD_START,
          "the pooling's backward scatters the rewards' gradient into a zeroed batch x seq x 1 tensor")


def _add_value_head(b: Builder, m: ModelSpec, c: int, T: int) -> None:
    """trl 0.24's AutoModelForCausalLMWithValueHead.forward (models/modeling_value_head.py), as LLaMA-Factory's stage
    rm calls it (train/rm/trainer.py compute_loss: `_, _, values = model(**inputs, output_hidden_states=True)`): the
    causal LM's forward makes its full logits, which are upcast to fp32 and returned unused; `hidden_states` keeps
    every layer's output until the forward returns (in a 16-bit residual stream not checkpointed, no norm saves those:
    each upcasts its own copy); the value head saves its dropout's mask and its linear's input."""
    s = b.setup
    E = T * m.vocab
    b.gpu("the LM head's logits, made and dropped unused (the value-head model)", "logits", c * E, LOSS,
          f"{VH_SOURCE}: the causal LM's forward makes them; batch x seq x vocab = {E:,} elements")
    if c == 2:
        b.gpu("their fp32 copy (lm_logits.float())", "logits", 4 * E, LOSS,
              f"{VH_SOURCE}: 'force upcast in fp32 if logits are in half-precision'")
    if activations.compute_mode(s) == "low" and s.checkpointing == "none":
        b.gpu("every layer's output, held by output_hidden_states", "activations", 2 * m.layers * T * m.hidden,
              LOSS, "batch x seq x hidden per layer in the 16-bit residual stream, alive until the forward returns")
    autocast = activations.compute_mode(s) == "autocast"
    if autocast:
        b.gpu("the LM head's input cast to 16 bits, saved by its matmul while the logits live", "logits",
              2 * T * m.hidden, LOSS, "autocast's copy of the last hidden state for the head's matmul")
    # the summary linear's input: autocast's 16-bit copy; fp32 (the head's dtype) cast from a 16-bit stream; or the
    # dropout's output itself (fp32 run, or DeepSpeed's engine casting the head to bf16 with the module)
    kept = (2 if s.mixed and s.strat.autocast else 4 if activations.compute_mode(s) == "low" and not s.strat.deepspeed
            else c)
    b.gpu("the value head's saved input: its dropout's mask and the linear's input", "activations",
          (1 + kept) * T * m.hidden, FORWARDS | BWD_START,
          f"{VH_SOURCE}: ValueHead: dropout (p {VALUE_HEAD_DROPOUT}), cast to the head's dtype (fp32 unless "
          f"DeepSpeed cast the module), summary linear")


def words(setup) -> str | None:
    """The report's line on a reward model's pairs and head; None for other runs."""
    if setup.run != "rm":
        return None
    b = setup.batch
    head = ("score head: the decoder's last hidden state through a linear of one output, no LM head and no "
            "vocabulary logits (transformers' sequence classifier, as TRL's RewardTrainer, OpenRLHF and axolotl load "
            "it)" if setup.rm_head == "score" else
            "value head on the causal LM (trl's AutoModelForCausalLMWithValueHead, LLaMA-Factory's stage rm): the LM "
            "head's full logits are made in every forward, with an fp32 copy, and dropped unused")
    return (f"Reward model: each forward runs {b} chosen and {b} rejected sequences ({2 * b} x seq); {head} "
            f"(the rule checked against a dry run of the step re-enacted)")
