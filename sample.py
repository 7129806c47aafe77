"""
Sample from a trained nanomem checkpoint (any model), with the prompt fed through the memory first.

    python sample.py --out_dir=out-xl --start="The old house on the hill"
    python sample.py --out_dir=out-xl --start=FILE:book.txt --max_new_tokens=500   # a whole book as context
    python sample.py --init_from=gpt2 --start="Hello"          # OpenAI's GPT-2 itself (or gpt2:DIR; pretrained.py)

A long prompt is read segment by segment (seg_len tokens at a time), exactly as in training, so it lands in the
model's memory; generation then continues from the last partial segment. Text streams to stdout as it is made.
On CUDA each new token's step is replayed as one CUDA graph (`--cuda_graph=False` runs it op by op): at batch 1 a
token is hundreds of small kernels, whose launches otherwise cost more than their arithmetic.

The tokenizer is the one the checkpoint was trained with (train.py records it): GPT-2 BPE, UTF-8 bytes (enwik8,
data/gutenberg/prepare.py --tokenizer=bytes) or a character table (text8). A byte model's prompt, a FILE: one
too, is fed as its raw bytes, and bytes it makes that are not valid UTF-8 are shown as U+FFFD, never raised.

`--help` lists the flags. Ctrl-C stops it with one line on stderr and exit status 130; the text so far stays.
"""

import codecs
import math
import signal
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path


def interrupted(kind, value, traceback):
    """Ctrl-C ends sample.py with one line and exit status 130 (128 + SIGINT), keeping the text written so far."""
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, value, traceback)
    sys.stdout.flush()
    print("\ninterrupted (Ctrl-C)", file=sys.stderr)
    sys.exit(130)


def ctrl_c_noted(signum, frame):
    """Ctrl-C while torch is imported: noted, and acted on once the imports are done. A KeyboardInterrupt raised
    inside an import can be swallowed by the imported code's own `except:` (seen: 1 of 16 tries), and the sample would
    then run on."""
    ctrl_c_noted.pressed = True


if __name__ == '__main__':
    sys.excepthook = interrupted
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # an inherited "ignore" stays (a background job)
        signal.signal(signal.SIGINT, ctrl_c_noted)

import torch  # noqa: E402

import pretrained  # noqa: E402
from train import (UserError, REPO, import_model, parse_args, load_checkpoint, model_from_checkpoint,
                   resolve_device, resolve_dtype, autocast_context, run_cli)


if signal.getsignal(signal.SIGINT) is ctrl_c_noted:            # imported: Ctrl-C raises KeyboardInterrupt again
    signal.signal(signal.SIGINT, signal.default_int_handler)
if getattr(ctrl_c_noted, 'pressed', False):
    interrupted(KeyboardInterrupt, None, None)


# Below it sampling is greedy in all but name (logit gaps of 0.1 become 10), and logits / temperature can
# overflow to inf in float16 (and to NaN probabilities): 0 asks for greedy decoding outright.
MIN_TEMPERATURE = 0.01


@dataclass
class SampleConfig:
    out_dir: str = 'out'               # where train.py wrote its checkpoints
    ckpt: str = 'ckpt.pt'              # ckpt.pt (last) or best.pt
    init_from: str = 'resume'          # resume: the checkpoint above; gpt2, gpt2-medium, gpt2-large, gpt2-xl or
                                       # gpt2:DIR: GPT-2's own weights, read segment by segment (model_gpt2.py)
    start: str = '\n'                  # the prompt, or FILE:path to read it from a file (a whole book is fine)
    num_samples: int = 1
    max_new_tokens: int = 500
    temperature: float = 0.8           # 0 = greedy
    top_k: int = 200                   # 0 = no top-k truncation
    mem_len: int = -1                  # memory length while sampling; -1 = the checkpoint's (a longer one can help)
    seed: int = 1337
    device: str = 'auto'
    dtype: str = 'auto'                # auto = bfloat16 on CUDA (float16 where bf16 is missing), float32 elsewhere
    cuda_graph: bool = True            # on CUDA, replay each token's decode step as one CUDA graph; False: run it

    def __post_init__(self):
        for name in ('num_samples', 'max_new_tokens'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
                             f"got {self.temperature}")
        if self.top_k < 0 or self.mem_len < -1:
            raise ValueError(f"top_k must be >= 0 and mem_len >= -1, got top_k={self.top_k}, mem_len={self.mem_len}")
        pretrained.check_init_from(self.init_from, others=('resume',))
        if not -2**63 <= self.seed < 2**64:
            raise ValueError(f"seed must be a 64-bit integer, got {self.seed}")
        if self.dtype not in ('auto', 'float32', 'bfloat16', 'float16'):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")


def read_prompt(start) -> bytes:
    """The prompt as bytes: --start encoded as UTF-8, or the file FILE:path as it is on disk."""
    if start.startswith('FILE:'):
        path = Path(start[len('FILE:'):])
        try:
            return path.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read prompt file {path}: {e.strerror}")
    return start.encode('utf-8')


