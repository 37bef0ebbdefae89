"""Every set-up option stated once: each TrainSetup field's Face generates its command-line flag, its explorer control
and what `fixes` does with it; checkpointing is one field."""

import argparse
import dataclasses

import pytest

from helpers import __main__ as cli
from helpers import cases, explore, fixes
from helpers.errors import InputError
from helpers.training import FACES, Face, TrainSetup

FIELDS = [f.name for f in dataclasses.fields(TrainSetup)]


def parse(*argv) -> argparse.Namespace:
    p = cli.Parser(prog="test")
    cli.setup_parser(p)
    return p.parse_args(list(argv))


def test_every_field_has_a_face_and_a_flag_or_says_why_not():
    assert list(FACES) == FIELDS
    for name, f in FACES.items():
        assert isinstance(f, Face), name
        assert f.flag or f.file_only, f"{name} has neither a flag nor a reason to be file-only"
    flags = cli.flags()
    assert len(set(flags)) == len(flags) and set(flags.values()) == set(FIELDS)


# A value other than the default for each field, and the flags that give it.
GIVEN = {
    "batch": (["--batch", "3"], 3), "run": (["--run", "dpo"], "dpo"), "reference": (["--reference", "none"], "none"),
    "dpo_logps": (["--dpo-logps", "log-softmax"], "log-softmax"), "rm_head": (["--rm-head", "value-head"], "value-head"),
    "completion": (["--completion", "256"], 256), "generation": (["--generation", "vllm-colocate"], "vllm-colocate"),
    "vllm_share": (["--vllm-share", "0.5"], 0.5), "steps_per_generation": (["--steps-per-generation", "2"], 2),
    "sync_ref": (["--sync-ref"], True), "vllm_sleep": (["--vllm-sleep"], True),
    "entropy_kept": (["--entropy-kept"], True), "engine_sleep": (["--engine-sleep"], True),
    "vllm_tp": (["--vllm-tp", "2"], 2), "score_batch": (["--score-batch", "4"], 4),
    "seq": (["--seq", "512"], 512), "precision": (["--precision", "bf16"], "bf16"),
    "adam_impl": (["--adam-impl", "fused"], "fused"), "optimizer": (["--optimizer", "adamw-8bit"], "adamw-8bit"),
    "lora_rank": (["--lora-rank", "8"], 8), "lora_targets": (["--lora-targets", "q,v"], "q,v"),
    "lora_dropout": (["--lora-dropout", "0.1"], 0.1), "adapter_dtype": (["--adapter-dtype", "bf16"], "bf16"),
    "base_weights": (["--base-weights", "nf4"], "nf4"), "strategy": (["--strategy", "zero3"], "zero3"),
    "versions": (["--versions", "bitsandbytes=0.42.0"], "bitsandbytes=0.42.0"),
    "gpus": (["--gpus", "4"], 4), "tensor_parallel": (["--tp", "2"], 2), "context_parallel": (["--cp", "2"], 2),
    "gpus_per_node": (["--gpus-per-node", "4"], 4), "offload_optimizer": (["--offload-optimizer"], True),
    "offload_params": (["--offload-params"], True), "offload_ratio": (["--offload-ratio", "0.5"], 0.5),
    "zero3_init": (["--no-zero3-init"], False), "save_16bit": (["--no-save-16bit"], False),
    "sharded_save": (["--sharded-save"], True), "use_orig_params": (["--use-orig-params"], True),
    "reshard_after_forward": (["--no-reshard-after-forward"], False), "hybrid_shard": (["--hybrid-shard"], True),
    "dp_replicate": (["--dp-replicate", "2"], 2), "sync_each_batch": (["--sync-each-batch"], True),
    "reduce_dtype": (["--reduce-dtype", "bf16"], "bf16"),
    "checkpoint_saves": (["--no-checkpoint-saves"], False),
    "sharded_load": (["--sharded-load"], True), "load_dtype": (["--load-dtype", "fp32"], "fp32"),
    "pin_memory": (["--no-pin-memory"], False), "checkpointing": (["--grad-checkpointing"], "full"),
    "checkpoint_every": (["--checkpoint-every", "2"], 2), "grad_accum": (["--grad-accum", "4"], 4),
    "fused_ce": (["--fused-ce"], True), "kv_expanded": (["--expanded-kv"], True),
    "trl_loss_type": (["--trl-loss-type", "chunked_nll"], "chunked_nll"),
    "outputs_held": (["--outputs-held"], True),
    "attention": (["--attention", "flash"], "flash"),
    "gpu_gib": (["--gpu-gib", "40"], 40.0), "host_gib": (["--host-gib", "512"], 512.0), "resume": (["--resume"], True),
    "reduce_bucket_size": (["--reduce-bucket-size", "1000"], 1000), "sub_group_size": (["--sub-group-size", "1000"], 1000),
    "optimizer_groups": (["--optimizer-groups", "one"], "one"),
    "prefetch_bucket_size": (["--prefetch-bucket-size", "1000"], 1000), "overlap_comm": (["--no-overlap-comm"], False),
}


