#!/usr/bin/env bash
# Case 7 of this casebook (data/cases.json): GRPO at 26,048 tokens, OpenRLHF, Qwen2.5-7B-Instruct, the actor on 8 H20
# (96 GB) GPUs with ZeRO-3. Upstream thread: OpenRLHF issue #908, "2*8*h20训练7b模型特别慢，且bsz=2就会oom" ("7B on
# 2 x 8 H20 trains very slowly, and bsz=2 runs out of memory", 2025-03-24,
# https://github.com/OpenRLHF/OpenRLHF/issues/908). The command below is the thread's own, copied unchanged from the
# issue (this header is this project's): it is the run that trains, at --micro_train_batch_size 1. The run that ran out
# of memory is the same command with --micro_train_batch_size 2; the thread does not say which --train_batch_size went
# with it, and DeepSpeed refuses 8 at micro batch 2 on 8 GPUs (8 // (2 x 8) = 0 accumulation steps), so the case takes
# the smallest it accepts, 16 (the test writes both). The GPU (--gpu h20) is the case's, not the command's; the model
# path is the user's machine's (--model Qwen/Qwen2.5-7B-Instruct names it).
HEAD_IP=127.0.0.1
# 提交Ray任务
ray job submit --address="http://${HEAD_IP}:8265" \
   -- python -m openrlhf.cli.train_ppo_ray \
   --ref_num_nodes 1 \
   --ref_num_gpus_per_node 4 \
   --reward_num_nodes 0 \
   --reward_num_gpus_per_node 0 \
   --actor_num_nodes 1 \
   --actor_num_gpus_per_node 8 \
   --critic_num_nodes 0 \
   --critic_num_gpus_per_node 0 \
   --vllm_num_engines 1 \
   --vllm_tensor_parallel_size 4 \
   --advantage_estimator group_norm \
   --use_kl_loss \
   --kl_estimator k3 \
   --pretrain /data/local_disk0/dl_models/models/Qwen/Qwen2.5-7B-Instruct \
   --prompt_data /data/cloud_disk0/s04/grpo/mongodb_grpo_data04.json \
   --save_path /data/cloud_disk0/s04/ckpt/qwen2.5-grpo \
   --ckpt_path /data/cloud_disk0/s04/ckpt/qwen2.5-grpo-checkpoints \
   --rollout_batch_size 8 \
   --train_batch_size 8 \
   --micro_train_batch_size 1 \
   --micro_rollout_batch_size 2 \
   --n_samples_per_prompt 8 \
   --max_samples 10000 \
   --max_epochs 1 \
   --prompt_max_len 13024 \
   --generate_max_len 13024 \
   --zero_stage 3 \
   --bf16 \
   --actor_learning_rate 1e-6 \
   --init_kl_coef 0.05 \
   --save_steps 50 \
   --flash_attn \
   --gradient_checkpointing \
   --remote_rm_url "/data/cloud_disk0/s04/grpo/openrlhf_plugin.py"
