"""
nanomem against the authors' code at the same size: training tokens/s (forward + backward + AdamW, memory carried)
of model_xl.py, model_lamemo.py and model_infformer.py next to the code their papers released, interleaved round
by round in one process, medians over the timed rounds.

    python bench/vs_authors.py --xl_repo=PATH --lamemo_repo=PATH --infformer_repo=PATH
    python bench/vs_authors.py --infformer_repo=PATH --vocab=50304 --out=bench/results/vs_authors_gpt2.json

Their code is not in this repository. Point the flags at checkouts of (the commits we timed):
  --xl_repo         kimiyoung/transformer-xl 44781ed, pytorch/mem_transformer.py (attn_type 0)
  --lamemo_repo     thu-coai/LaMemo 911d1d1, pytorch/mem_transformer.py (attn_type 3, their default)
  --infformer_repo  deep-spin/infinite-former 6bf094c, sorting/mem_transformer.py with the flags of
                    sorting/run_sort_inftyformer.sh (LTM, unbounded memory, CNN mask, KL regulariser)
Each needs a few edits to import and run on torch 2.x (and on a CPU); EDITS lists them with their reasons, and they
are made to the source text as it is loaded (the checkout is not changed). An edit whose text is not found is an
error: the checkout is another commit. Modules their files import but never use are stubbed (STUBS).

Both models of a pair get the same size, memory and LTM settings: our Config is set to the constants the authors'
code fixes (for the ∞-former: 512 sample points, RBF widths {0.01, 0.05}, τ 0.75, ridge λ 1, σ² ≥ 1e-6, u and v
shared by the layers). Their weights are drawn N(0, 0.02) (LayerNorm gains 1): their own init lives in train.py.
"""

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from speed import MODES  # noqa: E402  (eager, bf16, compile, compile_bf16: the modes of bench/speed.py)

UserError = common.train.UserError


@dataclass
class VsAuthorsConfig:
    xl_repo: str = ''              # a kimiyoung/transformer-xl checkout ('' = skip the pair)
    lamemo_repo: str = ''          # a thu-coai/LaMemo checkout
    infformer_repo: str = ''       # a deep-spin/infinite-former checkout
    vocab: int = 256               # 256 = byte level (the memories do the work); 50304 = GPT-2
    n_layer: int = 4               # the matched size of bench/speed.py
    n_embd: int = 256              # = n_head * d_head (the ∞-former's code needs it)
    n_head: int = 4
    d_head: int = 64
    d_inner: int = 1024
    seg_len: int = 128
    mem_len: int = 128             # memory (the ∞-former's STM)
    n_basis: int = 128             # the ∞-former's N
    batch_size: int = 8
    device: str = 'cpu'
    modes: str = 'eager'           # comma-separated, of eager, bf16, compile, compile_bf16 (every model the same)
    warmup: int = 3                # untimed rounds: the memories fill, the LTMs write from round 3 on
    rounds: int = 10               # timed rounds: medians over these
    out: str = str(common.RESULTS / 'vs_authors.json')

    def __post_init__(self):
        for name in ('vocab', 'n_layer', 'n_embd', 'n_head', 'd_head', 'd_inner', 'seg_len', 'mem_len', 'n_basis',
                     'batch_size', 'rounds'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 3:
            raise ValueError(f"warmup must be >= 3 (the ∞-formers' LTMs first write in the third step), "
                             f"got {self.warmup}")
        for m in self.modes.split(','):
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r} in modes; known: {', '.join(MODES)}")
        if self.n_embd != self.n_head * self.d_head:
            raise ValueError(f"n_embd must equal n_head * d_head (the authors' ∞-former needs it), got "
                             f"{self.n_embd} != {self.n_head} * {self.d_head}")


# -----------------------------------------------------------------------------------------------------------
# Loading the authors' files with the edits they need

BOOL_MASKS = ('.byte()', '.bool()', 'masked_fill with uint8 masks is an error since torch 2.0')
CPU_TORCH = ('proj_adaptive_softmax', 'utils/proj_adaptive_softmax.py', [
    ("torch.version.cuda.split('.')", "(torch.version.cuda or '0.0').split('.')",
     'CUDA_MAJOR/MINOR (used only in a comment) fail to import on a CPU build of torch')])
NO_ANOMALY = ('torch.autograd.set_detect_anomaly(True)', 'pass',
              'a debugging switch left on at import: it slows every autograd op of the process, ours too')
# pair: (folder in the checkout, [(module name, file, [(old text, new text, why)])]); the last file is the model.
EDITS = {
    'xl': ('pytorch', [CPU_TORCH, ('mem_transformer', 'mem_transformer.py', [BOOL_MASKS])]),
    'lamemo': ('pytorch', [CPU_TORCH, ('mem_transformer', 'mem_transformer.py', [BOOL_MASKS])]),
    'infformer': ('sorting', [
        CPU_TORCH,
        ('continuous_softmax', 'continuous_softmax.py', [NO_ANOMALY]),
        ('continuous_sparsemax', 'continuous_sparsemax.py', [NO_ANOMALY]),
        ('long_term_attention', 'long_term_attention.py', [
            ("self.device = 'cuda'", 'self.device = DEVICE', 'the device is hard-coded'),
            ('self.mask=mask\n', 'self.mask=mask\n        self.share_mask=False\n',
             'share_mask is read (with --mask) but never set')]),
        ('mem_transformer', 'mem_transformer.py', [
            ('self.augment_len=augment_len\n', 'self.augment_len=augment_len\n        self.augment=True\n',
             '_update_mems reads self.augment, never set (their script passes --augment)')]),
    ]),
}


