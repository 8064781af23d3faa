#!/usr/bin/env bash
# One benchmark's seeds on one lent GPU, side by side: each seed a process of its own (the
# models are tiny: one seed leaves the GPU mostly idle; annotation runs on the machine's CPUs),
# everything under a deadline so that the call ends in time.
#
#   BENCH=bench_active ARGS="--judge sft --pool 800 --budget 3200 --rounds 4 --heldout 200 \
#     --sft-steps 800" DEADLINE=420 SEEDS="0 1 2" bash bench/experiments/seeds_gpu.sh
#   BENCH=bench_prm_labels ARGS="" DEADLINE=420 bash bench/experiments/seeds_gpu.sh
#   BENCH=bench_active DEVICE=cpu DEADLINE=600 SEEDS=0 ARGS="--judge sft --pool 60 --budget 240 \
#     --rounds 2 --heldout 20 --sft-pretrain-steps 20 --sft-steps 10" bash bench/experiments/seeds_gpu.sh
#                                                     # the last: a dry run here, on the CPU
#
# Each seed writes OUT/seedN.log (its progress lines as they come: a cut run keeps what it
# finished) and, if it finishes, its JSON as the log's last line; `bench_active --from-json
# OUT/seed*.log` merges bench_active's.  Needs PyTorch, transformers and stepq's own
# dependencies (SQLAlchemy, alembic, Celery, TRL, datasets, math-verify): on the lent machine
# they travel as wheels (docs/experiments/active.md).
set -u
BENCH=${BENCH:?name the benchmark module, e.g. BENCH=bench_active}
OUT=${OUT:-/tmp/$BENCH-gpu}
DEADLINE=${DEADLINE:-420}
SEEDS=${SEEDS:-"0 1 2"}
DEVICE=${DEVICE:-cuda}
ARGS=${ARGS:-}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
started=$(date +%s)
for seed in $SEEDS; do
    # shellcheck disable=SC2086  # ARGS is a list of options
    timeout "$DEADLINE" "$PYTHON" -m "bench.experiments.$BENCH" --device "$DEVICE" --seeds "$seed" $ARGS \
        >"$OUT/seed$seed.log" 2>&1 &
done
wait
echo "seeds_gpu: $BENCH, $(( $(date +%s) - started )) s for seeds $SEEDS on $DEVICE"
for seed in $SEEDS; do
    echo "== seed $seed"
    grep -E "^  seed [0-9]+|Error|error:" "$OUT/seed$seed.log" | tail -20
done
