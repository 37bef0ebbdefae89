"""LoRA dropout (peft's lora_dropout): each adapted layer keeps its own dropped input for lora_A's backward and the
dropout's mask. The estimate against dry runs of the real peft step on fake tensors (the fake GPU takes torch's fused
native_dropout, as CUDA does: a bool mask), and against the twin trained for real on this CPU, where torch's dropout
keeps its noise in the input's dtype instead (aten/src/ATen/native/Dropout.cpp `_dropout_impl`), so the CPU holds
more than the GPU would."""

from pathlib import Path

import pytest

from helpers import estimate
from helpers.errors import InputError
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup

M = "llama-3.2-1b"


def _worst(e, d) -> float:
    return max(abs(e.gpu.phases[p] - v) / v for p, v in d.gpu.phases.items() if v)


@pytest.mark.parametrize("precision,checkpointing,base", [
    ("bf16-mixed", "none", None), ("bf16", "none", None), ("fp32", "none", None), ("bf16-mixed", "full", None),
    ("bf16", "none", "nf4"),
])
def test_estimate_with_dropout_agrees_with_the_dry_run(precision, checkpointing, base):
    s = TrainSetup(lora_rank=16, lora_dropout=0.1, precision=precision, seq=256, batch=2, checkpointing=checkpointing,
                   base_weights=base)
    e, d = estimate.run(M, s), dryrun.run(M, s, progress=False)
    assert _worst(e, d) <= 0.01, {p: (e.gpu.phases[p], v) for p, v in d.gpu.phases.items()}


def test_dropout_adds_a_copy_and_a_mask_per_adapted_layer_and_the_dry_run_sees_the_same():
    """Adapters in the base's dtype (adapter_dtype bf16: without dropout they share each input)."""
    s = TrainSetup(lora_rank=16, precision="bf16", seq=256, batch=2, adapter_dtype="bf16")
    with_drop = s.replace(lora_dropout=0.1)
    added = estimate.run(M, with_drop).gpu.phases["forward"] - estimate.run(M, s).gpu.phases["forward"]
    seen = dryrun.run(M, with_drop, progress=False).gpu.phases["forward"] - dryrun.run(M, s, progress=False).gpu.phases["forward"]
    m = __import__("helpers.models", fromlist=["spec"]).spec(M)
    tokens = s.batch * s.seq
    per_layer = 3 * m.hidden + m.q_width + 2 * m.hidden + m.intermediate     # q,k,v / o / gate,up / down inputs
    shared = 2 * m.hidden + m.intermediate          # without dropout: q,k,v's and gate,up's shared inputs, down's
    first_layer_unmasked = 3 * m.hidden          # layer 0's q, k, v drop the frozen embedding's output: no mask
    assert added == tokens * (m.layers * ((2 + 1) * per_layer - 2 * shared) - first_layer_unmasked)
    assert abs(seen - added) <= 0.01 * added


def test_the_twin_on_this_cpu_holds_at_least_what_the_estimate_adds():
    base = TrainSetup(lora_rank=8, precision="bf16-mixed", seq=64, batch=2)
    runs = {p: scaled.run(M, base.replace(lora_dropout=p), progress=False) for p in (0.0, 0.1)}
    twin, ts = scaled.scaled_setup(M, base)
    ests = {p: estimate.run(str(twin), ts.replace(lora_dropout=p)) for p in (0.0, 0.1)}
    assert _worst(ests[0.0], runs[0.0]) <= 0.03                                   # without dropout: as before
    measured = runs[0.1].gpu.phases["forward"] - runs[0.0].gpu.phases["forward"]
    estimated = ests[0.1].gpu.phases["forward"] - ests[0.0].gpu.phases["forward"]
    assert estimated > 0 and measured >= estimated          # CPU's fp32 noise (4 B) against CUDA's bool mask (1 B)
    assert runs[0.1].meta["losses"][-1] < runs[0.1].meta["losses"][0]


def test_dropout_needs_a_lora_rank_and_a_probability():
    with pytest.raises(InputError, match="lora_dropout 0.1 needs lora_rank"):
        TrainSetup(lora_dropout=0.1).validate()
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(InputError, match=r"lora_dropout must be a number in \[0, 1\)"):
            TrainSetup(lora_rank=8, lora_dropout=bad).validate()


CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"


def _read(tmp_path, name: str, text: str, *companions: str):
    from helpers import readers

    (tmp_path / name).write_text(text)
    for c in companions:                                   # a companion file the config names, copied beside it
        src = CONFIGS / c
        (tmp_path / c).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / c).write_text(src.read_text())
    imp = readers.read([str(tmp_path / name)])
    origin = next(x for x in imp.settings + imp.defaults if "lora_dropout" in x.fields)
    return imp.setup.lora_dropout, origin


def test_each_tool_gives_its_own_default_and_reads_its_key(tmp_path):
    trl = (CONFIGS / "trl_sft_llama3_8b.yaml").read_text() + "use_peft: true\n"
    p, origin = _read(tmp_path, "trl.yaml", trl)
    assert p == 0.05 and origin.tool.startswith("TRL")                 # TRL's ModelConfig: lora_dropout 0.05
    p, origin = _read(tmp_path, "trl.yaml", trl + "lora_dropout: 0.1\n")
    assert p == 0.1 and origin.line is not None

    lf = (CONFIGS / "case6_llamafactory.yaml").read_text().replace("finetuning_type: full", "finetuning_type: lora")
    p, origin = _read(tmp_path, "lf.yaml", lf, "ds_z3_offload_config.json")
    assert p == 0.0 and origin.tool.startswith("LLaMA-Factory")     # finetuning_args.py: 0.0
    p, _ = _read(tmp_path, "lf.yaml", lf + "lora_dropout: 0.05\n", "ds_z3_offload_config.json")
    assert p == 0.05

    ax = (CONFIGS / "case4_axolotl.yaml").read_text() + "adapter: lora\nlora_r: 8\nlora_target_linear: true\n"
    p, origin = _read(tmp_path, "ax.yaml", ax, "deepspeed_configs/zero3_bf16.json")
    assert p == 0.0 and origin.tool.startswith("axolotl")
    p, _ = _read(tmp_path, "ax.yaml", ax + "lora_dropout: 0.05\n", "deepspeed_configs/zero3_bf16.json")
    assert p == 0.05

    sh = (CONFIGS / "case1_openrlhf_sft.sh").read_text().rstrip() + " \\\n   --lora_rank 8 \\\n   --lora_dropout 0.1\n"
    p, origin = _read(tmp_path, "run.sh", sh)
    assert p == 0.1 and origin.key == "--lora_dropout"


def test_a_bad_dropout_in_a_file_is_one_line(tmp_path):
    from helpers import readers

    trl = (CONFIGS / "trl_sft_llama3_8b.yaml").read_text() + "use_peft: true\nlora_dropout: lots\n"
    (tmp_path / "trl.yaml").write_text(trl)
    with pytest.raises(InputError, match=r"trl\.yaml: lora_dropout 'lots': TRL's parser refuses it \(argparse: invalid "
                                         r"float value\)$"):
        readers.read([str(tmp_path / "trl.yaml")])
