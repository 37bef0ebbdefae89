"""The strategy registry: every strategy is one object, and the CLI, the explorer, the validation and the engines
take their choices from it."""

import pytest

from helpers import strategies
from helpers.errors import InputError
from helpers.estimate import states
from helpers.measure import dryrun, scaled
from helpers.training import STRATEGIES, TrainSetup


def test_every_strategy_has_its_memory_items_and_dry_run_or_a_reason():
    for s in strategies.REGISTRY.values():
        assert set(s.shards) <= set(strategies.SHARDABLE) and list(s.shards) == sorted(
            s.shards, key=strategies.SHARDABLE.index), s.name
        assert (s.dry_run is not None and s.family in dryrun.STEPS) or (s.dry_run is None and s.no_dry_run), s.name
        assert set(s.offload) <= {"offload_optimizer", "offload_params", "offload_ratio"}


# Every table another layer dispatches on, with the registry key it is keyed by and which strategies need an entry.
DISPATCH_TABLES = {
    "estimate.states.MODEL_STATES": (states.MODEL_STATES, "family", lambda s: True),
    "measure.dryrun.STEPS": (dryrun.STEPS, "family", lambda s: s.dry_run is not None),
    "measure.dryrun.TP_STEPS": (dryrun.TP_STEPS, "family", lambda s: s.dry_run is not None and s.model_parallel),
    "measure.scaled.REAL_ENGINES": (scaled.REAL_ENGINES, "engine", lambda s: True),
}


@pytest.mark.parametrize("table", DISPATCH_TABLES)
def test_every_dispatch_table_has_an_entry_for_every_strategy_that_needs_one(table):
    entries, key, needs = DISPATCH_TABLES[table]
    missing = [s.name for s in strategies.REGISTRY.values() if needs(s) and getattr(s, key) not in entries]
    assert not missing, f"{table} has no entry for {missing}"


def test_the_completeness_check_fails_on_a_strategy_without_entries(monkeypatch):
    new = strategies.Strategy("zero9", "a strategy nothing dispatches to", family="zero9", engine="zero9",
                              dry_run="a dry run nobody wrote", model_parallel=True)
    monkeypatch.setitem(strategies.REGISTRY, "zero9", new)
    for table in DISPATCH_TABLES:
        with pytest.raises(AssertionError, match=f"{table} has no entry for .*zero9"):
            test_every_dispatch_table_has_an_entry_for_every_strategy_that_needs_one(table)


def test_the_real_engine_is_chosen_by_the_registry():
    for s in strategies.REGISTRY.values():
        setup = TrainSetup(strategy=s.name, gpus=1 if not s.multi_gpu else 2,
                           precision="bf16-mixed")
        assert scaled.engine_class(setup) is scaled.REAL_ENGINES[s.engine]


def test_choices_come_from_the_registry():
    assert STRATEGIES == tuple(strategies.REGISTRY) == strategies.NAMES
    assert strategies.listing(lambda s: s.deepspeed) == "zero1, zero2 or zero3"
    with pytest.raises(InputError, match=r"unknown strategy 'zero4': allowed are single, ddp, zero1, zero2, zero3, fsdp2, fsdp1"):
        strategies.get("zero4")


def test_cli_and_explorer_offer_the_registry():
    import argparse

    from helpers import __main__ as cli
    from helpers import explore

    p = argparse.ArgumentParser()
    cli.setup_parser(p)
    action = next(a for a in p._actions if a.dest == "strategy")
    assert action.metavar == "{" + ",".join(strategies.NAMES) + "}"
    assert all(s.title in action.help for s in strategies.REGISTRY.values())
    ex = explore.Explorer("llama-3-8b", TrainSetup(gpu_gib=80))
    assert tuple(ex.controls["strategy"].options) == strategies.NAMES


@pytest.mark.parametrize("options, message", [
    (dict(strategy="single", offload_optimizer=True), "offload needs zero1, zero2, zero3, fsdp2 or fsdp1"),
    (dict(strategy="zero2", offload_params=True), "offload_params needs zero3, fsdp2 or fsdp1"),
    (dict(strategy="fsdp2", gpus=2, offload_optimizer=True, offload_params=True, offload_ratio=0.5), r"honoured only by DeepSpeed ZeRO-3 \(partial offload; strategy zero3\)"),
    (dict(strategy="single", gpus=2), "use ddp, zero1, zero2, zero3, fsdp2 or fsdp1"),
    (dict(strategy="fsdp2", use_orig_params=True), "use_orig_params is an FSDP1 option .* use it with strategy fsdp1, got 'fsdp2'"),
    (dict(strategy="zero1", adam_impl="fused", offload_optimizer=True), "steps on the host with DeepSpeedCPUAdam"),
    (dict(strategy="fsdp2", optimizer="adamw-8bit"), "strategies single, ddp, zero1 and zero2"),
])
def test_validation_messages_list_what_the_registry_allows(options, message):
    with pytest.raises(InputError, match=message):
        TrainSetup(**options).validate()


def test_each_property_decides_what_it_says():
    """Two strategies that differ in one property only would differ in that item; here: ZeRO-1 vs ZeRO-2 differ
    in sharding gradients, and the estimate's gradient items follow `shards`."""
    from helpers import estimate

    one = estimate.run("llama-3-8b", TrainSetup(strategy="zero1", gpus=8, seq=128))
    two = estimate.run("llama-3-8b", TrainSetup(strategy="zero2", gpus=8, seq=128))
    full = next(i for i in one.items if i["name"].startswith("gradients (bf16, full)"))
    part = next(i for i in two.items if i["name"].startswith("gradient partition"))
    assert full["bytes"] == 8 * part["bytes"] or abs(full["bytes"] - 8 * part["bytes"]) < 16
