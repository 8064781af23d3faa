# GRPO on kept judge-benchmark seeds (bench/experiments/judge_grpo_gpu.py), every one at once on one GPU, sized to the time left.
# usage: bash bench/experiments/judge_grpo_gpu.sh BUDGET_S PROMPTS_PER_STEP   (from the repository root; $OUT collects)
# FORCE_STEPS=N: train N steps, no probe (the documented runs: 500); without it the step count fits the time left
# knobs for a dry run on CPU: DEV=cpu ROOT=DIR COMMON="bench flags" SKIP_PIP=1 MIN_STEPS=N OUT=DIR OMP_NUM_THREADS=N (2)
# RESERVE=S: seconds kept for the runs' evaluations after training (200); PROBE=N: probe steps (14)
T0=$(date +%s); BUDGET=${1:-520}; PPS=${2:-64}; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, trl, datasets, pyarrow; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'cuda', torch.cuda.is_available())" || exit 4
DEV=${DEV:-cuda}; ROOT=${ROOT:-gpu-grpo/runs-pos}
COMMON=${COMMON:-"--analysis spelled --form first-dead --problems 4000 --balance position --lr 1e-3 --beta 0.1 --top-entropy-quantile 0.1 --prompts-per-step $PPS --prm-steps 0"}
RUNS=$(cd $ROOT && ls -d seed*)
if [ -n "${FORCE_STEPS:-}" ]; then
  # a fixed step count (the documented runs: FORCE_STEPS=500): the same training whatever the lease's speed
  STEPS=$FORCE_STEPS; echo "GRPO steps: $STEPS (fixed)"
else
  for d in $RUNS; do python3 -m bench.experiments.judge_grpo_gpu probe $ROOT/$d ${PROBE:-14} $DEV $COMMON > /tmp/probe-$d.log 2>&1 & done; wait
  grep -h '"probe"' /tmp/probe-*.log || { tail -30 /tmp/probe-seed0-abs-q.log; exit 5; }
  read STEP SETUP < <(grep -h '"probe"' /tmp/probe-*.log | python3 -c "import sys,json; p=[json.loads(l) for l in sys.stdin]; print(max(x['step_s'] or 0 for x in p), max(x['setup_s'] or 0 for x in p))")
  LEFT=$(( BUDGET - ($(date +%s) - T0) ))
  # each run sets itself up again (about the probe's setup), then trains; the evaluations get RESERVE
  STEPS=$(python3 -c "print(min(2500, int(($LEFT - ${RESERVE:-200} - $SETUP) / ($STEP * 1.1)) // 50 * 50))")
  echo "step ${STEP}s with every run at once, setup ${SETUP}s; ${LEFT}s left; GRPO steps: $STEPS"
fi
[ "$STEPS" -ge ${MIN_STEPS:-200} ] || exit 6
PIDS=""
for d in $RUNS; do
  seed=${d#seed}; seed=${seed%%-*}; rule=${d#seed$seed-}
  python3 -m bench.experiments.bench_judge_grpo --device $DEV --seeds $seed --rules $rule --keep $ROOT --reuse --steps $STEPS $COMMON > $OUT/grpo-$d.log 2>&1 &
  PIDS="$PIDS $!"
done
# each trained model leaves as soon as it is saved: an evaluation cut short by the lease loses no training
# (packed beside, then renamed: a lease that ends mid-pack leaves the last whole pack)
( saved=0; while sleep 4; do n=$(ls -d $ROOT/*/grpo-*/final 2>/dev/null | wc -l); [ "$n" -gt "$saved" ] && { sleep 4; tar czf $OUT/models.part $ROOT/*/grpo-*/final && mv $OUT/models.part $OUT/models.tgz; saved=$n; echo "$n model(s) saved at $(( $(date +%s) - T0 ))s"; }; done ) &
WATCHER=$!
wait $PIDS; kill $WATCHER 2>/dev/null
tar czf $OUT/models.part $ROOT/*/grpo-*/final 2>/dev/null && mv $OUT/models.part $OUT/models.tgz
grep -h '^{"' $OUT/grpo-*.log > $OUT/results.jsonl; wc -l < $OUT/results.jsonl; echo "total $(( $(date +%s) - T0 ))s"
