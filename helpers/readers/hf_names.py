"""The Hugging Face names every reader meets, in one table: the Trainer's `optim` values (transformers 5.23,
training_args.py `OptimizerNames`) and a model's `attn_implementation` values (modeling_utils.py), mapped to this
package's optimizer / adam_impl and attention. axolotl, TRL, LLaMA-Factory and OpenRLHF pass these names through to
transformers, so they mean the same in each; a tool's own vocabulary (LLaMA-Factory's `flash_attn: fa2`) stays with
its reader."""

from __future__ import annotations

OPTIMIZERS: dict[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", "foreach"),          # torch.optim.AdamW, torch's default implementation on a GPU
    "adamw_torch_fused": ("adamw", "fused"),      # AdamW(fused=True): TrainingArguments' default from torch 2.8 on
    "adamw_hf": ("adamw", "for-loop"),            # transformers' own AdamW (gone from 5.x): a loop over parameters
    "adamw_bnb_8bit": ("adamw-8bit", None),       # bitsandbytes AdamW8bit
    "adamw_8bit": ("adamw-8bit", None),           # "just an alias for adamw_bnb_8bit"
    "paged_adamw_8bit": ("adamw-8bit", None),     # bitsandbytes PagedAdamW8bit
    "paged_adamw_32bit": ("adamw", None),         # bitsandbytes PagedAdamW32bit: two fp32 states, like torch's
}
"""`optim` -> (optimizer, adam_impl); adam_impl None where the kernel is not torch's (its default is kept)."""

PAGED = frozenset(n for n in OPTIMIZERS if n.startswith("paged_"))
PAGED_WHY = ("paged: bitsandbytes may page the optimizer states to host memory under pressure (unified memory); "
             "estimated on the GPU")

ATTENTION: dict[str, str] = {
    "eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash",
    "kernels-community/flash-attn": "flash", "kernels-community/flash-attn3": "flash",
    "kernels-community/vllm-flash-attn3": "flash",
}
"""`attn_implementation` -> attention (the hub kernels are FlashAttention builds)."""


def attention_known(name: str) -> list[str] | None:
    """None where transformers takes `name` as an attn_implementation (eager, the registered kernels of
    ALL_ATTENTION_FUNCTIONS, a hub kernel "org/repo"); else the names it takes, for the message (transformers
    modeling_utils.py stops a model load on another: 'Specified attn_implementation ... is not supported')."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    names = sorted({"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()})
    if name in names or name in ATTENTION or "/" in name:
        return None
    return names
