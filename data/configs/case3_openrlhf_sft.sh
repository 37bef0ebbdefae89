#!/usr/bin/env bash
# Case 3 of this casebook (data/cases.json): resuming from a checkpoint with the optimizer offloaded, OpenRLHF,
# Qwen2.5-72B on one node of 8 x 80 GB GPUs, ZeRO-3, pin_memory off. Upstream thread: OpenRLHF issue #632 (the same
# thread as case 2, https://github.com/OpenRLHF/OpenRLHF/issues/632); the ratio 0.9 step is as the write-up tells it.
# Written by this project (oom-casebook); sizes as in case 2 (the case's assumptions). --load_checkpoint resumes from
# --ckpt_path (the resume phase of the estimate).
# Not writable as flags: pin_memory false (case 2's fix, an edit of openrlhf/utils/deepspeed/deepspeed_utils.py) and
# the fix, DeepSpeed's offload_optimizer.ratio 0.9 (OpenRLHF builds its DeepSpeed config in code and has no flag for
# it): the test applies both to the set-up read from this file. Capacities are the case's.

deepspeed --num_gpus 8 --module openrlhf.cli.train_sft \
   --pretrain Qwen/Qwen2.5-72B-Instruct \
   --dataset Open-Orca/OpenOrca \
   --input_key question \
   --output_key response \
   --save_path ./checkpoint/qwen2.5-72b-sft \
   --ckpt_path ./checkpoint/qwen2.5-72b-sft/checkpoints \
   --load_checkpoint \
   --max_len 2048 \
   --micro_train_batch_size 1 \
   --train_batch_size 8 \
   --max_epochs 1 \
   --zero_stage 3 \
   --adam_offload \
   --learning_rate 5e-6 \
   --bf16 \
   --flash_attn \
   --gradient_checkpointing
