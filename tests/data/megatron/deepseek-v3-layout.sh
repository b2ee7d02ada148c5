#!/bin/bash
# The model and parallel flags of Megatron-LM's examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh
# (Megatron-FSDP, data and checkpoint flags left out; mla_up_proj recompute left out: refused),
# at pp 16 with Megatron-Bridge's DeepSeek-V3 layout for (pp 16, vpp 1).
TP=1
EP=8
PRETRAIN_ARGS=(
    --tensor-model-parallel-size ${TP}
    --pipeline-model-parallel-size 16
    --pipeline-model-parallel-layout "Et*4|(t*4|)*14tmL"
    --expert-model-parallel-size ${EP}
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --sequence-parallel
    --disable-bias-linear
    --micro-batch-size 1
    --global-batch-size 4096
    --recompute-granularity selective
    --recompute-modules moe layernorm
    --transformer-impl transformer_engine
    --seq-length 4096
    --tokenizer-type NullTokenizer
    --vocab-size 129279
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --kv-channels 128
    --max-position-embeddings 4096
    --position-embedding-type rope
    --rotary-base 10000
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --multi-latent-attention
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --qk-layernorm
    --num-experts 256
    --moe-layer-freq [0]*3+[1]*58
    --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048
    --moe-router-topk 8
    --moe-grouped-gemm
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --mtp-num-layers 1
    --mtp-loss-scaling-factor 0.1
    --bf16
)
torchrun --nproc-per-node 8 --nnodes 128 pretrain_gpt.py "${PRETRAIN_ARGS[@]}"
