"""The axolotl, torchtitan and OpenRLHF readers against those tools' own example configs (copies in
tests/data/configs_upstream, unchanged, sources in its SOURCES.md). Each expected reading is written from the tool's
source at the commit the reader names (axolotl 067b021c, torchtitan 238fa995, OpenRLHF 3c3be623); what a file sets
that the estimate does not model must be listed in not_modelled, never left under "ignored"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import models
from helpers.readers import ConfigError, read

UP = Path(__file__).resolve().parent / "data" / "configs_upstream"
AX = UP / "axolotl" / "examples"
TT = UP / "torchtitan" / "torchtitan" / "models"
OR = UP / "openrlhf" / "examples" / "scripts"
ROOT = Path(__file__).resolve().parents[1]
LLAMA_LINEAR = "gate_proj,down_proj,up_proj,q_proj,v_proj,k_proj,o_proj"


def reading(paths) -> dict:
    imp = read(paths)
    s = imp.setup
    return {"model": imp.model, "named": imp.model_named, "strategy": s.strategy, "gpus": s.gpus, "batch": s.batch,
            "seq": s.seq, "grad_accum": s.grad_accum, "precision": s.precision, "lora_rank": s.lora_rank,
            "lora_targets": s.lora_targets if s.lora_rank else None, "lora_dropout": s.lora_dropout,
            "base_weights": s.base_weights, "checkpointing": s.checkpointing, "optimizer": s.optimizer,
            "adam_impl": s.adam_impl, "offload": (s.offload_params, s.offload_optimizer), "tp": s.tensor_parallel,
            "cp": s.context_parallel, "fused_ce": s.fused_ce, "run": s.run, "reference": s.ref, "dpo_logps": s.dpo_logps, "generation": s.generation,
            "vllm_share": s.vllm_share, "vllm_sleep": s.vllm_sleep, "entropy_kept": s.entropy_kept,
            "completion": s.completion, "engine_sleep": s.engine_sleep,
            "vllm_tp": s.vllm_tp, "score_batch": s.score_batch, "not_modelled": {n.key for n in imp.not_modelled},
            "ignored": {i.key for i in imp.ignored}}


# axolotl @067b021c: micro_batch_size x sequence_len; bf16 auto -> bf16-mixed (fp32 LoRA adapters);
# gradient_checkpointing true -> every layer; optimizer adamw_bnb_8bit / paged_adamw_8bit -> 8-bit AdamW (paging
# listed); load_in_4bit -> nf4 with double quantisation (axolotl's bnb defaults); lora_target_linear -> every linear
# layer; rl dpo -> run dpo (chosen and rejected in one forward, the estimate doubles the batch; LoRA's base as the
# reference); reward_model -> run rm (a score head, chosen and rejected in one forward); a hub id outside the catalogue
# stays unresolved (the CLI then asks for --model or downloads its config.json).
AXOLOTL = [
    ("llama-3/lora-1b.yml",
     dict(model=None, named="NousResearch/Llama-3.2-1B", strategy="single", batch=2, seq=2048, grad_accum=2,
          precision="bf16-mixed", lora_rank=16, lora_targets=LLAMA_LINEAR, lora_dropout=0.05, base_weights=None,
          checkpointing="full", optimizer="adamw-8bit", not_modelled=set())),
    ("llama-3/qlora-1b.yml",
     dict(batch=2, grad_accum=4, lora_rank=32, base_weights="nf4-dq", checkpointing="full", not_modelled=set())),
    ("llama-3/fft-8b.yaml",
     dict(named="NousResearch/Meta-Llama-3.1-8B", batch=1, seq=8192, grad_accum=8, lora_rank=None,
          optimizer="adamw-8bit", checkpointing="full", not_modelled={"optimizer"})),
    ("llama-3/lora-8b.yml",
     dict(lora_rank=32, lora_targets="all-linear-names", seq=4096,
          not_modelled={"load_in_8bit", "lora_modules_to_save"})),
    ("llama-3/instruct-dpo-lora-8b.yml",
     dict(model="llama-3-8b", batch=2, seq=4096, lora_rank=32, run="dpo", reference="adapters-off",
          not_modelled={"load_in_8bit"})),
    ("llama-3/3b-fp8-fsdp2.yaml",
     dict(model="llama-3.2-3b", strategy="fsdp2", batch=16, seq=512, lora_rank=None, checkpointing="none",
          optimizer="adamw", adam_impl="fused", fused_ce=True,
          not_modelled={"attn_implementation", "fp8", "fp8_enable_fsdp_float8_all_gather", "torch_compile",
                        "liger_glu_activation", "liger_layer_norm", "liger_rms_norm", "liger_rope"})),
    ("gemma2/reward-model.yaml",
     dict(model="gemma-2-2b", batch=2, lora_rank=None, run="rm", not_modelled=set())),
    ("gemma3/gemma-3-4b-vision-qlora.yml",
     dict(model="gemma-3-4b", named="google/gemma-3-4b-it", base_weights="nf4-dq", lora_rank=32,
          lora_targets="down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj",     # its regex, as peft reads it
          not_modelled={"base_model"})),
]


@pytest.mark.parametrize("name, want", AXOLOTL, ids=[n for n, _ in AXOLOTL])
def test_axolotl_examples(name, want):
    got = reading(AX / name)
    assert {k: got[k] for k in want} == want
    assert not got["ignored"] & {"lora_modules_to_save", "reward_model", "fp8", "torch_compile",
                                 "unfrozen_parameters", "num_labels"}


def test_axolotl_reward_model_and_vision_say_which_way_the_real_figure_lies():
    imp = read(AX / "gemma2" / "reward-model.yaml")
    assert imp.setup.run == "rm" and imp.setup.rm_head == "score"
    assert {s.key for s in imp.settings} >= {"model_type", "num_labels", "reward_model"}  # the reward model's head
    imp = read(AX / "gemma3" / "gemma-3-4b-vision-qlora.yml")
    (tower,) = [n for n in imp.not_modelled if n.key == "base_model"]
    assert "Gemma3ForConditionalGeneration" in tower.why and "higher" in tower.why
    assert f"{models.tower_params('gemma-3-4b') / 1e9:.2f} B parameters" in tower.why


def test_gemma3_vision_tower_is_counted_by_transformers_own_class():
    """The tower's size comes from transformers' Gemma3ForConditionalGeneration built from the published
    vision_config: SigLIP so400m's 27 layers of width 1152 (about 0.42 B) plus the projector (1152 x hidden)."""
    towers = models.tower_params("gemma-3-4b")
    projector = 1152 * models.spec("gemma-3-4b").hidden + 1152          # mm_input_projection_weight + soft-emb norm
    assert 0.41e9 < towers - projector < 0.42e9
    assert models.tower_params("gemma-3-1b") is None and models.tower_params("llama-3.1-8b") is None


