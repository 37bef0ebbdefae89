"""FSDP with gradient accumulation, the two ways loops run it: every micro batch but the last under no_sync (the HF
Trainer through accelerate, LitGPT's Fabric: each unit's unsharded gradient kept on every GPU, FSDP2's upcast to the
reduce dtype) and a reduce-scatter after every micro batch (torchtitan, torchtune, accelerate's sync_each_batch:
sharded gradients kept). The estimate against dry runs of torch's FSDP1 and FSDP2 on a fake process group run the
same way (`helpers.measure.steps` tells the engine which micro batch syncs), and the readers that set it."""

import textwrap
from pathlib import Path

import pytest

from helpers import estimate, readers
from helpers.measure import dryrun
from helpers.training import TrainSetup

MiB = 2**20


@pytest.mark.parametrize("name, options, over", [
    ("llama-3.2-1b", dict(strategy="fsdp1", gpus=2, gpus_per_node=2, seq=256), 0),
    ("llama-3.2-1b", dict(strategy="fsdp1", gpus=4, lora_rank=16), 0.02),
    ("tinyllama-1.1b", dict(strategy="fsdp1", gpus=4, checkpointing="full", precision="bf16"), 0.025),
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=4), 0.025),
    ("llama-3.2-1b", dict(strategy="fsdp2", gpus=4), 0.08),     # the tied head's backward is counted high
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=4, lora_rank=16, grad_accum=3), 0),
], ids=["fsdp1", "fsdp1-lora", "fsdp1-bf16-ckpt", "fsdp2", "fsdp2-tied", "fsdp2-lora"])
def test_no_sync_accumulation_against_the_dry_run(name, options, over):
    """Never under by more than 16 MiB in any phase, over by at most `over`; reducing every micro batch instead is
    under the no_sync dry run by a GiB or more for a full fine-tune on 4 GPUs (the unsharded gradients it leaves out;
    on 2, FSDP1's fp32 gradient shards weigh what its whole bf16 gradient does)."""
    s = TrainSetup(**{"seq": 512, "grad_accum": 2, **options})
    assert not s.sync_each_batch                                   # the default: the HF Trainer's way
    est = estimate.run(name, s, lifecycle=False)
    dry = dryrun.run(name, s, progress=False)
    for phase, got in dry.gpu.phases.items():
        want = est.gpu.phases[phase]
        assert got - 16 * MiB <= want <= got * (1 + over) + 16 * MiB, (phase, want / MiB, got / MiB)
    assert any("under no_sync" in i["name"] for i in est.items)
    synced = estimate.run(name, s.replace(sync_each_batch=True), lifecycle=False).gpu.phases
    if not s.lora_rank and s.gpus >= 4:
        assert synced["forward"] < dry.gpu.phases["forward"] - 2**30


@pytest.mark.parametrize("name, options", [
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=4)),
    ("llama-3.2-1b", dict(strategy="fsdp1", gpus=2, gpus_per_node=2, seq=256)),
])
def test_sync_each_batch_against_the_dry_run(name, options):
    s = TrainSetup(**{"seq": 512, "grad_accum": 2, "sync_each_batch": True, **options})
    est, dry = estimate.run(name, s, lifecycle=False), dryrun.run(name, s, progress=False)
    for phase, got in dry.gpu.phases.items():
        assert got - 16 * MiB <= est.gpu.phases[phase] <= got * 1.025 + 16 * MiB, phase
    assert not any("under no_sync" in i["name"] for i in est.items)


def test_no_sync_changes_nothing_without_accumulation_or_fsdp():
    for s in (TrainSetup(strategy="fsdp2", gpus=8), TrainSetup(strategy="zero2", gpus=8, grad_accum=4),
              TrainSetup(strategy="ddp", gpus=8, grad_accum=4)):
        assert estimate.run("llama-3.2-1b", s).gpu.phases == \
            estimate.run("llama-3.2-1b", s.replace(sync_each_batch=not s.sync_each_batch)).gpu.phases


def write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_readers_set_how_the_loop_accumulates(tmp_path):
    trl = write(tmp_path, "t.yaml", """\
        model_name_or_path: meta-llama/Llama-3.2-1B
        bf16: true
        gradient_accumulation_steps: 4
        fsdp: full_shard
        accelerator_config:
          gradient_accumulation_kwargs:
            sync_each_batch: true
        """)
    s = readers.read(trl, model="llama-3.2-1b").setup
    assert (s.strategy, s.grad_accum, s.sync_each_batch) == ("fsdp2", 4, True)
    trl.write_text(trl.read_text().split("accelerator_config")[0])
    assert readers.read(trl, model="llama-3.2-1b").setup.sync_each_batch is False        # the Trainer's no_sync
    toml = Path(__file__).parent / "data/configs_upstream/torchtitan/torchtitan/models/llama3/train_configs/llama3_8b.toml"
    i = readers.read(toml)
    assert i.setup.strategy == "fsdp2" and i.setup.sync_each_batch is True
    assert any(d.key == "(training loop)" for d in i.defaults)