def encode_prompt(raw, tokenizer):
    """Token ids of the prompt. Bytes go in as they are; a character table (text8: lower-case letters and space)
    gets the text the way text8 was made: lower-cased, anything else a space."""
    if tokenizer.name == 'bytes':
        ids = list(raw)
    else:
        text = raw.decode('utf-8', errors='replace')
        if tokenizer.name == 'chars':
            text = ''.join(c if c in tokenizer.index else ' ' for c in text.lower())
        ids = tokenizer.encode(text, allow_eot=True)
    if not ids:
        if tokenizer.eot is None:
            raise UserError("the prompt is empty: give --start some text")
        ids = [tokenizer.eot]
    return ids


class Streamer:
    """Writes tokens as text while they arrive; a character split across tokens is held until complete, and
    bytes that are not valid UTF-8 are written as U+FFFD."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, sys.stdout if out is None else out
        self.decoder = codecs.getincrementaldecoder('utf-8')(errors='replace')

    def __call__(self, tokens):                                  # tokens: (1, 1) tensor
        self.out.write(self.decoder.decode(self.tokenizer.token_bytes(int(tokens[0, 0]))))
        self.out.flush()

    def close(self):
        self.out.write(self.decoder.decode(b'', final=True))
        self.out.flush()


def sample(argv):
    cfg, _, _, _ = parse_args(argv, SampleConfig, allow_model_fields=False)
    from tqdm import tqdm
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from data.tokenizer import TokenizerError, from_meta

    device, device_type = resolve_device(cfg.device)
    ctx = autocast_context(device_type, resolve_dtype(cfg.dtype, device_type))
    torch.manual_seed(cfg.seed)

    if pretrained.is_gpt2(cfg.init_from):
        module = import_model('gpt2')
        path = cfg.init_from
        model_cfg, model, note, meta = pretrained.init_from_gpt2(cfg.init_from, 'gpt2', module, module.Config(), set(),
                                                                 tokenizer=None)
        print(note, file=sys.stderr)
        ckpt = {'tokenizer': meta}                    # the tokens the weights read (the hub's: none named, GPT-2's)
    else:
        path = Path(cfg.out_dir) / cfg.ckpt
        ckpt = load_checkpoint(path, 'cpu')
        # attn_kernel is no weight: off CUDA, where Triton's kernels do not run, the same attention written out
        off_cuda = ckpt['model_config'].get('attn_kernel') == 'triton' and device_type != 'cuda'
        _, model_cfg, model = model_from_checkpoint(ckpt, path, {'attn_kernel': 'einsum'} if off_cuda else None)
    model.eval().to(device)
    try:
        tokenizer = from_meta(ckpt.get('tokenizer'))         # GPT-2 for checkpoints that name none
        if model_cfg.vocab_size < tokenizer.vocab_size:
            name = {'gpt2': 'GPT-2', 'bytes': 'byte', 'chars': 'character'}[tokenizer.name]
            raise UserError(f"{path} has vocab_size={model_cfg.vocab_size}, fewer than the {name} tokenizer's "
                            f"{tokenizer.vocab_size} tokens: it was trained on other tokens")
        raw = read_prompt(cfg.start)
        tokens = encode_prompt(raw, tokenizer)
    except TokenizerError as e:
        raise UserError(str(e))
    T = model_cfg.seg_len
    n_full = (len(tokens) - 1) // T                  # whole segments go into memory; >= 1 token is left to generate
    mem_len = {} if cfg.mem_len == -1 else {'mem_len': cfg.mem_len}
    try:
        memory = model.init_memory(1, device, **mem_len)
    except RuntimeError as e:                                   # torch.OutOfMemoryError is one too
        if not isinstance(e, torch.OutOfMemoryError) and 'allocate' not in str(e):
            raise
        raise UserError(f"--mem_len={cfg.mem_len} does not fit in memory: use a shorter one")
    prompt = torch.tensor(tokens, dtype=torch.long, device=device)[None]       # (1, N)
    with torch.no_grad(), ctx:
        for s in tqdm(range(n_full), desc='prompt into memory', unit='seg', disable=n_full < 2, file=sys.stderr):
            _, _, memory, _ = model(prompt[:, s * T:(s + 1) * T], memory)
    rest = prompt[:, n_full * T:]
    if n_full:
        print(f"[{n_full * T:,} prompt tokens in memory, {rest.size(1)} in the last segment]", file=sys.stderr)

    graph = {'cuda_graph': True} if cfg.cuda_graph and device_type == 'cuda' else {}   # a CPU has no graphs
    for i in range(cfg.num_samples):
        streamer = Streamer(tokenizer)
        if not cfg.start.startswith('FILE:'):
            sys.stdout.write(cfg.start)
        sample_memory = replace(memory, **{f.name: getattr(memory, f.name).clone() for f in fields(memory)})
        with ctx:
            model.generate(rest, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k or None,
                           memory=sample_memory, callback=streamer, **graph)
        streamer.close()
        sys.stdout.write('\n' + ('-' * 40 + '\n' if i + 1 < cfg.num_samples else ''))
        sys.stdout.flush()


def main(argv=None):
    try:
        run_cli(sample, argv)
    except KeyboardInterrupt:
        interrupted(KeyboardInterrupt, None, None)


if __name__ == '__main__':
    main()