def test_axolotl_deepspeed_example_with_its_json_from_axolotl_root():
    got = reading([AX / "mistral" / "bigstral" / "bigstral-ds-zero3.yaml",
                   UP / "axolotl" / "deepspeed_configs" / "zero3_bf16_cpuoffload_params.json"])
    assert (got["strategy"], got["offload"], got["lora_rank"]) == ("zero3", (True, False), None)
    assert {"unfrozen_parameters", "optimizer"} <= got["not_modelled"]
    alone = reading(AX / "mistral" / "bigstral" / "bigstral-ds-zero3.yaml")     # found under the copy's root, as
    assert alone == got                                                         # axolotl finds it under its own


def test_axolotl_qlora_under_fsdp1_is_estimated_as_lora_with_the_4bit_base_said():
    """LoRA under FSDP1 is modelled (peft's wrap policy); a bitsandbytes 4-bit base under an engine's sharding is not:
    the file is estimated with a 16-bit base (the real weights smaller) and load_in_4bit listed as not modelled."""
    got = reading(AX / "llama-3" / "qlora-fsdp-70b.yaml")
    assert (got["strategy"], got["lora_rank"], got["base_weights"], got["offload"]) == ("fsdp1", 8, None, (True, True))
    assert "load_in_4bit" in got["not_modelled"]


def test_axolotl_fused_loss_with_tp_and_cp_is_estimated_without_it_and_said():
    """Cut Cross-Entropy (the plugin's default) beside TP 2 x CP 2: estimated over the logits, listed as not modelled
    with the real figure lower (once refused whole)."""
    got = reading(AX / "distributed-parallel" / "qwen3-8b-fsdp-tp-cp.yaml")
    assert (got["model"], got["strategy"], got["gpus"], got["tp"], got["cp"], got["fused_ce"]) == (
        "qwen3-8b", "fsdp2", 8, 2, 2, False)
    (cce,) = [n for n in read(AX / "distributed-parallel" / "qwen3-8b-fsdp-tp-cp.yaml").not_modelled
              if n.key == "cut_cross_entropy"]
    assert "real figure is lower" in cce.why


