"""How the next-token loss is computed, from the set-up: the model's own loss over the full logits, or TRL's SFT
loss, which depends on TRL's release (helpers.versions, the rules keyed 'trl_*'; the re-enactments in
helpers.measure.trl_loss)."""

from __future__ import annotations

from helpers import versions
from helpers.errors import InputError

FULL, CHUNKED, TILED = "full", "chunked", "tiled"
CHUNK_TOKENS = 256            # trl 1.4.0-1.14.x trainer/sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE
TILE_TOKENS = 4096            # trl 1.16.0 kernels/chunked_logprob.py TOKEN_CHUNK_SIZE
TILE_VOCAB = 32768            # trl 1.16.0 trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE
TILE_STATS = 7                # running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit


def mechanism(s) -> str:
    """'full' (transformers' ForCausalLMLoss over the full logits), 'chunked' (TRL 1.4-1.14's chunked_nll: 256 tokens
    under checkpoint) or 'tiled' (TRL 1.15+'s fused LM head) for the set-up's trl_loss_type and TRL release; 'full'
    too where the head is not whole on a GPU (`unmodelled` says so)."""
    loss_type = s.trl_loss_type
    if loss_type is None:
        return FULL
    if loss_type == "chunked_nll" and versions.older(s, "trl_chunked_nll"):
        release = versions.of(s, "trl")[0]
        raise InputError(f"trl_loss_type 'chunked_nll' needs TRL 1.4.0 or later, got trl={release} (that release "
                         f"refuses it): use 'nll' or a later release")
    if not head_whole(s):
        return FULL
    if not versions.older(s, "trl_fused_lm_head"):
        return TILED
    if loss_type == "unset":
        loss_type = "nll" if versions.older(s, "trl_chunked_nll_default") else "chunked_nll"
    return FULL if loss_type == "nll" else CHUNKED


def projects_in_fp32(s) -> bool:
    """TRL before 1.13: each chunk upcasts the hidden states and the head's weight, h.float() @ w.float().t()."""
    return versions.older(s, "trl_chunk_projects_in_fp32")


def head_whole(s) -> bool:
    """The strategy keeps the output head's whole weight on each GPU (single, DDP, ZeRO-1/2) and no model parallelism
    splits it: where TRL's chunked and tiled losses are modelled."""
    return "dry" in s.strat.fused_ce_modes and s.tensor_parallel == 1 and s.context_parallel == 1


def unmodelled(s) -> str | None:
    """Why TRL's loss is counted as the full logits for this set-up, where it is; None where it is modelled."""
    if s.trl_loss_type is None or head_whole(s):
        return None
    return (f"TRL's chunked/tiled loss under strategy {s.strategy}" + (" with model parallelism"
            if s.tensor_parallel > 1 or s.context_parallel > 1 else "") + " is not modelled: the full logits and "
            "their cross-entropy are counted instead (the head's weight is gathered whole for it): with long sequences "
            "the real figure is lower; with short ones before TRL 1.13 higher, by up to the head's weight in fp32 "
            "(vocab x hidden x 4 bytes), which each chunk makes")
