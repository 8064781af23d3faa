#!/usr/bin/env bash
# bench_active --judge sft on one lent GPU: each seed a process of its own, side by side (the
# judges are tiny: a seed's pretraining, teaching and answering leave the GPU mostly idle), the
# annotation on the machine's CPUs, everything under a deadline so that the call ends in time.
#
#   DEADLINE=420 SEEDS="0 1 2" bash bench/experiments/active_gpu.sh          # on the GPU machine
#   DEVICE=cpu DEADLINE=600 SEEDS=0 ARGS="--pool 60 --budget 240 --rounds 2 --heldout 20 \
#     --sft-pretrain-steps 20 --sft-steps 10" bash bench/experiments/active_gpu.sh   # the dry run here
#
# Each seed writes OUT/seedN.log (every round as it ends: a cut run keeps its finished rounds)
# and, if it finishes, its JSON as the log's last line, which `bench_active --from-json` merges:
#   python -m bench.experiments.bench_active --from-json OUT/seed*.log --plot active_sft.png
# Needs PyTorch, transformers and stepq's own dependencies (SQLAlchemy, alembic, Celery, TRL,
# datasets, math-verify): on the lent machine they travel as wheels (docs/experiments/active.md).
set -u
OUT=${OUT:-/tmp/active-gpu}
DEADLINE=${DEADLINE:-420}
SEEDS=${SEEDS:-"0 1 2"}
DEVICE=${DEVICE:-cuda}
ARGS=${ARGS:-"--pool 800 --budget 3200 --rounds 4 --heldout 200 --sft-steps 800"}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
started=$(date +%s)
for seed in $SEEDS; do
    # shellcheck disable=SC2086  # ARGS is a list of options
    timeout "$DEADLINE" "$PYTHON" -m bench.experiments.bench_active --judge sft --device "$DEVICE" \
        --seeds "$seed" $ARGS >"$OUT/seed$seed.log" 2>&1 &
done
wait
echo "active_gpu: $(( $(date +%s) - started )) s for seeds $SEEDS on $DEVICE"
for seed in $SEEDS; do
    echo "== seed $seed"
    grep -E "round [0-9]+:|Error|error:" "$OUT/seed$seed.log" | tail -20
done