# torchtitan @238fa995 (job_config.py, run_train.sh NGPU=8): data_parallel_shard_degree -1 takes what TP/CP/PP leave;
# shard > 1 -> FSDP2, else plain data parallel; activation_checkpoint.mode full/selective.
TORCHTITAN = [
    ("llama3/train_configs/llama3_8b.toml",
     dict(model="llama-3.1-8b", strategy="fsdp2", gpus=8, batch=1, seq=8192, checkpointing="selective", tp=1,
          adam_impl="fused", not_modelled=set())),
    ("llama3/train_configs/llama3_70b.toml",
     dict(model="llama-3.1-70b", strategy="ddp", gpus=8, batch=8, seq=8192, tp=8, checkpointing="full")),
    ("qwen3/train_configs/qwen3_32b.toml",
     dict(model="qwen3-32b", strategy="fsdp2", batch=2, seq=4096, checkpointing="full")),
    ("deepseek_v3/train_configs/deepseek_v3_16b.toml",
     dict(model=None, named="deepseek_v3 16B", strategy="fsdp2", checkpointing="selective",
          not_modelled={"compile.enable", "parallelism.expert_parallel_degree"})),
]


@pytest.mark.parametrize("name, want", TORCHTITAN, ids=[n for n, _ in TORCHTITAN])
def test_torchtitan_presets(name, want):
    got = reading(TT / name)
    assert {k: got[k] for k in want} == want


def test_torchtitan_flux_is_refused_not_estimated_as_a_language_model():
    with pytest.raises(ConfigError, match="model.name 'flux' is torchtitan's FLUX diffusion image model"):
        read(TT / "flux" / "train_configs" / "flux_dev_model.toml")


# OpenRLHF @3c3be623 (dotted flags): DPO and RM put chosen and rejected in one forward (run dpo, rm); PPO's actor
# checkpoints with --actor.gradient_checkpointing_enable; --train.dynamic_batch_enable with packing makes each micro
# batch one bin of at most max_tokens_per_gpu x ring x TP tokens (or one max_len sample); bash arrays expanded.
OPENRLHF = [
    ("train_sft.sh", dict(model="llama-3-8b", strategy="zero2", batch=2, seq=2048, checkpointing="full",
                          not_modelled=set())),
    ("train_dpo_llama.sh", dict(model=None, named="OpenRLHF/Llama-3-8b-sft-mixture", strategy="zero3", batch=1,
                                seq=8192, checkpointing="full", run="dpo", reference="copy",
                                not_modelled={"log_probs_from_logits"})),
    ("train_rm.sh", dict(strategy="zero3", batch=1, seq=8192, run="rm", not_modelled=set())),
    # train_ppo_ray: the actor's step as OpenRLHF takes it (run grpo, its log-probabilities); --train.colocate_all
    # puts the reference (KL coefficient > 0) and every vLLM worker on the actor's GPUs; the critic (gae) and the
    # reward model that share them are listed as raising the figure, with each process's CUDA context
    ("train_ppo_ray_hybrid_engine.sh",
     dict(strategy="zero3", gpus=8, batch=1, seq=16384, checkpointing="full", run="grpo", dpo_logps="openrlhf",
          reference="copy", generation="vllm-colocate", vllm_share=0.5, vllm_sleep=True, entropy_kept=False,
          completion=2047, engine_sleep=True, vllm_tp=2, score_batch=1,
          not_modelled={"--train.dynamic_batch_enable", "--reward.model_name_or_path", "critic model (gae)",
                        "processes sharing each GPU"})),
    ("train_reinforce_baseline_hybrid_engine.sh",
     dict(named="Qwen/Qwen3-4B-Thinking-2507", strategy="zero3", gpus=4, batch=1, seq=74240, checkpointing="full",
          run="grpo", dpo_logps="openrlhf", reference="copy", generation="vllm-colocate", vllm_share=0.7,
          vllm_sleep=False, entropy_kept=True, completion=64000, engine_sleep=True,
          not_modelled={"--train.dynamic_batch_enable", "processes sharing each GPU", "--ds.ring_attn_size"})),
    ("train_sft_mixtral_lora.sh", dict(model="mixtral-8x7b", strategy="zero3", lora_rank=64, batch=4)),
    # DAPO (group_norm, no critic) colocated with both sleeps; PPO with a remote reward function (the critic on its
    # own 2 GPUs, the reference on the actor's: colocate_actor_ref, vLLM on its own); ProRL v2 (32k tokens, packed
    # bins); REINFORCE baseline async (colocate_all colocates the DeepSpeed models alone: vLLM on its own GPUs)
    ("train_dapo_ray_hybrid_engine.sh",
     dict(named="OpenRLHF/Llama-3-8b-sft-mixture", strategy="zero3", gpus=8, batch=8, seq=2048, grad_accum=2,
          run="grpo", dpo_logps="openrlhf", reference="copy", generation="vllm-colocate", vllm_share=0.6,
          vllm_sleep=True, engine_sleep=True, vllm_tp=2, score_batch=16,
          not_modelled={"processes sharing each GPU"})),
    ("train_ppo_with_reward_fn.sh",
     dict(named="OpenRLHF/Llama-3-8b-sft-mixture", strategy="zero3", gpus=2, batch=8, seq=2048, run="grpo",
          dpo_logps="openrlhf", reference="copy", generation="vllm-server", engine_sleep=False,
          not_modelled={"processes sharing each GPU"})),
    ("train_prorlv2_math_hybrid_engine.sh",
     dict(named="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", strategy="zero3", gpus=8, batch=1, seq=32768,
          completion=8192, run="grpo", dpo_logps="openrlhf", reference="copy", generation="vllm-colocate",
          vllm_share=0.75, vllm_sleep=True, engine_sleep=True)),
    ("train_reinforce_baseline_ray_agent_async.sh",
     dict(named="Qwen/Qwen3-4B-Thinking-2507", strategy="zero3", gpus=4, batch=1, seq=74240, run="grpo",
          dpo_logps="openrlhf", reference="copy", generation="vllm-server", entropy_kept=True)),
]


