#!/bin/bash
# The Megatron-LM tutorial of ../shared/seeds/000_*.txt ("On Replicating Empirical Scaling Trends
# in Distributed Training and Model Parallelism"), target 111-gpt2xl-dp1-fit-80GB: gpt2-xl on one
# H100 80GB, micro-batch = global batch = 15, bf16, Transformer Engine (Megatron-LM's default
# --transformer-impl). Its script (vuiseng9/megatron-tutorials, scripts/100_gpt2xl_ddp_gpuX_gbsX.sh
# run with arguments 1 15) assembles this command from bash arrays and runs it with eval; here it
# is written out by hand as the plain command that eval runs, flag for flag, for autotune's
# `--from-megatron` tests and the GPU run in tools/device_from_megatron.sh.
export CUDA_DEVICE_MAX_CONNECTIONS=1

MLMROOT="../../"
DSDIR="./owt-ds"

torchrun --nproc_per_node 1 --nnodes 1 --master_addr localhost --master_port 6000 \
    $MLMROOT/pretrain_gpt.py \
    --num-layers 48 \
    --hidden-size 1600 \
    --num-attention-heads 25 \
    --seq-length 1024 \
    --max-position-embeddings 1024 \
    --attention-backend auto \
    --micro-batch-size 15 \
    --global-batch-size 15 \
    --train-iters 500000 \
    --weight-decay 0.1 \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --init-method-std 0.006 \
    --clip-grad 1.0 \
    --bf16 \
    --lr 6.0e-5 \
    --lr-decay-style cosine \
    --min-lr 6.0e-6 \
    --lr-warmup-fraction .001 \
    --lr-decay-iters 430000 \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --context-parallel-size 1 \
    --data-path $DSDIR/openwebtext-10k_text_document \
    --vocab-file $DSDIR/gpt2-vocab.json \
    --merge-file $DSDIR/gpt2-merges.txt \
    --split 949,50,1 \
    --train-iters 100 \
    --log-interval 1 \
    --log-throughput \
    --save-interval 0 \
    --eval-interval 50 \
    --eval-iters 10 \
    --tensorboard-dir ./outdir/gpt2xl-1x1gpu_dp1_gbs15/tb
