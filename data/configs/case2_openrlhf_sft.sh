#!/usr/bin/env bash
# Case 2 of this casebook (data/cases.json): host RAM OOM with pinned optimizer offload, OpenRLHF, Qwen2.5-72B on one
# node of 8 x 80 GB GPUs, ZeRO-3 with --adam_offload, 1.4 TB host RAM. Upstream thread: OpenRLHF issue #632, "Train
# Qwen/Qwen2.5-72B-Instruct encountering RAM OOM" (https://github.com/OpenRLHF/OpenRLHF/issues/632).
# Written by this project (oom-casebook): the thread gives no command; the module (train_sft), micro batch 1, sequence
# 2048, checkpointing and flash attention are the case's assumptions (data/cases.json). --train_batch_size 8 = micro
# batch 1 x 8 GPUs keeps gradient accumulation at 1, as the case models it.
# pin_memory: OpenRLHF writes "pin_memory": true for the optimizer offload in code
# (openrlhf/utils/deepspeed/deepspeed_utils.py, get_train_ds_config); no flag sets it. The thread's fix, pin_memory
# False, was an edit of that file: it cannot be written in this command (the test applies it to the set-up instead).
# The node's 1.4 TB of RAM and the 80 GiB GPUs are the case's, not the command's.

deepspeed --num_gpus 8 --module openrlhf.cli.train_sft \
   --pretrain Qwen/Qwen2.5-72B-Instruct \
   --dataset Open-Orca/OpenOrca \
   --input_key question \
   --output_key response \
   --save_path ./checkpoint/qwen2.5-72b-sft \
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
