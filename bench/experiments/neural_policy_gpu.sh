# The neural policies built on one GPU by the benchmarks' own build (bench/experiments/neural_policy.py: pretrain until the
# greedy check lands in the strength's band), beside traces of the recipe's skill over steps for other seeds and settings.
# usage: bash bench/experiments/neural_policy_gpu.sh [BUDGET_S]   (from the repository root; $OUT collects)
# knobs for a dry run on CPU: DEV=cpu SKIP_PIP=1 OUT=DIR EXTRA="--width 16 --max-steps 40 --check-every 20"
#   TRACE_STEPS=N (steps a trace runs, 20000), TRACES="seed=1 seed=2 width=128,seed=0 ..." (the traces' settings)
T0=$(date +%s); BUDGET=${1:-520}; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
DEV=${DEV:-cuda}; CACHE=${CACHE:-/tmp/gpu-policies}; TRACE_DIR=${TRACE_DIR:-/tmp/gpu-traces}
TRACES=${TRACES-"seed=1 seed=2 seed=3 seed=4 width=128,seed=0 width=128,seed=1 lr=0.001,seed=0 lr=0.001,seed=1"}
rm -rf "$CACHE" "$TRACE_DIR"; mkdir -p "$CACHE" "$TRACE_DIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import torch, transformers, tokenizers, sqlalchemy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'cuda', torch.cuda.is_available())" || exit 4
LIMIT=$(( BUDGET - 30 - ($(date +%s) - T0) ))
# the product's build: weak and medium in one run, each kept when the check first lands in its band
timeout "$LIMIT" python3 -m bench.experiments.neural_policy build --device "$DEV" --cache "$CACHE" $EXTRA > "$OUT/build.log" 2>&1 &
BUILD=$!
PIDS=""
for t in $TRACES; do
  flags=$(echo "$t" | tr ',' '\n' | sed 's/^\([a-z_]*\)=/--\1 /; s/_/-/' | tr '\n' ' ')
  timeout "$LIMIT" python3 -m bench.experiments.neural_policy trace --device "$DEV" --cache "$TRACE_DIR/$t" --check-every 500 \
    --max-steps "${TRACE_STEPS:-20000}" $EXTRA $flags > "$TRACE_DIR/$t.jsonl" 2> "$TRACE_DIR/$t.err" &
  PIDS="$PIDS $!"
done
# each kept policy leaves as soon as it is saved (packed beside, then renamed: a cut mid-pack leaves the last whole pack)
pack() { ls "$CACHE"/*/neural_policy.json >/dev/null 2>&1 && (cd "$CACHE" && tar czf "$OUT/policies.part" --exclude 'run-*' . ) && mv "$OUT/policies.part" "$OUT/policies.tgz"; }
( saved=0; while sleep 5; do n=$(ls "$CACHE"/*/neural_policy.json 2>/dev/null | wc -l); [ "$n" -gt "$saved" ] && { pack; saved=$n; echo "$n policy(ies) packed at $(( $(date +%s) - T0 ))s"; }; done ) &
WATCHER=$!
wait $BUILD; echo "build exit $? at $(( $(date +%s) - T0 ))s"
[ -z "$PIDS" ] || wait $PIDS; kill $WATCHER 2>/dev/null; pack
if [ -n "$TRACES" ]; then cat "$TRACE_DIR"/*.jsonl > "$OUT/traces.jsonl"; tail -qn 3 "$TRACE_DIR"/*.err > "$OUT/traces.err"; fi
grep -v '^{' "$OUT/build.log" | grep -v 'Writing\|Loading' | tail -40; grep '^{' "$OUT/build.log" | cut -c1-400
[ -f "$OUT/traces.jsonl" ] && python3 - "$OUT/traces.jsonl" <<'EOF'
import json, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line); runs[(r["width"], r["lr"], r["seed"])].append((r["step"], r["right"]))
for (width, lr, seed), points in sorted(runs.items()):
    print(f"width {width} lr {lr} seed {seed}:", " ".join(f"{s // 1000}k:{r}" for s, r in points if s % 2000 == 0))
EOF
echo "total $(( $(date +%s) - T0 ))s"