@pytest.mark.parametrize("name, want", OPENRLHF, ids=[n for n, _ in OPENRLHF])
def test_openrlhf_examples(name, want):
    got = reading(OR / name)
    assert {k: got[k] for k in want} == want
    assert not got["ignored"] & {"--actor.gradient_checkpointing_enable", "--train.dynamic_batch_enable",
                                 "--train.max_tokens_per_gpu", "--critic.num_nodes", "--critic.num_gpus_per_node",
                                 "--rollout.micro_batch_size", "--vllm.tensor_parallel_size"}


def test_openrlhf_dynamic_batch_without_packing_is_listed_not_binned(tmp_path):
    text = (OR / "train_ppo_ray_hybrid_engine.sh").read_text().replace("--ds.packing_samples", "")
    (tmp_path / "run.sh").write_text(text)
    got = reading(tmp_path / "run.sh")
    assert (got["batch"], got["seq"]) == (1, 2048)                      # --train.micro_batch_size's default, max_len
    assert "--train.dynamic_batch_enable" in got["not_modelled"]


def test_multimodal_hub_ids_and_configs(tmp_path):
    """A --model hub id of a multimodal checkpoint says what is left out; a multimodal config.json is refused."""
    run = [sys.executable, "-m", "helpers", "estimate", "--offline", "--model"]
    out = subprocess.run(run + ["google/gemma-3-12b-it"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and "not modelled: google/gemma-3-12b-it is a multimodal checkpoint" in out.stdout
    out = subprocess.run(run + ["unsloth/Llama-3.2-1B-Instruct"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("llama-3.2-1b:") and "multimodal" not in out.stdout
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "gemma3", "text_config": {"hidden_size": 2560}, "vision_config": {}}')
    out = subprocess.run(run + [str(cfg)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "vision-language checkpoint" in out.stderr


def test_mirrors_map_to_their_originals_and_skip_prequantised_uploads():
    ids = models.hub_ids()
    assert ids["unsloth/llama-3-8b"] == "llama-3-8b" and ids["unsloth/qwen2.5-7b-instruct"] == "qwen2.5-7b"
    assert not any("bnb" in m or "4bit" in m for m in models.mirrors())


# What a new user's own files showed (a fresh-eyes test of this reader set): each now read or listed.
PPO_ARRAY = """ARGS=(
  --actor.num_nodes 1 --actor.num_gpus_per_node 4
  --vllm.num_engines 4 --vllm.tensor_parallel_size 1
  --train.colocate_all            # everything on the same 4 GPUs
  --vllm.gpu_memory_utilization 0.6
  --actor.model_name_or_path meta-llama/Llama-3.1-8B
  --ds.zero_stage 3 --ds.param_dtype bf16
  --train.micro_batch_size 2 --train.batch_size 64
  --data.max_len 4096
  --actor.gradient_checkpointing_enable
)
python3 -m openrlhf.cli.train_ppo_ray "${ARGS[@]}"
"""


def test_openrlhf_colocation_puts_vllm_and_the_reference_on_the_actors_gpus(tmp_path):
    """A comment inside a bash array is bash's (it was read as flags). --train.colocate_all puts every vLLM worker and
    the reference (KL coefficient 0.01 by default) on the actor's 4 GPUs: without sleep vLLM's share (0.6 of 79.6
    GiB) is held through the training step and the run cannot fit (it was listed as not modelled, and "fits");
    vLLM's sleep moves it to the generation, where the actor's states are still on the GPU; DeepSpeed's sleep moves
    those to the host there, and it fits, for what is modelled (the critic's 16-bit weights stay)."""
    from helpers import estimate, report

    def run(text):
        (tmp_path / "ppo.sh").write_text(text)
        imp = read(tmp_path / "ppo.sh")
        return imp, estimate.run(imp.model, imp.setup.replace(gpu_gib=79.6))

    imp, r = run(PPO_ARRAY)
    s = imp.setup
    assert (imp.model, s.gpus, s.batch, s.checkpointing) == ("llama-3.1-8b", 4, 2, "full")
    assert (s.run, s.dpo_logps, s.ref, s.generation, s.vllm_share, s.vllm_sleep) == (
        "grpo", "openrlhf", "copy", "vllm-colocate", 0.6, False)
    assert not {i.key for i in imp.ignored} & {"--train.colocate_all", "--vllm.gpu_memory_utilization"}
    share = int(0.6 * 79.6 * 2**30)
    vllm = [i for i in r.items if i["name"].startswith("vLLM engine")]
    assert [i["bytes"] for i in vllm] == [share] and r.gpu.phases["backward"] > share
    assert report.verdict(r).startswith("OOM on GPU at the backward")
    imp, r = run(PPO_ARRAY.replace("--train.colocate_all", "--train.colocate_all --vllm.enable_sleep"))
    assert r.gpu.phases["backward"] < share and report.verdict(r).startswith("OOM on GPU at the generation")
    imp, r = run(PPO_ARRAY.replace("--train.colocate_all", "--train.colocate_all --vllm.enable_sleep "
                                                           "--ds.enable_sleep"))
    assert imp.setup.engine_sleep and report.verdict(r).startswith("fits")
    caution = report.unmodelled_caution(r, imp)
    assert "critic model (gae)" in caution and "processes sharing each GPU" in caution
    gen = r.gpu.breakdown["generation"]
    assert not {"master_weights", "optimizer_states", "gradients"} & {c for c, v in gen.items() if v}


def test_openrlhf_missing_model_names_the_ppo_flag(tmp_path):
    (tmp_path / "ppo.sh").write_text(PPO_ARRAY.replace("--actor.model_name_or_path meta-llama/Llama-3.1-8B", ""))
    with pytest.raises(ConfigError, match="give --actor.model_name_or_path HUB_ID_OR_PATH"):
        read(tmp_path / "ppo.sh")


@pytest.mark.parametrize("extra, key, way", [
    ("qat:\n  weight_dtype: int4\n  group_size: 32\n", "qat", "higher"),
    ("tiled_mlp: true\n", "tiled_mlp", "lower"),
    ("unfrozen_parameters:\n  - ^lm_head.weight$\n", "unfrozen_parameters", "higher"),
])
def test_axolotl_more_keys_listed_with_their_direction(tmp_path, extra, key, way):
    text = (AX / "llama-3" / "qlora-1b.yml").read_text() + extra
    (tmp_path / "run.yml").write_text(text)
    imp = read(tmp_path / "run.yml")
    (n,) = [n for n in imp.not_modelled if n.key == key]
    assert f"real figure is {way}" in n.why                # unfrozen beside an adapter: trained on top of it


def test_a_prequantised_config_says_its_weights_are_4_bit(tmp_path):
    import json

    cfg = json.loads((ROOT / "data" / "models" / "llama-3-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_use_double_quant": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    note = models.quantization_note(tmp_path / "config.json", None)
    assert "pass --base-weights nf4-dq" in note and "real figure is lower" in note
    assert models.quantization_note(tmp_path / "config.json", "nf4-dq") is None
    assert models.quantization_note("llama-3-8b", None) is None


def test_litgpt_lists_its_untied_head_where_the_catalogue_ties_it():
    """LitGPT builds lm_head apart from the embedding (the published LitGPT rows use the untied config, and land within
    5%): a Llama 3.2 file lists the second matrix as raising the figure; Llama 3 8B (untied anyway) does not."""
    lg = UP / "litgpt" / "config_hub" / "finetune"
    (head,) = [n for n in read(lg / "llama-3.2-1B" / "lora.yaml").not_modelled if n.key == "(LitGPT's output head)"]
    assert "263 M-parameter" in head.why and "higher" in head.why
    assert not [n for n in read(lg / "llama-3-8b" / "lora.yaml").not_modelled if n.key == "(LitGPT's output head)"]


def test_llamafactory_with_the_accelerate_config_it_is_launched_with():
    """`accelerate launch --config_file multi_node.yaml src/train.py qwen3_lora_sft.yaml`: the launcher's world size
    and strategy apply to LLaMA-Factory's YAML as to TRL's (both files once refused as 'not referred to')."""
    lf = UP / "llamafactory" / "examples" / "train_lora" / "qwen3_lora_sft.yaml"
    acc = UP / "accelerate" / "examples" / "config_yaml_templates" / "multi_node.yaml"
    for files in ([lf, acc], [acc, lf]):
        imp = read(files)
        s = imp.setup
        assert (imp.format, s.strategy, s.gpus, s.gpus_per_node, s.lora_rank) == ("llamafactory", "ddp", 8, 4, 8)
        assert {Path(f).name for f in imp.files} == {lf.name, acc.name}
    fsdp = read([lf, UP / "accelerate" / "examples" / "config_yaml_templates" / "fsdp.yaml"])   # (once refused)
    s = fsdp.setup                       # LoRA under accelerate's FSDP1, with the template's fsdp_use_orig_params
    assert (s.strategy, s.gpus, s.lora_rank, s.use_orig_params) == ("fsdp1", 2, 8, True)


@pytest.mark.parametrize("ds, gpus, field, value", [
    ('{"train_batch_size": 64, "zero_optimization": {"stage": 2}}', 8, "batch", 8),
    ('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}', 8,
     "grad_accum", 4),
])
def test_deepspeed_train_batch_size_is_split_again_over_gpus(tmp_path, capsys, ds, gpus, field, value):
    """DeepSpeed derives the micro batch (or the accumulation) from train_batch_size and the world size: read alone
    over a world of 1, and split again when --gpus N says the world (it once stayed split over 1)."""
    import json

    from helpers.__main__ import main

    (tmp_path / "ds.json").write_text(ds)
    run = ["estimate", "--offline", "--from", str(tmp_path / "ds.json"), "--model", "llama-3.2-1b", "--json"]
    assert main(run + ["--gpus", str(gpus)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"][field] == value and doc["setup"]["gpus"] == gpus
    assert any(o["field"] == field and "split again" in o["from"] for o in doc["imported"]["overrides"])
    assert main(run + ["--gpus", "3"]) == 2
    assert "x 3 GPU(s) x a whole" in capsys.readouterr().err
    # --batch given too: the accumulation is what DeepSpeed derives (train_batch_size / (micro batch x world))
    assert main(run + ["--gpus", "4", "--batch", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["setup"]["batch"], doc["setup"]["grad_accum"]) == (8, 2)
    assert main(run + ["--gpus", "4", "--batch", "4", "--grad-accum", "2"]) == 2          # 4 x 2 x 4 != 64
    assert "is not the file's train_batch_size 64" in capsys.readouterr().err


GRPO = """model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct
output_dir: out
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
num_generations: 8
max_completion_length: 1024
use_vllm: true
vllm_mode: colocate
bf16: true
gradient_checkpointing: true
beta: 0.04
"""


def test_trl_grpo_sequence_is_prompt_plus_completion_and_its_reference_and_vllm_read(tmp_path):
    """GRPOConfig (trl @f2cd577): a sequence is a prompt and a completion (max_completion_length, 512 by default);
    TRL 1.x no longer truncates prompts, so 512 prompt tokens are assumed and said; beta > 0 loads a reference
    model (a copy for a full fine-tune, the base with adapters off under use_peft) and colocated vLLM keeps its share
    (0.3 by default): both set, not listed (once: SFT's 1024 tokens, the GRPO keys 'ignored', beta read as a DPO
    key; then both listed as not modelled)."""
    (tmp_path / "grpo.yaml").write_text(GRPO)
    imp = read(tmp_path / "grpo.yaml")
    s = imp.setup
    assert (imp.model, s.batch, s.seq, s.checkpointing, s.run) == ("qwen2.5-1.5b", 4, 1536, "full", "grpo")
    assert (s.completion, s.ref, s.generation, s.vllm_share, s.vllm_sleep) == (1024, "copy", "vllm-colocate", 0.3,
                                                                               False)
    listed = {n.key: n.why for n in imp.not_modelled}
    assert "max_prompt_length" in listed and not {"beta", "use_vllm"} & set(listed)
    assert not {i.key for i in imp.ignored} & {"num_generations", "max_completion_length", "use_vllm", "beta"}
    (tmp_path / "peft.yaml").write_text(GRPO + "use_peft: true\nvllm_enable_sleep_mode: true\n"
                                               "vllm_gpu_memory_utilization: 0.5\n")
    s = read(tmp_path / "peft.yaml").setup
    assert (s.ref, s.lora_rank, s.vllm_sleep, s.vllm_share) == ("adapters-off", 16, True, 0.5)
    (tmp_path / "old.yaml").write_text(GRPO.replace("beta: 0.04", "max_prompt_length: 256").replace(
        "vllm_mode: colocate", "vllm_mode: server"))
    imp = read(tmp_path / "old.yaml")
    s = imp.setup
    assert (s.seq, s.ref, s.generation) == (256 + 1024, "none", "vllm-server")
    assert not {n.key for n in imp.not_modelled} & {"beta", "use_vllm"}
    (tmp_path / "plain.yaml").write_text("model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\nnum_generations: 4\n"
                                         "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n")
    s = read(tmp_path / "plain.yaml").setup
    assert (s.generation, s.ref, s.completion, s.grad_accum) == ("generate", "none", 512, 2)     # TRL's defaults


OPEN_R1 = UP / "open-r1" / "recipes"


@pytest.mark.parametrize("name, model, seq, completion, batch, accum, share, ref", [
    ("Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml", "qwen2.5-1.5b", 512 + 1024, 1024, 16, 4, 0.3, "none"),
    ("DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml", None, 512 + 2048, 2048, 16, 4, 0.3, "none"),
    ("Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml", "qwen2.5-1.5b", 1024 + 2048, 2048, 16, 4, 0.3, "copy"),
    ("Qwen2.5-Coder-7B-Instruct/grpo/config_codeforces.yaml", None, 2000 + 8192, 8192, 4, 32, 0.7, "none"),
])
def test_open_r1_grpo_recipes_read_as_trl_1_10_runs_them(name, model, seq, completion, batch, accum, share, ref):
    """open-r1's GRPO recipes (unchanged copies) with its ZeRO-3 accelerate config: run grpo, prompt + completion,
    vLLM colocated (TRL 1.0 made colocate the default; the recipes were written for a separate trl vllm-serve, and
    the default row says so), the removed max_prompt_length listed with its direction, a reference copy at beta
    0.01 (a full fine-tune), none at 0.0."""
    imp = read([OPEN_R1 / name, OPEN_R1 / "accelerate_configs" / "zero3.yaml"])
    s = imp.setup
    assert (s.run, s.strategy, s.gpus, s.generation, s.vllm_share, s.ref) == ("grpo", "zero3", 8, "vllm-colocate",
                                                                              share, ref)
    assert (s.seq, s.completion, s.batch, s.grad_accum) == (seq, completion, batch, accum)
    if model:
        assert imp.model == model
    assert "max_prompt_length" in {n.key for n in imp.not_modelled}
    mode = next(d for d in imp.defaults if d.key == "vllm_mode")
    assert "before, server" in mode.sets
    assert not {i.key for i in imp.ignored} & {"use_vllm", "num_generations", "max_completion_length", "beta",
                                               "vllm_gpu_memory_utilization"}


def test_trl_grpo_refusals_and_generation_batch(tmp_path):
    """As GRPOConfig and GRPOTrainer refuse them: generation_batch_size beside steps_per_generation, one that the
    global batch does not divide, sync_ref_model at beta 0; generation_batch_size read once the world size is
    known; a TRL file with use_vllm but no GRPO key stays SFT, its use_vllm listed."""
    base = "model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\nper_device_train_batch_size: 4\nnum_generations: 4\n"
    acc = tmp_path / "acc.yaml"
    acc.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 1\nmixed_precision: bf16\n")
    for extra, says in (("steps_per_generation: 2\ngeneration_batch_size: 32\n", "both given"),
                        ("generation_batch_size: 24\n", "must be divisible by the global batch size"),
                        ("sync_ref_model: true\n", "with beta 0.0: GRPOTrainer refuses it")):
        (tmp_path / "g.yaml").write_text(base + extra)
        with pytest.raises(ConfigError, match=says):
            read([tmp_path / "g.yaml", acc])
    (tmp_path / "g.yaml").write_text(base + "generation_batch_size: 32\nbeta: 0.1\nsync_ref_model: true\n")
    s = read([tmp_path / "g.yaml", acc]).setup
    assert (s.steps_per_generation, s.gpus, s.ref, s.sync_ref) == (2, 4, "copy", True)       # 32 / (4 x 4)
    (tmp_path / "sft.yaml").write_text("model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\nmax_length: 2048\n"
                                       "use_vllm: true\n")
    imp = read(tmp_path / "sft.yaml")
    assert (imp.setup.run, imp.setup.seq) == ("sft", 2048)
    assert "not SFTConfig's" in {n.key: n.why for n in imp.not_modelled}["use_vllm"]


def test_an_accelerate_deepspeed_config_under_a_yaml_with_its_own_deepspeed_file(tmp_path):
    """TrainingArguments builds the DeepSpeedPlugin from the YAML's `deepspeed:` file and the Trainer hands it to the
    Accelerator: the accelerate config's own ZeRO stage and offload are superseded (once merged into the JSON's),
    its world size kept."""
    lf = UP / "llamafactory" / "examples" / "train_full" / "qwen3_full_sft.yaml"
    acc = tmp_path / "acc.yaml"
    acc.write_text("distributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 4\nmixed_precision: bf16\n"
                   "deepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: cpu\n")
    imp = read([lf, acc])
    s = imp.setup
    assert (s.strategy, s.gpus, s.offload_optimizer) == ("zero3", 4, False)          # ds_z3_config.json's stage
    sup = [x for x in imp.settings if x.sets.startswith("superseded")]
    assert {x.key for x in sup} >= {"deepspeed_config.zero_stage", "deepspeed_config.offload_optimizer_device"}


def test_a_trl_yaml_says_it_is_read_as_sft_and_fit_and_fixes_carry_the_caution(tmp_path, capsys):
    from helpers.__main__ import main

    trl = tmp_path / "sft.yaml"
    trl.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 2\nuse_peft: true\n"
                   "lora_r: 8\nlora_modules_to_save: [lm_head]\nbf16: true\n")
    imp = read(trl)
    assert any(d.key == "(trainer)" and d.value == "sft" for d in imp.defaults)
    assert "higher" in next(n.why for n in imp.not_modelled if n.key == "lora_modules_to_save")
    for command in ("fit", "fixes"):
        assert main([command, "--offline", "--from", str(trl), "--gpu", "a10g"]) == 0
        assert "every 'fits' below holds only for what is modelled" in capsys.readouterr().out


def test_fixes_on_zero3_with_the_trainers_optimizer_offloads_with_deepspeeds_cpu_adam(capsys):
    """The offload-ratio way out under the Trainer's own AdamW on ZeRO-3: accelerate swaps in DeepSpeedCPUAdam when
    the optimizer is offloaded (map_pytorch_optim_to_deepspeed), so the way out is priced with adam_impl unset and
    says so (it was once a TypeError, then skipped as refused)."""
    from helpers.__main__ import main

    assert main(["fixes", "--offline", "--model", "qwen2.5-0.5b", "--strategy", "zero3", "--gpus", "2",
                 "--adam-impl", "fused", "--gpu", "a10g"]) == 0
    out = capsys.readouterr().out
    assert "offload_optimizer=True, offload_ratio=0.05, adam_impl unset" in out
