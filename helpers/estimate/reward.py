"""A reward model (`run` 'rm'): what it holds in place of a causal LM's output head and logits.

Read in TRL 1.10 (huggingface/trl at f2cd577, trl/trainer/reward_trainer.py), transformers 5.23
(`modeling_layers.py` GenericForSequenceClassification) and peft 0.21 (`tuners/tuners_utils.py`
`_maybe_include_all_linear_layers`, `peft_model.py` PeftModelForSequenceClassification); the step re-enacted by
`helpers.measure.dryrun.RewardStep`:

- **The model.** RewardTrainer loads the checkpoint with `AutoModelForSequenceClassification` and `num_labels=1`:
  the decoder (`model.*`) and a `score` linear of hidden x 1 without bias; the LM head's weight is not loaded, and
  an embedding tied to it is the embedding alone (`spec`). LLaMA-Factory's stage rm (a value head of one output on
  the causal LM, trl's AutoModelForCausalLMWithValueHead) and OpenRLHF's train_rm
  (`get_llm_for_sequence_regression`: the base model and a value head of one output) hold the same.
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

from helpers.estimate.items import BWD_START, LOSS
from helpers.estimate.states import Builder
from helpers.models import ModelSpec, Tensor

SOURCE = ("TRL 1.10 reward_trainer.py RewardTrainer (AutoModelForSequenceClassification, num_labels=1; compute_loss), "
          "transformers 5.23 modeling_layers.py GenericForSequenceClassification")


def spec(m: ModelSpec) -> ModelSpec:
    """`m` as a sequence classifier of one label: its LM head's weight gone (a tied one was the embedding's: it
    stays, untied), a `score.weight` of 1 x hidden in its place."""
    if any(t.name == "score.weight" for t in m.tensors):
        return m                                 # (already a reward model's)
    kept = tuple(t for t in m.tensors if not t.name.startswith("lm_head"))
    score = Tensor("score.weight", m.hidden, "head", 2, (1, m.hidden), True)
    return dataclasses.replace(m, tensors=kept + (score,), tied=False)


def add_score(b: Builder, m: ModelSpec) -> None:
    """The score head's output over every position, its pooled rewards and loss, and their gradients."""
    s = b.setup                                  # (2 x batch sequences: reference.pairs)
    c = 4 if s.precision == "fp32" else 2
    T = s.batch * s.seq
    b.gpu("the score head's output (batch x seq x 1) and the pooled rewards", "logits", T * c + s.batch * 4, LOSS,
          f"{SOURCE}: score(hidden_states) at every position, then the last non-padding token's picked out")
    b.gpu("the score output's gradient (batch x seq x 1)", "logits", T * c, BWD_START,
          "the pooling's backward scatters the rewards' gradient into a zeroed batch x seq x 1 tensor")
