#!/usr/bin/env bash
# An open question on one CUDA GPU, in one call: does Infini-attention recall the passkey beyond its
# segment once training has seen as many answers that need the memory as assoc needed (bench/README.md: about 1B
# passkey tokens; 14 h a seed on the CPU)? A lent machine has minutes, so the budget is fitted to the time left.
#
#   OUT=out-gpu-recall bash bench/gpu_recall.sh          # on the GPU machine; JSONs and logs land in $OUT
#   DEVICE=cpu SEEDS="1 2" BATCH=4 BPTT=4 PROBE_TOKENS=40960 MAX_TOKENS=163840 DATA_TOKENS=40960 DEADLINE=240 \
#       bash bench/gpu_recall.sh
#                                                        # a dry run of this script on a CPU (minutes)
#
# 1. Probe: every seed trains PROBE_TOKENS in parallel (compile + bf16, as train.py on a GPU) and is scored; its
#    tokens/s (train.py's log.jsonl, after compilation) sizes the main run.
# 2. Main: every seed in parallel, tokens = what the slowest probe's rate allows in the time left (at most
#    MAX_TOKENS), from DATA_TOKENS of written episodes read again each epoch (recall.py --data_tokens: writing 1B
#    tokens would take longer than the lease). Then the seeds are merged into one JSON.
# Trained as the paper trains it: the loss back-propagates through the memory over BPTT = 16 segments (a graph of
# 16 x 64 tokens, episodes packed inside it). BATCH = 256 streams: 262k tokens a step, so that a lease can reach 1B
# tokens at all (a model this small is bound by kernel launches: the step's time hardly grows with the batch), and
# 1B tokens are ~3.8k steps, as many as the CPU runs of 4M tokens take. Otherwise the CPU recipe (bench/README.md,
# recall: AdamW 3e-3 constant after warm-up, curriculum 0.25).
set -u
OUT=${OUT:-out-gpu-recall}
DEVICE=${DEVICE:-cuda}
DEADLINE=${DEADLINE:-540}
SEEDS=${SEEDS:-1 2 3}
VARIANT=${VARIANT:-infini_linear}
BATCH=${BATCH:-256}
BPTT=${BPTT:-16}
PROBE_TOKENS=${PROBE_TOKENS:-20000000}
MAX_TOKENS=${MAX_TOKENS:-1000000000}
DATA_TOKENS=${DATA_TOKENS:-32000000}
OVERRIDES=${OVERRIDES:-}          # model or train.py fields, e.g. gate_lr_mult=1
SCORE_MARGIN=${SCORE_MARGIN:-60}  # seconds kept for scoring and merging after the main run's training
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
START=$SECONDS
left() { echo $((DEADLINE - (SECONDS - START))); }
say() { echo "== +$((SECONDS - START))s $*"; }
min() { echo $(($1 < $2 ? $1 : $2)); }

say "machine"
nvidia-smi -L 2>/dev/null
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

run_seeds() {   # $1: probe or main, $2: tokens, $3: time limit (s)
    local data
    data=$(min "$DATA_TOKENS" "$2")
    for s in $SEEDS; do
        timeout "$3" $PY bench/recall.py --tasks=passkey --variants="$VARIANT" --device="$DEVICE" --seeds="$s" \
            --batch_size="$BATCH" --bptt_segments="$BPTT" --tokens="$2" --data_tokens="$data" --curriculum=0.25 \
            --depths=32,96,160,384,512,1024 --overrides="$OVERRIDES" --plot=False \
            --out_dir="$OUT/$1" --out="$OUT/$1_s$s.json" > "$OUT/$1_s$s.log" 2>&1 &
    done
    wait
    for s in $SEEDS; do
        tr '\r' '\n' < "$OUT/$1_s$s.log" | grep -E "^passkey|^error|Error|done:" | tail -n 3
    done
}

say "1. probe: $PROBE_TOKENS tokens a seed"
run_seeds probe "$PROBE_TOKENS" $(($(left) / 2))
RATE=$($PY - "$OUT/probe/passkey/$VARIANT" $SEEDS <<'EOF'
import json, statistics, sys
rates = []
for s in sys.argv[2:]:
    try:
        lines = [json.loads(l) for l in open(f'{sys.argv[1]}/seed{s}/log.jsonl')]
    except OSError:
        continue
    tok_s = [l['tokens_per_sec'] for l in lines if 'tokens_per_sec' in l][1:]   # the first holds the compilation
    if tok_s:
        rates.append(statistics.median(tok_s))
print(int(min(rates)) if rates else 0)
EOF
)
say "probe: $RATE tokens/s per process (the slowest seed)"

t=$(($(left) - SCORE_MARGIN - 60))                                  # 60 s: startup and compilation again
TOKENS=$(min "$MAX_TOKENS" $((RATE * t)))
TOKENS=$((TOKENS / (BATCH * 64 * BPTT) * BATCH * 64 * BPTT))
if [ "$TOKENS" -gt "$PROBE_TOKENS" ]; then
    say "2. main: $TOKENS tokens a seed ($t s of training)"
    run_seeds main "$TOKENS" $(($(left) - 10))
    files=$(for s in $SEEDS; do [ -f "$OUT/main_s$s.json" ] && printf "%s," "$OUT/main_s$s.json"; done)
    [ -n "$files" ] && $PY bench/recall.py --merge="${files%,}" --out="$OUT/recall_passkey_${VARIANT}_gpu.json" --plot=False \
        2>&1 | tail -n 2
else
    say "2. main: skipped, $t s would give $TOKENS tokens, no more than the probe"
fi
files=$(for s in $SEEDS; do [ -f "$OUT/probe_s$s.json" ] && printf "%s," "$OUT/probe_s$s.json"; done)
[ -n "$files" ] && $PY bench/recall.py --merge="${files%,}" --out="$OUT/recall_passkey_${VARIANT}_gpu_probe.json" --plot=False \
    2>&1 | tail -n 2
say "done"
