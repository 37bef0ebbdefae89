"""Notebook 07 on a reader's own inputs, not only the shipped example: executed by papermill with other parameters
(its `parameters` cell: FILES, GPUS, MODEL, GPU, HOST_GIB), written to a temporary copy (notebooks/ is never touched).
The claims about the shipped example are guarded in the notebook; these runs check that the paths a user takes run
through, and what each prints where it matters."""

from pathlib import Path

import pytest

papermill = pytest.importorskip("papermill")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "07_will_my_run_fit.ipynb"
CONFIGS = ROOT / "data" / "configs"

ACCELERATE_FSDP1_OFFLOAD = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_offload_params: true
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
mixed_precision: bf16
num_machines: 1
num_processes: 8
"""
TRL_SFT = """\
model_name_or_path: meta-llama/Meta-Llama-3-8B
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
max_length: 2048
gradient_checkpointing: true
bf16: true
"""


def _text(nb) -> str:
    """Everything the executed notebook printed or displayed as text."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") if o.get("output_type") == "stream" else
                       "".join(o.get("data", {}).get("text/plain", "")) + "".join(o.get("data", {}).get("text/markdown", "")))
    return "\n".join(out)


def _run(tmp_path, **parameters):
    out = tmp_path / "07_executed.ipynb"
    nb = papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=parameters, cwd=str(NOTEBOOK.parent),
                                    kernel_name="python3", progress_bar=False)
    return _text(nb)


def test_case6_llamafactory_pair(tmp_path):
    text = _run(tmp_path, FILES=[str(CONFIGS / "case6_llamafactory.yaml"), str(CONFIGS / "ds_z3_offload_config.json")],
                GPU="a100-80gb", HOST_GIB=512)
    assert "read 2 file(s) as llamafactory" in text and "no dry run of this set-up: no dry run for strategy 'zero3'" in text


def test_an_fsdp1_offload_accelerate_file_has_no_dry_run_and_says_why(tmp_path):
    (tmp_path / "sft.yaml").write_text(TRL_SFT)
    (tmp_path / "accelerate.yaml").write_text(ACCELERATE_FSDP1_OFFLOAD)
    text = _run(tmp_path, FILES=[str(tmp_path / "sft.yaml"), str(tmp_path / "accelerate.yaml")])
    assert "fsdp1 on 8 GPU(s)" in text and "no dry run of FSDP1 with CPU offload" in text


def test_a_torchtitan_toml_with_context_parallel(tmp_path):
    toml = (ROOT / "tests" / "data" / "readers" / "torchtitan_llama3_8b.toml").read_text()
    assert "context_parallel_degree = 1" in toml
    (tmp_path / "llama3_8b_cp2.toml").write_text(toml.replace("context_parallel_degree = 1", "context_parallel_degree = 2"))
    text = _run(tmp_path, FILES=[str(tmp_path / "llama3_8b_cp2.toml")], GPUS=8)
    assert "context_parallel has no dry run" in text and "(TP 1 x CP 2 x DP 4)" in text


def test_a_model_given_by_its_local_config_path(tmp_path):
    tiny = ROOT / "tests" / "data" / "tiny-llama.json"
    text = _run(tmp_path, MODEL=str(tiny), GPU="rtx-3090")
    assert f"model: {tiny}" in text and "dry run (" in text


def test_a_setup_no_single_change_fixes_gets_the_closest_changes_to_combine(tmp_path):
    text = _run(tmp_path, MODEL="qwen2.5-72b", GPU="rtx-3090")
    line = next(x for x in text.splitlines() if x.startswith("no single change fits; combine: "))
    listed = line.removeprefix("no single change fits; combine: ").split(" — ")[0].split("; ")
    assert len(listed) == 3 and all(x.endswith(" GiB)") for x in listed), line


UPSTREAM = ROOT / "tests" / "data" / "configs_upstream"


@pytest.mark.parametrize("config, fmt, gpu", [
    ("torchtune/recipes/configs/llama3_2/1B_qlora_single_device.yaml", "torchtune", "a10g"),
    ("litgpt/config_hub/finetune/llama-3.2-1B/lora.yaml", "litgpt", "rtx-3060"),
])
def test_torchtune_and_litgpt_files(tmp_path, config, fmt, gpu):
    text = _run(tmp_path, FILES=[str(UPSTREAM / config)], GPU=gpu)
    assert f"read 1 file(s) as {fmt}" in text and "llama-3.2-1b" in text