@pytest.mark.parametrize("name", FIELDS)
def test_each_flag_sets_its_field_and_only_it(name):
    argv, value = GIVEN[name]
    a = parse(*argv)
    assert cli.given(a) == {name: value}
    assert cli._flag_of(a, name) == argv[0]                  # the override is reported under the flag typed


def test_no_flag_typed_sets_nothing():
    assert cli.given(parse()) == {}


def test_a_flag_naming_no_choice_is_one_line(capsys):
    assert cli.main(["estimate", "--model", "llama-3-8b", "--checkpointing", "half"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown checkpointing 'half': allowed are none, full, selective"


def test_checkpointing_is_one_field():
    assert TrainSetup(grad_checkpointing=True) == TrainSetup(checkpointing="full")
    assert TrainSetup(grad_checkpointing=False) == TrainSetup() and TrainSetup().checkpointing == "none"
    old = {"grad_checkpointing": True, "checkpointing": None}          # a set-up saved before the fold
    assert TrainSetup(**old).checkpointing == "full"
    full = TrainSetup(checkpointing="full", checkpoint_every=2)
    assert full.replace(grad_checkpointing=False, checkpoint_every=1).checkpointing == "none"
    assert TrainSetup(checkpointing="selective").replace(grad_checkpointing=False).checkpointing == "selective"
    assert "grad_checkpointing" not in dataclasses.asdict(full)
    with pytest.raises(InputError, match="grad_checkpointing=True means checkpointing 'full'"):
        TrainSetup(checkpointing="selective", grad_checkpointing=True)
    with pytest.raises(InputError, match="grad_checkpointing must be True or False, got 'yes'"):
        TrainSetup(grad_checkpointing="yes")


def test_a_value_that_no_longer_applies_goes_back_unless_the_user_gave_it():
    base = TrainSetup(checkpointing="full", checkpoint_every=2)
    assert cli.setup_from_args(parse("--checkpointing", "none"), base).checkpoint_every == 1
    with pytest.raises(InputError, match="checkpoint_every 2 .* needs checkpointing 'full'"):
        cli.setup_from_args(parse("--checkpointing", "none", "--checkpoint-every", "2"), base)


SETUPS = [cases.setup(n, fixed=fixed) for n in range(1, 7) for fixed in (False, True)] + [
    TrainSetup(gpu_gib=80, lora_rank=16, lora_targets="q,v", base_weights="nf4", batch=100, seq=3000),
    TrainSetup(strategy="zero3", gpus=8, offload_optimizer=True, offload_params=True, offload_ratio=0.3,
               gpus_per_node=4, resume=True, adam_impl=None),
    TrainSetup(strategy="fsdp2", gpus=16, tensor_parallel=2, context_parallel=2, checkpointing="full",
               checkpoint_every=3, grad_accum=5, attention="flash", host_gib=256.0),
    TrainSetup(strategy="fsdp2", gpus=16, dp_replicate=2, reshard_after_forward=False),
    TrainSetup(strategy="fsdp1", gpus=16, hybrid_shard=True, gpus_per_node=4),
]


@pytest.mark.parametrize("setup", SETUPS, ids=range(len(SETUPS)))
def test_the_explorers_controls_round_trip_every_setup(setup):
    model = "llama-3-8b"
    ex = explore.Explorer(model, setup)
    assert ex.setup_from_controls() == setup
    assert set(ex.controls) == {"model"} | {n for n, f in FACES.items() if f.control is not None}


def test_the_explorer_sets_none_and_values_off_its_stops():
    ex = explore.Explorer("llama-3-8b", TrainSetup(strategy="zero3", gpus=8, offload_optimizer=True, gpu_gib=80))
    ex.set(offload_ratio=0.35)                                   # not a stop of the slider: added
    assert ex.setup.offload_ratio == 0.35 and ex.error is None
    ex.set(offload_ratio=None)
    assert ex.setup.offload_ratio is None
    ex.set(lora_rank=16, lora_targets="q,v")
    ex.set(lora_rank=None)                                       # the targets go back with the rank
    assert (ex.setup.lora_rank, ex.setup.lora_targets) == (None, "all-linear")
    with pytest.raises(InputError, match="no control 'nosuch'"):
        ex.set(nosuch=1)


def test_fixes_takes_its_single_valued_ways_out_and_untimed_fields_from_the_faces():
    names = [n for n, _ in fixes._candidates(None, TrainSetup(lora_rank=8, lora_dropout=0.1))   # no remedy in effect
             + fixes._candidates(None, TrainSetup(strategy="zero3", gpus=8, zero3_init=False, load_dtype="fp32"))
             + fixes._candidates(None, TrainSetup(strategy="fsdp1", gpus=8, reshard_after_forward=False,
                                                  hybrid_shard=True))
             + fixes._candidates(None, TrainSetup(strategy="fsdp2", gpus=8, dp_replicate=2))
             + fixes._candidates(None, TrainSetup(run="grpo", dpo_logps="openrlhf", entropy_kept=True,
                                                  score_batch=4))]
    for field, f in FACES.items():
        if f.remedy:
            assert f.remedy[0] in names, field
    assert fixes.NO_TIME == {n: f.no_time for n, f in FACES.items() if f.no_time}
    assert "attention" in fixes.NO_TIME and "batch" not in fixes.NO_TIME
