#!/usr/bin/env bash
# Case 1 of this casebook (data/cases.json): OOM at the optimizer step, OpenRLHF SFT of Llama-3-8B on one 80 GB A100
# with ZeRO-2. Upstream thread: OpenRLHF issue #698, "OOM on Llama 8B" (https://github.com/OpenRLHF/OpenRLHF/issues/698).
# Written by this project (oom-casebook) from the case's reported set-up, not copied from the thread: the thread gives
# the symptoms, not this command. Flags in OpenRLHF's classic style of that time (v0.5.x-v0.8.x: --bf16, --flash_attn).
# --train_batch_size 1 keeps gradient accumulation at 1 micro batch, as the case models it (OpenRLHF's default 128
# would accumulate 128). The GPU's 80 GiB is the case's, not the command's.
# The fix the maintainer gave ("use --adam_offload") is one more flag, --adam_offload (the test adds it).

deepspeed --num_gpus 1 --module openrlhf.cli.train_sft \
   --pretrain meta-llama/Meta-Llama-3-8B \
   --dataset Open-Orca/OpenOrca \
   --input_key question \
   --output_key response \
   --save_path ./checkpoint/llama3-8b-sft \
   --max_len 128 \
   --micro_train_batch_size 1 \
   --train_batch_size 1 \
   --max_epochs 1 \
   --zero_stage 2 \
   --learning_rate 5e-6 \
   --bf16 \
   --flash_attn \
   --gradient_checkpointing
