"""Hybrid sharding (FSDP2's HSDP on a (dp_replicate, dp_shard) mesh, FSDP1's HYBRID_SHARD within a node) and FSDP2's
reshard_after_forward=False: the estimate against dry runs of torch's own FSDP on a fake process group, the readers
of every format that says them, and one-line refusals. Before these were modelled, an HSDP run was estimated as
sharding over every GPU and a never-resharding one as resharding: both under."""

import textwrap
from pathlib import Path

import pytest

from helpers import estimate, readers
from helpers.errors import InputError
from helpers.measure import dryrun
from helpers.training import TrainSetup

MiB = 2**20


def phases(name: str, s: TrainSetup):
    return estimate.run(name, s, lifecycle=False).gpu.phases, dryrun.run(name, s, progress=False).gpu.phases


@pytest.mark.parametrize("name, options", [
    ("llama-3.2-1b", dict(strategy="fsdp2", gpus=16, dp_replicate=4)),
    ("llama-3.2-1b", dict(strategy="fsdp2", gpus=16, dp_replicate=4, offload_params=True, offload_optimizer=True)),
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=8, dp_replicate=2, lora_rank=8)),
    ("llama-3.2-1b", dict(strategy="fsdp1", gpus=16, gpus_per_node=4, hybrid_shard=True)),
], ids=["fsdp2", "fsdp2-offload", "fsdp2-lora", "fsdp1"])
def test_hybrid_sharding_agrees_with_the_dry_run(name, options):
    """Each phase of the estimate no more than 16 MiB under the dry run of torch's FSDP over a 2-D fake mesh (HSDP)
    or with HYBRID_SHARD's (intra-node, inter-node) groups, and at most 64 MiB or 2.5% over (the forward's 57 MiB
    over for Llama-3.2-1B is FSDP2's on one group of 4 too). With CPU offload the reduce-scatter outputs stay on the GPU until
    backward ends (FSDPParamGroup._all_reduce_state): a GPU item of its own."""
    s = TrainSetup(seq=512, **options)
    est, dry = phases(name, s)
    for phase, got in dry.items():
        assert got - 16 * MiB <= est[phase] <= max(got * 1.025, got + 64 * MiB), (phase, est[phase] / MiB, got / MiB)
    if s.offload_params:
        held = [i for i in estimate.run(name, s, lifecycle=False).items if "HSDP" in i["name"]]
        assert held and all(i["device"] == "gpu" for i in held)


def test_hybrid_sharding_holds_what_one_group_of_its_size_holds():
    """Per GPU, HSDP over 16 GPUs in 4 groups of 4 is FSDP over 4 GPUs (consistency between two set-ups of the
    estimate, the dry runs above being the check), and sharding over all 16 would be under by about a GiB."""
    hsdp = estimate.run("llama-3.2-1b", TrainSetup(strategy="fsdp2", gpus=16, dp_replicate=4, seq=512))
    four = estimate.run("llama-3.2-1b", TrainSetup(strategy="fsdp2", gpus=4, seq=512))
    every = estimate.run("llama-3.2-1b", TrainSetup(strategy="fsdp2", gpus=16, seq=512))
    assert hsdp.gpu.phases == four.gpu.phases
    assert hsdp.gpu.peak_bytes - every.gpu.peak_bytes > 2**30
    fsdp1 = TrainSetup(strategy="fsdp1", gpus=16, gpus_per_node=8, hybrid_shard=True)
    assert (fsdp1.degrees.shard, fsdp1.degrees.dp_replicate) == (8, 2)
    assert fsdp1.degrees.describe() == " (HSDP: 2 groups x 8 GPUs sharding)"


@pytest.mark.parametrize("name, options", [
    ("llama-3.2-1b", dict(strategy="fsdp2", gpus=4)),                           # tied embedding and head
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=8, checkpointing="full", precision="bf16", seq=1024)),
    ("llama-3.2-1b", dict(strategy="fsdp2", gpus=4, lora_rank=16)),
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=4, lora_rank=16)),
    ("tinyllama-1.1b", dict(strategy="fsdp2", gpus=8, tensor_parallel=2)),
], ids=["tied", "untied-bf16-ckpt", "lora-tied", "lora-untied", "tp"])
def test_fsdp2_without_reshard_after_forward_agrees_with_the_dry_run(name, options):
    """reshard_after_forward=False keeps every group unsharded from its forward to its backward: the whole 16-bit
    model at the loss. Each phase within 16 MiB of the dry run; the resharding figure is under by over 512 MiB."""
    s = TrainSetup(seq=options.pop("seq", 512), reshard_after_forward=False, **options)
    est, dry = phases(name, s)
    for phase, got in dry.items():
        assert abs(est[phase] - got) <= 16 * MiB, (phase, est[phase] / MiB, got / MiB)
    resharding = estimate.run(name, s.replace(reshard_after_forward=True), lifecycle=False).gpu.phases
    assert resharding["forward"] < dry["forward"] - 2**29


@pytest.mark.parametrize("options, says", [
    (dict(strategy="fsdp2", gpus=16, dp_replicate=3), "dp_replicate=3 must divide the data-parallel degree 16"),
    (dict(strategy="zero3", gpus=16, dp_replicate=2), "dp_replicate=2 (HSDP) is an FSDP2 option"),
    (dict(strategy="fsdp2", dp_replicate=0), "dp_replicate must be a positive integer, got 0"),
    (dict(strategy="fsdp1", gpus=12, hybrid_shard=True), "the world size must be a whole number of nodes"),
    (dict(strategy="fsdp2", gpus=8, hybrid_shard=True), "hybrid_shard (FSDP1's HYBRID_SHARD) is an FSDP1 option"),
    (dict(strategy="zero2", gpus=8, reshard_after_forward=False), "is an FSDP option"),
])
def test_what_does_not_apply_is_one_line(options, says):
    with pytest.raises(InputError) as err:
        TrainSetup(**options).validate()
    assert says in str(err.value) and "\n" not in str(err.value)


