#!/usr/bin/env bash
# Every variant at the size people train, on one CUDA GPU, in one call (a lent machine has ~10 minutes a call).
#
#   OUT=out-gpu-size bash bench/gpu_size.sh          # on the GPU machine; at most 5 files land in $OUT
#   DRY_RUN=1 OUT=/tmp/gpu-size bash bench/gpu_size.sh
#                                                    # the whole script on a CPU at a tiny size for 2 variants
#                                                    # (VARIANTS_DRY), compiled with dynamo's eager backend (no
#                                                    # inductor): under a minute (tests/test_bench.py runs it)
#
# The size: d_model 1024, 16 layers, 16 heads of 64, d_inner 4096, segment 512, memory 512 (compressed 256 at c = 2,
# 512 basis functions), batch 8, GPT-2 vocabulary (bench/common.py's SIZES['gpu']); steps as bench/speed.py's Entry
# times them (forward, backward, fused AdamW, the memory carried). Driven by bench/gpu_size.py.
# 1. Fill the compile caches: each variant compiles its compiled modes in a process of its own, PARALLEL at a time
#    (GPU memory: each holds a model at this size), then exits. The cold first steps are kept (contended).
# 2. Time each variant alone, one process at a time, nothing else on the GPU (a host-bound step is sensitive to
#    sibling processes): eager fp32 and compile + bf16; for GRAPHS_VARIANTS also the step replayed as CUDA graphs
#    (reduce-overhead: train.py's --compile_mode), for BLOCKS_VARIANTS each layer block compiled (train.py's
#    --compile_blocks; its cold first step is in the fill stage's record). MFU against
#    an 8192^3 bf16 product measured in the process. A variant that misses a target (and Infini, whose target is
#    the GPU's busy fraction) gets a profile of its compiled bf16 step: kernel time over step time.
# 3. Merge: ratios to the baseline, the targets checked (printed at the end), $OUT/gpu_size.json and its profiles.
# 4. bench/attn_kernels.py (one layer's attention on every path) where it exists, with the time left.
# Budget (not yet run on a GPU): the fill ~FILL_S, then ~40 s a variant with warm caches. Each variant gets an equal
# share of the time left; one that runs out is skipped with a line: time it in a second call with
# VARIANTS=baseline,<the skipped ones> (the baseline again: the ratios are to it).
set -u
OUT=${OUT:-out-gpu-size}
DRY_RUN=${DRY_RUN:-0}
DEVICE=${DEVICE:-cuda}
VARIANTS=${VARIANTS:-baseline,xl,infini_linear,infini_delta,compressive,lamemo,infformer,infformer_sticky}
MODES=${MODES:-eager,compile_bf16}                     # every variant's (the targets need both)
GRAPHS_VARIANTS=${GRAPHS_VARIANTS:-xl,infini_linear}  # also graphs_bf16: the step as CUDA graphs
BLOCKS_VARIANTS=${BLOCKS_VARIANTS:-xl}                 # also blocks_bf16: the compile time of one block, not 16
PARALLEL=${PARALLEL:-4}           # fill processes at once
FILL_S=${FILL_S:-200}             # the fill stage's time limit (s); a compile it misses happens in stage 2
WARMUP=${WARMUP:-3}               # untimed rounds (compile; CUDA graphs record after a warm-up run)
STEPS=${STEPS:-5}
DEADLINE=${DEADLINE:-560}
SIZE=gpu BACKEND=inductor BATCH=8 PEAK=0 ATTN_DTYPE=bfloat16 QUICK=False
ATTN=${ATTN:-1}                   # 0: skip bench/attn_kernels.py (its own tests run its dry run)
if [ "$DRY_RUN" = 1 ]; then                            # the same steps, fewer variants unless VARIANTS is given
    DEVICE=cpu SIZE=tiny BACKEND=eager BATCH=2 PEAK=128 WARMUP=1 STEPS=2 FILL_S=60 ATTN_DTYPE=float32 QUICK=True
    VARIANTS=${VARIANTS_DRY:-baseline,infini_linear} BLOCKS_VARIANTS=infini_linear
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
PARTS=$(mktemp -d)
START=$SECONDS
left() { echo $((DEADLINE - (SECONDS - START))); }
say() { echo "== +$((SECONDS - START))s $*"; }
exec > >(tee "$OUT/log.txt") 2>&1
COMMON="--size=$SIZE --device=$DEVICE --batch_size=$BATCH --backend=$BACKEND --results_dir=$PARTS"

say "machine (DRY_RUN=$DRY_RUN)"
nvidia-smi -L 2>/dev/null
$PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

modes_for() {   # $1: a variant -> its modes
    local m=$MODES
    case ",$GRAPHS_VARIANTS," in *",$1,"*) m="$m,graphs_bf16" ;; esac
    case ",$BLOCKS_VARIANTS," in *",$1,"*) m="$m,blocks_bf16" ;; esac
    echo "$m"
}

say "1. fill the compile caches: $PARALLEL processes at once, ${FILL_S}s at most"
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
pids=()
for v in ${VARIANTS//,/ }; do
    while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do sleep 1; done
    t=$((FILL_S - (SECONDS - START)))
    [ "$t" -lt 1 ] && break
    timeout "$t" $PY bench/gpu_size.py --stage=fill --variants="$v" --modes="$(modes_for "$v")" \
        $COMMON > "$PARTS/fill_$v.log" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
cat "$PARTS"/fill_*.log | grep '^{' > "$PARTS/fill.jsonl"
cat "$PARTS/fill.jsonl"
unset TORCHINDUCTOR_COMPILE_THREADS

say "2. time each variant alone"
n=$(echo "${VARIANTS//,/ }" | wc -w)
for v in ${VARIANTS//,/ }; do
    t=$(( ($(left) - 45) / n ))                # an equal share of what is left (45 s kept for merge and attention)
    n=$((n - 1))
    if [ "$t" -lt 20 ]; then say "$v: skipped, no time left"; continue; fi
    say "$v ($(modes_for "$v"), ${t}s at most)"
    timeout "$t" $PY bench/gpu_size.py --stage=time --variants="$v" --modes="$(modes_for "$v")" --warmup="$WARMUP" \
        --steps="$STEPS" --peak_size="$PEAK" $COMMON > "$PARTS/time_$v.log" 2>&1
    echo "exit $?"
    grep -E "round|wrote|rror" "$PARTS/time_$v.log" | tail -n 3
done

say "3. merge and check the targets"
$PY bench/gpu_size.py --stage=merge --variants="$VARIANTS" --results_dir="$PARTS" --fill_log="$PARTS/fill.jsonl" \
    --out="$OUT/gpu_size.json" 2>&1 | tail -n 30

t=$(left)
if [ "$ATTN" = 1 ] && [ -f bench/attn_kernels.py ] && [ "$t" -gt 15 ]; then
    say "4. one layer's attention on every path (bench/attn_kernels.py, ${t}s at most)"
    timeout "$t" $PY bench/attn_kernels.py --device="$DEVICE" --dtype="$ATTN_DTYPE" --quick="$QUICK" \
        > "$OUT/attn_kernels.jsonl" 2> "$PARTS/attn.err"
    echo "exit $?"
    cat "$OUT/attn_kernels.jsonl"; tail -n 5 "$PARTS/attn.err"
else
    say "4. attention paths: skipped (ATTN=$ATTN, bench/attn_kernels.py absent, or ${t}s left)"
fi
(cd "$PARTS" && tar czf "$OUT/parts.tgz" ./*.json ./*.log ./*.jsonl 2>/dev/null)   # per-variant JSONs and logs
say "done"
