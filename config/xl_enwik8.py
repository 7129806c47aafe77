"""Transformer-XL on enwik8 as the authors' PyTorch script trains its 12-layer model (kimiyoung/transformer-xl
pytorch/run_enwik8_base.sh): 12 layers, d_model 512, 8 heads of 64, d_inner 2048, dropout 0.1, dropatt 0, one u, v
pair shared by all layers (their PyTorch model's, and tf/scripts/enwik8_base_gpu.sh gives no --untie_r either),
Adam lr 2.5e-4 with cosine decay to 0 over 400k steps, no warm-up, clip 0.25 (train.py's default), segment 512 /
memory 512, 22 streams per step, an evaluation every 4,000 steps. (The TF script differs: 24 streams, decay to
1e-6.) The paper reports 1.06 bpc on the enwik8 test set for this 12-layer model (Table 2; 0.99 with 24 layers).
Our CPU numbers are not that.

Evaluation during training: segments of 128 with the attention length kept (memory 512 + 512 - 128 = 896), as the
authors' train.py does. Their final test evaluation (run_enwik8_base.sh eval) uses segments of 80, a memory of
2,100, clamp_len 820 and same_length; run it on the trained checkpoint with

    python train.py config/xl_enwik8.py --eval_only=True --eval_split=test --eval_seg_len=80 \\
        --eval_mem_len=2100 --clamp_len=820 --same_length=True

Differences from the authors: all 256 byte values are the vocabulary (their vocabulary is the 204 bytes that occur
in enwik8, so the extra 52 logits only ever learn to be unlikely), and the bytes are read as one stream with the
newlines kept (their corpus reader drops the newline bytes).

    python data/enwik8/prepare.py        # enwik8.zip in data/enwik8/ (http://mattmahoney.net/dc/enwik8.zip)
    torchrun --nproc_per_node=2 train.py config/xl_enwik8.py --batch_size=11    # 2 x 11 = 22 streams
"""
model = 'xl'
dataset = 'enwik8'
out_dir = 'out-xl-enwik8'
n_layer = 12
n_head = 8
n_embd = 512
d_head = 64
d_inner = 2048
dropout = 0.1
dropatt = 0.0
seg_len = 512
mem_len = 512
untie_r = False
batch_size = 22
learning_rate = 2.5e-4
min_lr = 0.0
warmup_iters = 0
max_iters = 400000
grad_clip = 0.25
eval_interval = 4000
eval_seg_len = 128
eval_mem_len = 896
eval_batch_size = 10