def write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


TRL = "model_name_or_path: meta-llama/Llama-3.2-1B\nbf16: true\n"


@pytest.mark.parametrize("text, want", [
    ("fsdp_sharding_strategy: HYBRID_SHARD", dict(hybrid_shard=True, reshard_after_forward=True)),
    ("fsdp_sharding_strategy: 5", dict(hybrid_shard=True, reshard_after_forward=False)),   # _HYBRID_SHARD_ZERO2
    ("fsdp_sharding_strategy: SHARD_GRAD_OP", dict(hybrid_shard=False, reshard_after_forward=False)),
])
def test_accelerate_fsdp1_sharding_strategies(tmp_path, text, want):
    acc = write(tmp_path, "acc.yaml", f"distributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\n"
                                      f"mixed_precision: bf16\nfsdp_config:\n  fsdp_version: 1\n  {text}\n")
    s = readers.read([write(tmp_path, "t.yaml", TRL), acc], model="llama-3.2-1b").setup
    assert (s.strategy, s.gpus, s.gpus_per_node) == ("fsdp1", 16, 8)
    assert {k: getattr(s, k) for k in want} == want
    assert s.degrees.shard == (8 if s.hybrid_shard else 16)


def test_accelerate_fsdp2_hsdp_and_no_reshard(tmp_path):
    acc = write(tmp_path, "acc.yaml", """\
        distributed_type: FSDP
        num_machines: 2
        num_processes: 16
        fsdp_config:
          fsdp_version: 2
          fsdp_reshard_after_forward: false
        parallelism_config:
          parallelism_config_dp_replicate_size: 2
          parallelism_config_dp_shard_size: 8
        """)
    i = readers.read([write(tmp_path, "t.yaml", TRL), acc], model="llama-3.2-1b")
    s = i.setup
    assert (s.strategy, s.gpus, s.dp_replicate, s.reshard_after_forward, s.degrees.shard) == \
        ("fsdp2", 16, 2, False, 8)
    assert not i.not_modelled or all("replicate" not in n.key and "reshard" not in n.key for n in i.not_modelled)


def test_trl_fsdp_words_and_fsdp_config(tmp_path):
    s = readers.read(write(tmp_path, "a.yaml", TRL + "fsdp: hybrid_shard auto_wrap\nfsdp_config:\n  version: 1\n"),
                     model="llama-3.2-1b").setup
    assert (s.strategy, s.hybrid_shard, s.reshard_after_forward) == ("fsdp1", True, True)
    s = readers.read(write(tmp_path, "b.yaml", TRL + "fsdp: hybrid_shard_zero2\nfsdp_config:\n  version: 1\n"),
                     model="llama-3.2-1b").setup
    assert (s.strategy, s.hybrid_shard, s.reshard_after_forward) == ("fsdp1", True, False)
    s = readers.read(write(tmp_path, "c.yaml", TRL + "fsdp: shard_grad_op\n"), model="llama-3.2-1b").setup
    assert (s.strategy, s.reshard_after_forward) == ("fsdp2", False)          # transformers' default version 2
    s = readers.read(write(tmp_path, "d.yaml", TRL + "fsdp: full_shard\nfsdp_config:\n  reshard_after_forward: "
                                                     "false\n"), model="llama-3.2-1b").setup
    assert (s.strategy, s.reshard_after_forward) == ("fsdp2", False)          # the fsdp_config key wins
    with pytest.raises(InputError, match="not true or false|true or false"):
        readers.read(write(tmp_path, "e.yaml", TRL + "fsdp: full_shard\nfsdp_config:\n  reshard_after_forward: "
                                                     "hybrid_shard\n"), model="llama-3.2-1b")


def test_axolotl_fsdp2_hsdp_and_no_reshard(tmp_path):
    p = write(tmp_path, "ax.yaml", """\
        base_model: meta-llama/Llama-3.2-1B
        micro_batch_size: 1
        sequence_len: 2048
        bf16: true
        fsdp_version: 2
        fsdp_config:
          reshard_after_forward: false
        dp_shard_size: 4
        dp_replicate_size: 2
        """)
    s = readers.read(p, model="llama-3.2-1b").setup
    assert (s.strategy, s.gpus, s.dp_replicate, s.reshard_after_forward, s.degrees.shard) == \
        ("fsdp2", 8, 2, False, 4)


def test_torchtitan_and_torchtune_hsdp(tmp_path):
    toml = write(tmp_path, "t.toml", """\
        [model]
        name = "llama3"
        flavor = "8B"
        [training]
        local_batch_size = 1
        seq_len = 4096
        [parallelism]
        data_parallel_replicate_degree = 2
        data_parallel_shard_degree = 8
        fsdp_reshard_after_forward = "never"
        """)
    s = readers.read(toml).setup
    assert (s.strategy, s.gpus, s.dp_replicate, s.reshard_after_forward, s.degrees.shard) == \
        ("fsdp2", 16, 2, False, 8)
    upstream = Path(__file__).parent / "data/configs_upstream/torchtune/recipes/configs/llama3_2/1B_full.yaml"
    tune = write(tmp_path, "tune.yaml", upstream.read_text() + "\ndata_parallel_shard_dim: 4\n"
                 "data_parallel_replicate_dim: 2\nfsdp_reshard_after_forward: False\n")
    s = readers.read(tune).setup
    assert (s.strategy, s.gpus, s.dp_replicate, s.reshard_after_forward, s.degrees.shard) == \
        ("fsdp2", 8, 2, False, 4)