def _stub(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _unused(*args, **kwargs):
    raise NotImplementedError("stubbed by bench/vs_authors.py: not used by the timed configuration")


# Imported by the ∞-former's files but not used with the flags of run_sort_inftyformer.sh (two of them are not in
# the repository at all); LaMemo's utils/__init__.py imports its DDP helpers, so utils is a bare package here.
STUBS = {
    'infformer': lambda folder: {
        'attention': _stub('attention', ContinuousAttention=_unused),
        'long_term_attention_transformer': _stub('long_term_attention_transformer',
                                                 LongTermAttentionTransformer=_unused),
        'entmax': _stub('entmax', Sparsemax=_unused, Entmax15=_unused, EntmaxBisect=_unused),
        'matplotlib': _stub('matplotlib'), 'matplotlib.pyplot': _stub('matplotlib.pyplot')},
    'lamemo': lambda folder: {'utils': _stub('utils', __path__=[str(folder / 'utils')])},
}
# Top-level names the three checkouts share (each has its own utils/proj_adaptive_softmax.py, ...): dropped from
# sys.modules before and after a load, so no pair imports another's.
SHARED = ('utils', 'proj_adaptive_softmax', 'log_uniform_sampler', 'mem_transformer', 'continuous_softmax',
          'long_term_attention', 'basis_functions', 'continuous_sparsemax')


def load_authors(pair, repo, device):
    """The authors' model module of `pair` from the checkout `repo`, with EDITS made to its files."""
    folder_name, files = EDITS[pair]
    folder = Path(repo) / folder_name
    if not folder.is_dir():
        raise UserError(f"--{pair}_repo={repo}: no folder {folder_name}/ there (a checkout of the authors' code?)")
    saved_path, stubs = sys.path[:], STUBS.get(pair, lambda f: {})(folder)
    _forget(list(stubs) + list(SHARED))
    sys.path[:0] = [str(folder), str(folder / 'utils')]
    sys.modules.update(stubs)
    try:
        for name, filename, edits in files:
            path = folder / filename
            if not path.is_file():
                raise UserError(f"--{pair}_repo={repo}: {folder_name}/{filename} not found")
            source = path.read_text()
            for old, new, why in edits:
                if old not in source:
                    raise UserError(f"{path}: expected {old.strip()!r} to edit ({why}); is it the commit named in "
                                    f"bench/vs_authors.py?")
                source = source.replace(old, new)
            module = types.ModuleType(name)
            module.__file__, module.DEVICE = str(path), str(device)
            sys.modules[name] = module                   # the next file's `from <name> import ...` finds it
            exec(compile(source, str(path), 'exec'), module.__dict__)
        if torch.is_anomaly_enabled():                   # would slow every model of the process
            raise UserError(f"{folder}: importing it turned on autograd's anomaly mode; add the file to EDITS")
        return module
    finally:
        sys.path[:] = saved_path
        _forget(list(stubs) + list(SHARED), keep_as=f'authors_{pair}__')


def _forget(names, keep_as=''):
    """Drop the modules under these top-level names from sys.modules; with keep_as, keep each importable under
    keep_as + its name instead (torch.compile imports a function's module by the name in its globals)."""
    for name in list(sys.modules):
        if name.split('.')[0] in names:
            module = sys.modules.pop(name)
            if keep_as:
                module.__name__ = keep_as + name
                sys.modules[module.__name__] = module


# -----------------------------------------------------------------------------------------------------------
# The pairs at one size


def ours(pair, cfg):
    """Our model of the pair at cfg's size, with the constants the authors' code fixes."""
    size = dict(vocab_size=cfg.vocab, n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head, d_head=cfg.d_head,
                d_inner=cfg.d_inner, seg_len=cfg.seg_len, mem_len=cfg.mem_len, untie_r=False)
    if pair == 'infformer':
        size.update(n_basis=cfg.n_basis, n_samples=512, basis_widths='0.01,0.05', tau=0.75, ridge_lambda=1.0,
                    sigma_sq_min=1e-6, sigma_0=0.05, kl_weight=1e-6, cnn_gate=True)
    model, _ = common.build({'model': pair}, **size)
    return model


def authors(pair, module, cfg):
    """The authors' MemTransformerLM of the pair at cfg's size."""
    kw = dict(n_token=cfg.vocab, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.n_embd, d_head=cfg.d_head,
              d_inner=cfg.d_inner, dropout=0.0, dropatt=0.0, tgt_len=cfg.seg_len, mem_len=cfg.mem_len, ext_len=0,
              cutoffs=[])
    if pair == 'lamemo':
        kw.update(attn_type=3)
    if pair == 'infformer':                               # sorting/run_sort_inftyformer.sh's flags
        kw.update(eval_tgt_len=cfg.seg_len, long_term_attention=True, long_term_attention_basis=cfg.n_basis,
                  long_term_attention_norm='softmax', infinite_memory=True, augment_len=cfg.seg_len, affines=True,
                  mask=True, mask_type='cnn', kl_regularizer=True, sigma_0=0.05)
    model = module.MemTransformerLM(**kw)
    with torch.no_grad():                                 # their init is in their train.py
        for name, p in model.named_parameters():
            if 'layer_norm' in name and name.endswith('weight'):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model


class Entry:
    """One model in one mode, timed in the rounds: its memory, data (B, T + 1) and step."""

    def __init__(self, pair, who, mode, model, cfg, device, device_type):
        self.pair, self.who, self.mode, self.model = pair, who, mode, model.to(device).train()
        compiled, dtype = MODES[mode]
        self.fn = common.compile_model(model) if compiled else model
        self.ctx = common.autocast(device_type, dtype)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.data = [common.random_tokens(cfg.batch_size, cfg.seg_len + 1, cfg.vocab, seed=i, device=device)
                     for i in range(4)]
        self.memory = model.init_memory(cfg.batch_size, device) if who == 'nanomem' else ()
        self.tokens, self.n, self.times = cfg.batch_size * cfg.seg_len, 0, []

    def step(self):
        chunk = self.data[self.n % len(self.data)]
        self.n += 1
        x, y = chunk[:, :-1], chunk[:, 1:]
        with self.ctx:
            if self.who == 'nanomem':
                _, loss, memory, _ = self.fn(x, self.memory, y)
                self.memory = common.train.detach_memory(memory)
            else:
                loss = self._authors_loss(x.t().contiguous(), y.t().contiguous())
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _authors_loss(self, x, y):
        """Their training loops' loss on time-major (T, B) data, as their train.py computes it."""
        if self.pair == 'infformer':                     # logits only with doc_final; + kl_m * KL (kl_m 1e-6)
            ret, _, _, kl = self.fn(x, y, *self.memory, doc_final=True)
            loss = ret[0] + (1e-6 * kl.float().mean() if kl is not None else 0.0)
        else:
            ret = self.fn(x, y, *self.memory)              # in training mode both return one list
            loss = ret[0].float().mean()
        self.memory = ret[2:] if self.pair == 'lamemo' else ret[1:]   # LaMemo: [loss, mem_loss] + mems
        return loss


def run(cfg, argv):
    device, device_type = common.setup(cfg.device)
    torch.manual_seed(0)
    entries = []
    for pair in ('xl', 'lamemo', 'infformer'):
        repo = getattr(cfg, f'{pair}_repo')
        if repo:
            module = load_authors(pair, repo, device)
            for mode in cfg.modes.split(','):            # each mode its own copy: compile caches per module
                entries += [Entry(pair, 'authors', mode, authors(pair, module, cfg), cfg, device, device_type),
                            Entry(pair, 'nanomem', mode, ours(pair, cfg), cfg, device, device_type)]
    if not entries:
        raise UserError("nothing to time: give --xl_repo, --lamemo_repo and/or --infformer_repo")
    common.run_rounds(entries, Entry.step, cfg.warmup, cfg.rounds, device_type, 'train')
    results = {}
    for e in entries:                                    # {pair: {who: {mode: ...}, 'ratio': {mode: ours / theirs}}}
        t = common.median(e.times)
        results.setdefault(e.pair, {}).setdefault(e.who, {})[e.mode] = {
            'tokens_per_s': e.tokens / t, 'step_s_median': t, 'step_s': e.times,
            'parameters': sum(p.numel() for p in e.model.parameters())}
    print(f"{'pair':<10} {'mode':<13} {'authors tok/s':>14} {'nanomem tok/s':>14} {'ratio':>6}   "
          f"parameters (authors / ours)")
    for pair, r in results.items():
        r['ratio'] = {m: r['nanomem'][m]['tokens_per_s'] / r['authors'][m]['tokens_per_s'] for m in r['nanomem']}
        for m, ratio in r['ratio'].items():
            theirs, mine = r['authors'][m], r['nanomem'][m]
            print(f"{pair:<10} {m:<13} {theirs['tokens_per_s']:>14,.0f} {mine['tokens_per_s']:>14,.0f} "
                  f"{ratio:>6.2f}   {theirs['parameters']:,} / {mine['parameters']:,}")
    size = {k: getattr(cfg, k) for k in ('vocab', 'n_layer', 'n_embd', 'n_head', 'd_head', 'd_inner', 'seg_len',
                                         'mem_len', 'n_basis', 'batch_size')}
    common.write_json(cfg.out, {'device': str(device), 'size': size, 'results': results,
                                'edits': {p: [(f, why) for _, f, ed in files for _, _, why in ed]
                                          for p, (_, files) in EDITS.items()}},
                      'bench/vs_authors.py', argv)
    return results


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    common.train.run_cli(lambda a: run(common.parse(a, VsAuthorsConfig), a), argv)


if __name__ == '__main__':
    main()
