#!/usr/bin/env bash
# The relative-attention kernel (rel_attention_triton.py) on one CUDA GPU, in one call (a lease has minutes).
#
#   OUT=out-gpu-attn bash bench/gpu_attn.sh             # on the GPU machine; at most 6 files land in $OUT
#   DRY_RUN=1 OUT=/tmp/gpu-attn bash bench/gpu_attn.sh  # the same steps on a CPU at a tiny size, the kernels
#                                                       # interpreted and compiled with dynamo's eager backend
#
# 1. In the background: XL's compile caches at the size people train (bench/gpu_size.py --stage=fill, compile + bf16),
#    one process per attn_kernel (sdpa, today's default; triton).
# 2. Meanwhile, correctness on the GPU: tests/test_rel_attention_triton.py's GPU cases (the compiled kernels in bf16
#    against the float32 reference, forward, log-sum-exp and every gradient; each model's triton path against its
#    einsum path in one bf16-autocast training step, XL's sdpa path too).
# 3. Once the fill is done, the GPU to itself: bench/attn_kernels.py, one layer's attention on every path at B 8, H 16,
#    T 512, K 1024, D 64, bf16, forward and forward + backward; the Triton kernel at each entry of TILES.
# 4. With the time left: XL compiled in bf16 at that size, sdpa against triton: tokens/s and MFU against a measured
#    8192^3 bf16 product (bench/gpu_size.py --stage=time).
# Each part has a time limit; the whole stops at DEADLINE seconds.
set -u
OUT=${OUT:-out-gpu-attn}
DRY_RUN=${DRY_RUN:-0}
DEADLINE=${DEADLINE:-420}
# block_q,block_k,num_warps,num_stages of every kernel, or the forward's/the backward's: TILES' (sm_90's, sm_80's,
# sm_100's: the forward at 64 x 16, as sm_90's was until 2026-11-28) first, then others to choose from
TILES=${TILES:-64,64,4,2/64,16,4,2;32,32,4,2;64,16,4,2;64,32,4,2/64,16,4,2;64,64,8,2/64,32,8,2;128,32,8,2}
KERNELS=${KERNELS:-sdpa,triton}
DEVICE=cuda SIZE=gpu BACKEND=inductor MODES=compile_bf16 ATTN_ARGS="--dtype=bfloat16" WARMUP=2 STEPS=5 PEAK=0
if [ "$DRY_RUN" = 1 ]; then
    DEVICE=cpu SIZE=tiny BACKEND=eager MODES=eager ATTN_ARGS="--dtype=float32 --quick=True" WARMUP=1 STEPS=1 PEAK=128
    export TRITON_INTERPRET=1        # before anything imports triton: the kernels run on CPU tensors, in float32
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
SIZE_ARGS="--variants=xl --modes=$MODES --size=$SIZE --device=$DEVICE --backend=$BACKEND --batch_size=8"

say "machine (DRY_RUN=$DRY_RUN)"
nvidia-smi -L 2>/dev/null
$PY -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
      'triton', triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

say "1. fill XL's compile caches in the background ($KERNELS)"
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-6}
fills=()
for k in ${KERNELS//,/ }; do
    timeout 200 $PY bench/gpu_size.py --stage=fill $SIZE_ARGS --attn_kernel="$k" > "$PARTS/fill_$k.log" 2>&1 &
    fills+=($!)
done

say "2. the GPU cases of tests/test_rel_attention_triton.py"
timeout 150 $PY -m pytest -q -p no:cacheprovider tests/test_rel_attention_triton.py -rs \
    -k "bf16_rounding or under_autocast" 2>&1 | tail -n 25 | tee "$OUT/tests.txt"

wait "${fills[@]}"
for k in ${KERNELS//,/ }; do echo "fill $k: $(grep -E '^\{|rror' "$PARTS/fill_$k.log" | tail -n 2)"; done
unset TORCHINDUCTOR_COMPILE_THREADS

t=$(( $(left) - 100 ))
[ "$t" -gt 240 ] && t=240
say "3. one layer's attention on every path (bench/attn_kernels.py, ${t}s at most)"
if [ "$t" -gt 20 ]; then
    timeout "$t" $PY bench/attn_kernels.py --device="$DEVICE" $ATTN_ARGS --triton_tiles="$TILES" \
        > "$OUT/attn_kernels.jsonl" 2> "$PARTS/attn.err"
    echo "exit $?"
    tail -n 5 "$PARTS/attn.err"
    $PY - "$OUT/attn_kernels.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    cells = [f"{k} {r[k]:.3f}" for k in ('fwd_ms', 'fwd_bwd_ms') if k in r]
    cells += [f"{k} {r[k]:.2e}" for k in ('max_abs_diff_out', 'max_abs_diff_grads') if k in r]
    print(f"{r['path']:22s}", ' | '.join(cells) or r.get('skipped') or r.get('error'))
EOF
fi

say "4. XL compiled in bf16 at the size people train, each attn_kernel ($(left)s left)"
for k in ${KERNELS//,/ }; do
    t=$(( $(left) - 5 ))
    if [ "$t" -lt 30 ]; then say "$k: skipped, no time left"; continue; fi
    timeout "$t" $PY bench/gpu_size.py --stage=time $SIZE_ARGS --attn_kernel="$k" --warmup="$WARMUP" \
        --steps="$STEPS" --peak_size="$PEAK" --profile=none --results_dir="$PARTS/$k" > "$PARTS/time_$k.log" 2>&1
    echo "exit $?"
    grep -E "rror" "$PARTS/time_$k.log" | tail -n 3
    [ -f "$PARTS/$k/xl.json" ] && $PY bench/gpu_size.py --stage=merge --variants=xl --results_dir="$PARTS/$k" \
        --out="$OUT/xl_$k.json" 2>&1 | grep -v "^wrote"                  # tokens/s, MFU, first step; XL's MFU target
done
say "done"
