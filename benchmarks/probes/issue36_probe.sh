#!/usr/bin/env bash
# Issue 36, a first probe at the demo's data: bert-mini, 3 minutes of training each (the budget), held-out MLM
# accuracy against the best constant guess and the anisotropy, one factor at a time. One seed; dev = the held-out
# share of the training corpus (never the test articles).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/probe36}
COMMON="--preset bert-mini --input runs/demo/bbc-shards --seq-len 64 --batch-size 32 --lr 1e-3 --budget 3m --eval-every 100 --model.max_seq_len=64 --train.warmup_ratio=0.1"
run() { name=$1; shift; echo "== $name: $*"; OMP_NUM_THREADS=1 .venv/bin/python -m lmforge -q pretrain $COMMON --out $OUT/$name --overwrite "$@" 2>&1 | tail -3; }
run a-2018 --objective mlm+nsp &
run b-mlm-preln-nodrop --objective mlm --model.norm_first=true --dropout-off &
wait
run c-b+nobias+gated --objective mlm --model.norm_first=true --dropout-off --model.bias=false --model.ffn=gated &
run d-b+ramp --objective mlm --model.norm_first=true --dropout-off --train.batch_ramp=0.3 &
wait
