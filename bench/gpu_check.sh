#!/usr/bin/env bash
# The GPU path end to end, in one call on one CUDA GPU (a lent machine has minutes; nothing here needs a network).
#
#   python data/gutenberg/prepare.py          # here, first: the demo configs read data/gutenberg/*.bin
#   OUT=out-gpu bash bench/gpu_check.sh       # on the GPU machine; results and one log land in $OUT
#
# 1. bench/speed.py, eager and bf16 autocast, GPT-2 vocabulary (+ generation) and byte level (GPU to itself).
# 2. Every model trains from scratch with torch.compile + bf16 (train.py's CUDA defaults) for ITERS steps on
#    config/<model>_demo.py, resumes from its checkpoint for ITERS/2 more, and samples 100 tokens from it;
#    torchrun (one process, NCCL) trains the ∞-former and Compressive with recon_loss=none under DDP.
#    All in parallel: this part checks that the CUDA path runs, not how fast.
# 3. bench/speed.py compiled (compile_bf16 against bf16) at byte level, with what time is left.
# Each part has a time limit, so a slow part never costs the ones after it. Stops at DEADLINE seconds.
set -u
OUT=${OUT:-out-gpu-check}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-32}
STEPS=${STEPS:-20}
ITERS=${ITERS:-200}
DEADLINE=${DEADLINE:-540}
COMPILE_VARIANTS=${COMPILE_VARIANTS:-baseline,xl,compressive,infini_linear,infformer}
COMPILE=${COMPILE:-True}          # False: a quick dry run of this script on a CPU
EXTRA=${EXTRA:-}                  # a command run after part 1, with the GPU to itself
EXTRA_TIMEOUT=${EXTRA_TIMEOUT:-150}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
START=$SECONDS
LOGS=$(mktemp -d)
left() { echo $((DEADLINE - (SECONDS - START))); }
say() { echo "== +$((SECONDS - START))s $*"; }

say "machine"
nvidia-smi -L 2>/dev/null
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

say "1. speed, eager and bf16"
timeout 150 $PY bench/speed.py --device="$DEVICE" --batch_size="$BATCH" --steps="$STEPS" --modes=eager,bf16 \
    --parts=train,generate --out="$OUT/speed_gpu_gpt2.json" --plot=False 2>&1 | grep -v "^\s*$" | tail -n 25
timeout 120 $PY bench/speed.py --device="$DEVICE" --batch_size="$BATCH" --steps="$STEPS" --modes=eager,bf16 \
    --vocab=256 --parts=train --out="$OUT/speed_gpu_bytes.json" --plot=False 2>&1 | grep -v "^\s*$" | tail -n 15

if [ -n "$EXTRA" ]; then
    say "extra: $EXTRA"
    timeout "$EXTRA_TIMEOUT" bash -c "$EXTRA" 2>&1 | tail -n 12
fi

say "2. train (compile + bf16), resume, sample: every model in parallel"
for m in xl lamemo compressive infini infformer; do
    d="$LOGS/out-$m"
    ( timeout 300 $PY train.py config/${m}_demo.py --device="$DEVICE" --compile="$COMPILE" --max_iters="$ITERS" \
          --eval_interval=$((ITERS / 2)) --out_dir="$d" \
      && timeout 200 $PY train.py config/${m}_demo.py --device="$DEVICE" --compile="$COMPILE" --init_from=resume \
          --max_iters=$((ITERS * 3 / 2)) --eval_interval=$((ITERS / 2)) --out_dir="$d" \
      && timeout 100 $PY sample.py --out_dir="$d" --device="$DEVICE" --start="ROMEO. " --max_new_tokens=100 \
      ; echo "exit $?" ) > "$LOGS/$m.log" 2>&1 &
done
( timeout 300 torchrun --standalone --nproc_per_node=1 train.py config/infformer_demo.py --device="$DEVICE" \
      --max_iters=$((ITERS / 2)) --eval_interval=$((ITERS / 2)) --out_dir="$LOGS/out-ddp-infformer" \
  && timeout 300 torchrun --standalone --nproc_per_node=1 train.py config/compressive_demo.py --device="$DEVICE" \
      --recon_loss=none --max_iters=$((ITERS / 2)) --eval_interval=$((ITERS / 2)) --out_dir="$LOGS/out-ddp-compressive" \
  ; echo "exit $?" ) > "$LOGS/ddp.log" 2>&1 &
wait
for f in "$LOGS"/*.log; do
    echo "---- $(basename "$f")"
    tr '\r' '\n' < "$f" | grep -v "^\s*$" | grep -v "^ *[0-9]*%|\|eval validation:" | tail -n 14
done
for m in xl lamemo compressive infini infformer ddp-infformer ddp-compressive; do
    [ -f "$LOGS/out-$m/log.jsonl" ] && cp "$LOGS/out-$m/log.jsonl" "$LOGS/log_$m.jsonl"
done
(cd "$LOGS" && tar czf "$OUT/train_logs.tgz" log_*.jsonl *.log 2>/dev/null)

t=$(left)
say "3. speed, compile_bf16 against bf16, byte level ($t s left)"
if [ "$t" -gt 60 ]; then
    timeout "$t" $PY bench/speed.py --device="$DEVICE" --batch_size="$BATCH" --steps="$STEPS" \
        --modes=bf16,compile_bf16 --vocab=256 --parts=train --variants="$COMPILE_VARIANTS" \
        --out="$OUT/speed_gpu_bytes_compile.json" --plot=False 2>&1 | grep -v "^\s*$" | tail -n 12
fi
say "done"
