#!/usr/bin/env bash
# The GRPO judge for the medium neural policy, on one lent GPU: judge_grpo_gpu.sh run on seeds whose
# labels are the policy's own (bench_judge_grpo --policy medium), prepared here and cut to the lease.
#
# here, once (about 30 min a seed on one CPU thread: sampling, annotation at M = 8, the base judge):
#   for seed in 0 1 2; do OMP_NUM_THREADS=1 python -m bench.experiments.bench_judge_grpo --seeds $seed \
#       $(bash bench/experiments/judge_grpo_neural_gpu.sh --flags) --steps 0 --keep runs-neural & done; wait
#   for d in runs-neural/seed*; do python -m bench.experiments.judge_grpo_gpu slim $d gpu-grpo/runs-neural/${d##*/}; done
# on the GPU machine, from the repository root (one call; models.tgz is packed as each model is saved):
#   bash bench/experiments/judge_grpo_neural_gpu.sh 520 64
# here, each model brought back, put to work on the policy:
#   python -m bench.experiments.bench_judge_at_work --judge MODEL --policy medium --problems 100 --n 1,4,16 --seed S
#
# A dry run on CPU at toy size (EXTRA: the same flags as the preparation's, after FLAGS so they win;
# --quick does not do: its 60 problems leave the neural policy's snapshot a handful of rows):
#   TOY="--problems 100 --pretrain-steps 60 --format-steps 30 --heldout 40"
#   python -m bench.experiments.bench_judge_grpo --seeds 0 $(bash bench/experiments/judge_grpo_neural_gpu.sh --flags) \
#       $TOY --steps 0 --keep toy && python -m bench.experiments.judge_grpo_gpu slim toy/seed0-abs-q gpu-toy/seed0-abs-q
#   EXTRA="$TOY" FORCE_STEPS=4 MIN_STEPS=1 DEV=cpu SKIP_PIP=1 OMP_NUM_THREADS=1 OUT=/tmp/dry ROOT=gpu-toy \
#       bash bench/experiments/judge_grpo_neural_gpu.sh 600 4
set -u
# the preparation's settings: bench_judge_grpo --reuse refuses a kept seed prepared with others
FLAGS="--policy medium --problems 2000 --analysis spelled --form first-dead --balance position --prm-steps 0"
if [ "${1:-}" = "--flags" ]; then echo "$FLAGS"; exit 0; fi
PPS=${2:-64}
export ROOT=${ROOT:-gpu-grpo/runs-neural} FORCE_STEPS=${FORCE_STEPS:-500}
# GRPO's settings: those of the synthetic policy's documented 500-step runs (judge_grpo_log.md)
export COMMON="$FLAGS --lr 1e-3 --beta 0.1 --top-entropy-quantile 0.1 --prompts-per-step $PPS ${EXTRA:-}"
exec bash "$(dirname "$0")/judge_grpo_gpu.sh" "${1:-520}" "$PPS"
