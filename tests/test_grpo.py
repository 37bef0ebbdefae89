"""GRPO runs (`run` 'grpo', TRL 1.10's GRPOTrainer): the step against a dry run of TRL's step re-enacted on the real
transformers model (fake tensors), the KV cache of generate against transformers' own cache, the generation between
steps (vLLM's share, ZeRO-3's gathers) as placed by rule, and the one-line refusals."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import estimate, models
from helpers.errors import InputError
from helpers.estimate import generation
from helpers.measure import dryrun
from helpers.training import TrainSetup
from helpers.units import GiB, MiB

M = "qwen2.5-0.5b"


def _generation_items(r):
    return {i["name"]: i for i in r.items if i["category"] == "generation"}


@pytest.mark.parametrize("options", [
    dict(),                                                      # batch 4: the entropy's contiguous copy
    dict(batch=1),                                               # one sequence: the 16-bit output is the larger
    dict(checkpointing="full", reference="copy"),                # the frozen copy beside the policy
    dict(lora_rank=16, reference="adapters-off"),
    dict(precision="bf16", batch=2, completion=100),
    dict(strategy="ddp", gpus=2, checkpointing="full", grad_accum=2),
    # DeepSpeed: bf16 logits, TRL's 16-bit log_softmax per sequence, the in-place division's CopySlices backward
    dict(strategy="zero2", gpus=2, batch=8, seq=1100, completion=1024, checkpointing="full"),
    dict(strategy="zero1", gpus=2, batch=3, seq=700, completion=600, checkpointing="full", lora_rank=16),
    dict(strategy="zero2", gpus=4),
], ids=["plain", "one-sequence", "reference-copy", "lora", "bf16", "ddp-accum", "zero2-logits", "zero1-lora",
        "zero2-backward-end"])
def test_grpo_step_agrees_with_its_dry_run(options):
    """Consistency with TRL's step re-enacted (helpers.measure.dryrun.GRPOStep, GRPOZeroStep): every phase within
    0.6%, none under by more than 1 MiB but ZeRO-2's end of backward, 28.5 MiB under where the logits are small
    (the same moment of an SFT step, hidden there under its logits: found here, not mended). Before the completion's
    logits, the entropy's copy and DeepSpeed's 16-bit path were modelled (the step estimated as SFT's full logits,
    then in fp32 under DeepSpeed), the figures were off by gigabytes."""
    s = TrainSetup(run="grpo", **{"seq": 512, "batch": 4, "completion": 256, **options})
    e, d = estimate.run(M, s, lifecycle=False), dryrun.run(M, s, progress=False)
    assert set(e.gpu.phases) == set(d.gpu.phases)
    under = 29 * MiB if options == dict(strategy="zero2", gpus=4) else MiB
    for phase, measured in d.gpu.phases.items():
        got = e.gpu.phases[phase]
        assert got >= measured - under, (phase, got, measured)
        assert abs(got - measured) <= 0.006 * measured, (phase, got, measured)


def test_grpo_logits_are_the_completions_alone():
    """logits_to_keep: the head's output covers completion + 1 positions, not the sequence: a longer prompt at the
    same completion adds activations only."""
    short = estimate.run(M, TrainSetup(run="grpo", seq=512, completion=256, batch=4), lifecycle=False)
    long_ = estimate.run(M, TrainSetup(run="grpo", seq=2048, completion=256, batch=4), lifecycle=False)
    assert short.gpu.breakdown["forward"]["logits"] == long_.gpu.breakdown["forward"]["logits"]
    sft = estimate.run(M, TrainSetup(seq=2048, batch=4), lifecycle=False)
    assert long_.gpu.breakdown["forward"]["logits"] < sft.gpu.breakdown["forward"]["logits"]


def test_kv_cache_of_generate_is_transformers_own():
    """The rule's KV cache against transformers 5.23's DynamicCache filled over the whole sequence (fake tensors, a
    bf16 model): keys and values of every layer, to the byte."""
    m = models.spec(M)
    s = TrainSetup(run="grpo", seq=384, completion=128, batch=2, grad_accum=3, precision="bf16")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(m.path)
    with FakeTensorMode(allow_non_fake_inputs=True):
        net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        ids = torch.randint(0, m.vocab, (generation.sequences(s), s.seq))
        with torch.no_grad():
            cache = net(input_ids=ids, use_cache=True).past_key_values
        held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    item = _generation_items(estimate.run(M, s))[f"KV cache of generate (6 sequences x {s.seq} tokens)"]
    assert item["bytes"] == held + held // m.layers          # and one layer's being extended by torch.cat


def test_vllm_share_is_held_through_the_step_unless_asleep():
    """vLLM's budget is gpu_memory_utilization x the GPU's total memory (vLLM's requested_memory), held at every
    phase from set-up on, or only while generating with sleep mode."""
    base = dict(run="grpo", seq=1024, batch=4, checkpointing="full", gpu_gib=80.0, generation="vllm-colocate",
                vllm_share=0.4)
    awake = estimate.run(M, TrainSetup(**base))
    (engine,) = _generation_items(awake).values()
    assert engine["bytes"] == int(0.4 * 80 * GiB)
    assert engine["phases"] == ["setup", "forward", "backward", "step", "generation", "steady"]
    asleep = estimate.run(M, TrainSetup(**base, vllm_sleep=True))
    assert [i["phases"] for i in _generation_items(asleep).values()] == [["generation"]]
    for phase in ("forward", "backward", "steady"):
        assert awake.gpu.phases[phase] - asleep.gpu.phases[phase] == engine["bytes"]
    none = estimate.run(M, TrainSetup(**{**base, "gpu_gib": None}))
    assert not _generation_items(none) and "not counted: no GPU capacity" in none.meta["generation_words"]


def test_generation_holds_what_outlives_a_step_and_no_gradients():
    """Between steps: parameters and optimizer states, no activations, no gradients (zero_grad after the step, even
    accumulated ones)."""
    r = estimate.run(M, TrainSetup(run="grpo", seq=1024, batch=4, grad_accum=4, gpu_gib=80.0))
    at = r.gpu.breakdown["generation"]
    assert at["gradients"] == at["activations"] == at["logits"] == 0
    assert at["parameters"] == r.gpu.breakdown["step"]["parameters"]
    assert at["optimizer_states"] == r.gpu.breakdown["step"]["optimizer_states"]
    assert "generation" not in estimate.run(M, TrainSetup(run="grpo", seq=1024), lifecycle=False).gpu.phases
    assert "generation" not in estimate.run(M, TrainSetup(seq=1024)).gpu.phases


def test_zero3_gathers_the_whole_model_to_generate_and_to_merge_adapters():
    """TRL's ds3_gather_for_generation (default True) gathers every parameter for generate; with PEFT under ZeRO-3
    sync_weights gathers them all to merge the adapters for vLLM: 2 bytes a parameter either way."""
    m = models.spec(M)
    gen = _generation_items(estimate.run(M, TrainSetup(run="grpo", seq=1024, strategy="zero3", gpus=8)))
    assert gen["the whole model gathered for generation (ds3_gather_for_generation)"]["bytes"] == 2 * m.params
    lora = _generation_items(estimate.run(M, TrainSetup(run="grpo", seq=1024, strategy="zero3", gpus=8, lora_rank=16,
                                                        generation="vllm-colocate", gpu_gib=80.0)))
    assert lora["the whole model gathered to merge the adapters for vLLM"]["bytes"] == 2 * m.params
    full = _generation_items(estimate.run(M, TrainSetup(run="grpo", seq=1024, strategy="zero3", gpus=8,
                                                        generation="vllm-server")))
    assert not full                                           # one parameter at a time: not counted


@pytest.mark.parametrize("options, says", [
    (dict(run="grpo", vllm_share=1.5, generation="vllm-colocate"), "vllm_share must be a fraction"),
    (dict(run="grpo", seq=512, completion=512), "completion (512 tokens) must be shorter than seq (512"),
    (dict(generation="vllm-colocate"), "generation is a GRPO option"),
    (dict(run="grpo", vllm_sleep=True), "vllm_sleep is vLLM's colocated engine's option"),
    (dict(run="grpo", generation="vllm"), "unknown generation 'vllm'"),
    (dict(run="grpo", tensor_parallel=2, gpus=2, strategy="fsdp2"), "run 'grpo' with tensor_parallel"),
])
def test_grpo_options_refused_in_one_line(options, says):
    with pytest.raises(InputError) as e:
        estimate.run(M, TrainSetup(**options))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_cli_prints_the_generation_phase(capsys):
    from helpers.__main__ import main

    assert main(["estimate", "--model", M, "--run", "grpo", "--seq", "1024", "--gpu", "h100-80gb",
                 "--generation", "vllm-colocate", "--vllm-share", "0.5"]) in (0, 1)
    out = capsys.readouterr().out
    assert "generation (between steps)" in out and "vLLM colocated" in out and "GRPO: sequences of 1024 tokens" in out


def test_a_vllm_share_below_its_own_weights_will_not_start():
    """vLLM's KV cache is what its share leaves after its weights (gpu_worker.py): a share under the model's 16-bit
    weights leaves none, and vLLM refuses to start; the verdict says so instead of 'fits' (a user's 0.1 share of an
    80 GB GPU for a 7B model was 'fits')."""
    from helpers import report

    s = TrainSetup(run="grpo", seq=1024, strategy="zero3", gpus=8, gpu_gib=79.1, generation="vllm-colocate",
                   vllm_share=0.1)
    r = estimate.run("qwen2.5-7b", s)
    assert r.meta["vllm_short"]["weights"] == 2 * models.spec("qwen2.5-7b").params
    line = report.verdict(r)
    assert line.startswith("vLLM will not start") and "above 0.18" in line
    assert estimate.run("qwen2.5-7b", s.replace(vllm_share=0.3)).meta["vllm_short"] is None


def test_reference_sync_under_zero3_gathers_both_models_between_steps():
    """TRL's SyncRefModelCallback under ZeRO-3 gathers the policy and the reference whole (2 x 2 B a parameter), at
    its own moment of the generation phase; elsewhere it mixes them in place."""
    m = models.spec(M)
    base = dict(run="grpo", seq=1024, reference="copy", sync_ref=True)
    z3 = _generation_items(estimate.run(M, TrainSetup(**base, strategy="zero3", gpus=8)))
    item = z3["the policy and the reference gathered whole to mix them (sync_ref_model)"]
    assert item["bytes"] == 4 * m.params and item["phases"] == ["generation"]
    assert not any("sync_ref_model" in n for n in _generation_items(estimate.run(M, TrainSetup(**base))))
    with pytest.raises(InputError, match="needs a reference copy"):
        TrainSetup(run="grpo", sync_ref=True).validate()


def test_steps_per_generation_sizes_generates_batch():
    """Each process generates batch x steps_per_generation completions at once (grad_accum by default)."""
    s = TrainSetup(run="grpo", seq=1024, batch=4, grad_accum=2)
    one = _generation_items(estimate.run(M, s))
    four = _generation_items(estimate.run(M, s.replace(steps_per_generation=8)))
    assert "KV cache of generate (8 sequences x 1024 tokens)" in one
    assert four["KV cache of generate (32 sequences x 1024 tokens)"]["bytes"] == \
        4 * one["KV cache of generate (8 sequences x 1024 tokens)"]["bytes"]


def test_explain_does_not_list_as_left_out_what_a_grpo_estimate_counts():
    """A GRPO set-up's estimate counts its reference, its generation and a colocated vLLM: `explain` does not name
    them among what the estimate leaves out (a new user's report: it did)."""
    from helpers import explain

    colocated = explain.left_out(TrainSetup(run="grpo", generation="vllm-colocate"))
    assert not any("vLLM" in x or "generation" in x for x in colocated)
    assert "evaluation between steps" in colocated
    assert any("vLLM" in x for x in explain.left_out(TrainSetup(run="grpo")))
    assert explain.left_out(TrainSetup()) == list(explain.LEFT_OUT)


def test_explain_says_what_this_process_holds_outside_pytorch():
    """torch's message gives this process's memory and what PyTorch reserved of it: the rest is outside PyTorch's
    allocator (the CUDA context, NCCL; a sleeping-mode vLLM's pools), said in GiB."""
    from helpers import explain

    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total capacity of "
           "79.11 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this process has 75.98 GiB memory in "
           "use. Of the allocated memory 45.10 GiB is allocated by PyTorch, and 3.62 GiB is reserved by PyTorch but "
           "unallocated.")
    text = explain.explain(msg).text()
    assert "27.26 GiB outside PyTorch's allocator" in text


def test_fit_searches_sequences_longer_than_the_completion():
    """`fit` over the sequence starts above a GRPO run's completion (prompt + completion): before, its first try,
    64 tokens, was refused as shorter than the completion."""
    from helpers import fit

    found = fit.largest(M, TrainSetup(run="grpo", seq=512, completion=256, lora_rank=16, gpu_gib=24.0), vary="seq")
    assert found.value > 256 and found.value % 64 == 0


AXOLOTL_GRPO = """base_model: Qwen/Qwen2.5-1.5B-Instruct
rl: grpo
trl:
  beta: 0.001
  max_completion_length: 1024
  use_vllm: true
  vllm_mode: colocate
  vllm_enable_sleep_mode: true
vllm:
  gpu_memory_utilization: 0.4
micro_batch_size: 4
sequence_len: 2048
adapter: lora
lora_r: 16
lora_target_linear: true
"""


def test_axolotl_grpo_reads_its_trl_and_vllm_blocks(tmp_path):
    """axolotl's GRPO (set_training_args_kwargs @067b021c): trl.max_completion_length, beta (the LoRA base as the
    reference), vLLM colocated with the vllm block's share and sleep mode; vllm_mode unset is server, as axolotl's
    validation sets it (first read as TRL's colocate default, found on axolotl's own docs/grpo.qmd config);
    sequence_len bounds nothing (max_length blocked) and is listed."""
    from helpers.readers import read

    (tmp_path / "a.yaml").write_text(AXOLOTL_GRPO)
    imp = read(tmp_path / "a.yaml")
    s = imp.setup
    assert (s.run, s.completion, s.seq, s.ref, s.generation, s.vllm_share, s.vllm_sleep) == (
        "grpo", 1024, 1536, "adapters-off", "vllm-colocate", 0.4, True)
    assert {"sequence_len", "(prompt length)"} <= {n.key for n in imp.not_modelled}
    (tmp_path / "b.yaml").write_text(AXOLOTL_GRPO.replace("  vllm_mode: colocate\n", "").replace(
        "adapter: lora\nlora_r: 16\nlora_target_linear: true\n", ""))
    imp = read(tmp_path / "b.yaml")
    s = imp.setup
    assert (s.ref, s.generation) == ("copy", "vllm-server")
    assert next(x for x in imp.defaults if x.key == "trl.vllm_mode").value == "server"
