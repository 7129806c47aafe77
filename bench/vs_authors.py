"""
nanomem against the authors' code at the same size: training tokens/s (forward + backward + AdamW, memory carried)
of model_xl.py, model_lamemo.py, model_infformer.py and model_infformer_gpt2.py next to the code their papers
released, interleaved round by round in one process, medians over the timed rounds.

    python bench/vs_authors.py --xl_repo=PATH --lamemo_repo=PATH --infformer_repo=PATH
    python bench/vs_authors.py --infformer_repo=PATH --vocab=50304 --out=bench/results/vs_authors_gpt2.json
    python bench/vs_authors.py --infformer_gpt2_repo=PATH --out=bench/results/vs_authors_infformer_gpt2.json

Their code is not in this repository. Point the flags at checkouts of (the commits we timed):
  --xl_repo         kimiyoung/transformer-xl 44781ed, pytorch/mem_transformer.py (attn_type 0)
  --lamemo_repo     thu-coai/LaMemo 911d1d1, pytorch/mem_transformer.py (attn_type 3, their default)
  --infformer_repo  deep-spin/infinite-former 6bf094c, sorting/mem_transformer.py with the flags of
                    sorting/run_sort_inftyformer.sh (LTM, unbounded memory, CNN mask, KL regulariser)
  --infformer_gpt2_repo  the same checkout, finetune_gpt2/src/transformers/models/gpt2/ (modeling_gpt2.py,
                    long_term_attention.py) with finetune_gpt2/infinite_memory_transformer/config.json's settings
Each needs a few edits to import and run on torch 2.x (and on a CPU); EDITS lists them with their reasons, and they
are made to the source text as it is loaded (the checkout is not changed). An edit whose text is not found is an
error: the checkout is another commit. Modules their files import but never use are stubbed (STUBS). Their GPT-2
is a file of transformers 4.5 (relative imports of its package): the names it imports come from the installed
transformers (5.x) where 5.x still has them, and PreTrainedModel is the few lines of 4.5 it uses (Transformers45Model).

Both models of a pair get the same size, memory and LTM settings: our Config is set to the constants the authors'
code fixes (for the ∞-former: 512 sample points, RBF widths {0.01, 0.05}, τ 0.75, ridge λ 1, σ² ≥ 1e-6, u and v
shared by the layers). Their weights are drawn N(0, 0.02) (LayerNorm gains 1): their own init lives in train.py.
The GPT-2 pair runs at bench/speed.py --suite=gpt2's size and memory (common.GPT2_DEMO_SIZE, gpt2_variant_table()),
their constants set to it (the LTM's segment of 512, the threshold of 2,048 tokens, M = 512: EDITS); their GPT-2 is
initialised as theirs (GPT-2's init, lm_head tied to wte) and its weights are copied into ours (GPT2_NAMES).
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
    infformer_gpt2_repo: str = ''  # a deep-spin/infinite-former checkout: finetune_gpt2/ against model_infformer_gpt2
    gpt2_overrides: str = ''       # field=integer,... over the GPT-2 pair's size and memory (e.g. n_layer=2,seg_len=32)
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
        gpt2_spec(self)                                  # a one-line error for a bad --gpt2_overrides


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
    'infformer_gpt2': ('finetune_gpt2/src/transformers/models/gpt2', [
        ('basis_functions', 'basis_functions.py', []),
        ('continuous_softmax', 'continuous_softmax.py', []),
        ('continuous_sparsemax', 'continuous_sparsemax.py', [NO_ANOMALY]),
        ('long_term_attention', 'long_term_attention.py', [
            ("self.device = 'cuda'", 'self.device = DEVICE', 'the device is hard-coded'),
            ('self.mem_threshold=2048', "self.mem_threshold=kwargs['mem_threshold']",
             "the memory threshold is fixed at GPT-2 small's 2,048 tokens: set to ours (ltm_reset_len)"),
            ('self.nb_samples=512', "self.nb_samples=kwargs['nb_samples']",
             "M is fixed at GPT-2 small's 512: set to ours (n_samples)")]),
        ('configuration_gpt2', 'configuration_gpt2.py', []),
        ('modeling_gpt2', 'modeling_gpt2.py', [
            ('length=512,\n', 'length=config.ltm_length,\n',
             "the LTM's segment is fixed at their --block_size 512: set to seg_len"),
            ('target_len=512,', 'target_len=config.ltm_length,', 'the same'),
            ('sticky_memories=config.sticky_memories,\n',
             'sticky_memories=config.sticky_memories, mem_threshold=config.mem_threshold, '
             'nb_samples=config.nb_samples,\n', "pass the two constants above from the config")]),
    ]),
}
# The GPT-2 pair's files import from their transformers 4.5 package (`from ...modeling_utils import ...`): they are
# loaded as modules of this package, whose other modules STUBS makes.
PACKAGES = {'infformer_gpt2': 'authors_transformers.models.gpt2'}


def _stub(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _unused(*args, **kwargs):
    raise NotImplementedError("stubbed by bench/vs_authors.py: not used by the timed configuration")


def _no_docs(*args, **kwargs):
    """transformers' docstring decorators: the docstrings are not needed (5.x's check them against 5.x's models)."""
    return lambda f: f


class Transformers45Model(torch.nn.Module):
    """What the authors' GPT-2 uses of transformers 4.5's PreTrainedModel, as 4.5 does it: init_weights applies
    _init_weights to every module, then ties the output layer to the input embedding; get_head_mask without a head
    mask. (5.x's PreTrainedModel initialises and ties through post_init and _tied_weights_keys, which a 4.5 model
    neither calls nor has, and has no get_head_mask.)"""

    def __init__(self, config, *inputs, **kwargs):
        super().__init__()
        self.config = config

    def init_weights(self):
        self.apply(self._init_weights)
        output = self.get_output_embeddings() if hasattr(self, 'get_output_embeddings') else None
        if output is not None:
            output.weight = getattr(self, self.base_model_prefix).get_input_embeddings().weight

    def get_head_mask(self, head_mask, num_hidden_layers):
        if head_mask is not None:
            raise NotImplementedError("stubbed by bench/vs_authors.py: no head mask")
        return [None] * num_hidden_layers

    @property
    def dtype(self):
        return next(self.parameters()).dtype


def _transformers_stubs(folder):
    """The modules of their transformers 4.5 package that the GPT-2 files import, from the installed transformers."""
    from transformers import PretrainedConfig, activations, modeling_outputs, pytorch_utils, utils
    top = PACKAGES['infformer_gpt2'].split('.')[0]
    outputs = ('BaseModelOutputWithPastAndCrossAttentions', 'CausalLMOutputWithCrossAttentions',
               'SequenceClassifierOutputWithPast')
    docs = ('add_code_sample_docstrings', 'add_start_docstrings', 'add_start_docstrings_to_model_forward',
            'replace_return_docstrings')
    return {
        top: _stub(top, __path__=[]), f'{top}.models': _stub(f'{top}.models', __path__=[]),
        f'{top}.models.gpt2': _stub(f'{top}.models.gpt2', __path__=[str(folder)]),
        f'{top}.activations': _stub(f'{top}.activations', ACT2FN=activations.ACT2FN),
        f'{top}.file_utils': _stub(f'{top}.file_utils', ModelOutput=utils.ModelOutput,
                                   **dict.fromkeys(docs, _no_docs)),
        f'{top}.modeling_outputs': _stub(f'{top}.modeling_outputs',
                                         **{n: getattr(modeling_outputs, n) for n in outputs}),
        f'{top}.modeling_utils': _stub(f'{top}.modeling_utils', Conv1D=pytorch_utils.Conv1D,
                                       PreTrainedModel=Transformers45Model, SequenceSummary=_unused,
                                       find_pruneable_heads_and_indices=_unused, prune_conv1d_layer=_unused),
        f'{top}.configuration_utils': _stub(f'{top}.configuration_utils', PretrainedConfig=PretrainedConfig),
        f'{top}.utils': _stub(f'{top}.utils', logging=utils.logging, __path__=[]),
        f'{top}.utils.model_parallel_utils': _stub(f'{top}.utils.model_parallel_utils', assert_device_map=_unused,
                                                   get_device_map=_unused),
        'entmax': _stub('entmax', Sparsemax=_unused, Entmax15=_unused, EntmaxBisect=_unused),
        'matplotlib': _stub('matplotlib'), 'matplotlib.pyplot': _stub('matplotlib.pyplot')}


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
    'infformer_gpt2': _transformers_stubs,
}
# Top-level names the three checkouts share (each has its own utils/proj_adaptive_softmax.py, ...): dropped from
# sys.modules before and after a load, so no pair imports another's.
SHARED = ('utils', 'proj_adaptive_softmax', 'log_uniform_sampler', 'mem_transformer', 'continuous_softmax',
          'long_term_attention', 'basis_functions', 'continuous_sparsemax')


def load_authors(pair, repo, device):
    """The authors' model module of `pair` from the checkout `repo`, with EDITS made to its files."""
    folder_name, files = EDITS[pair]
    package = PACKAGES.get(pair)
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
            name = f'{package}.{name}' if package else name
            module = types.ModuleType(name)
            module.__file__, module.DEVICE, module.__package__ = str(path), str(device), package
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


def gpt2_spec(cfg):
    """The GPT-2 pair's size and memory: bench/speed.py --suite=gpt2's infformer_gpt2, with --gpt2_overrides."""
    spec = {**common.GPT2_DEMO_SIZE, **common.gpt2_variant_table()['infformer_gpt2']}
    for key, value in common.override_items(cfg.gpt2_overrides):
        if key not in spec or isinstance(spec[key], bool) or not isinstance(spec[key], int):
            known = ', '.join(k for k, v in spec.items() if type(v) is int)
            raise ValueError(f"gpt2_overrides: {key!r} is not one of {known}")
        spec[key] = common.int_list(value, 'gpt2_overrides')[0]
    return spec


# Their parameter names -> ours: the GPT-2 part is named as theirs (Hugging Face's); the LTM's modules are renamed.
# Their proj_query is built but never read (the LTM reads GPT-2's query), so it has no counterpart.
GPT2_NAMES = {'long_term_attention.proj_key.': 'ltm.key_net.', 'long_term_attention.proj_value.': 'ltm.value_net.',
              'long_term_attention.attn_out.': 'ltm.o_net.', 'long_term_attention.mu.': 'ltm.mu_affine.',
              'long_term_attention.sigma.': 'ltm.sigma_affine.', 'long_term_attention.mask_net.': 'ltm.gate.'}


def copy_gpt2_weights(theirs, mine):
    """Their GPT-2 ∞-former's weights into ours (Conv1D weights, stored (in, out), transposed). -> names copied"""
    params = dict(mine.named_parameters())
    copied = []
    with torch.no_grad():
        for name, p in theirs.named_parameters():                  # lm_head.weight is wte's (tied): named once
            if '.proj_query.' in name:
                continue
            for old, new in GPT2_NAMES.items():
                name = name.replace(old, new)
            conv1d = name.endswith(('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight'))
            params[name].copy_(p.t() if conv1d else p)
            copied.append(name)
    return copied


def ours(pair, cfg):
    """Our model of the pair at cfg's size, with the constants the authors' code fixes."""
    if pair == 'infformer_gpt2':                          # our defaults are their GPT-2 code's constants
        model, _ = common.build(gpt2_spec(cfg))
        return model
    size = dict(vocab_size=cfg.vocab, n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head, d_head=cfg.d_head,
                d_inner=cfg.d_inner, seg_len=cfg.seg_len, mem_len=cfg.mem_len, untie_r=False)
    if pair == 'infformer':
        size.update(n_basis=cfg.n_basis, n_samples=512, basis_widths='0.01,0.05', tau=0.75, ridge_lambda=1.0,
                    sigma_sq_min=1e-6, sigma_0=0.05, kl_weight=1e-6, cnn_gate=True)
    model, _ = common.build({'model': pair}, **size)
    return model


def authors(pair, module, cfg):
    """The authors' MemTransformerLM of the pair at cfg's size (the GPT-2 pair: their GPT2LMHeadModel)."""
    if pair == 'infformer_gpt2':                          # finetune_gpt2/infinite_memory_transformer/config.json
        s = gpt2_spec(cfg)
        config = module.GPT2Config(
            vocab_size=s['vocab_size'], n_positions=s['n_positions'], n_ctx=s['n_positions'], n_embd=s['n_embd'],
            n_layer=s['n_layer'], n_head=s['n_head'], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            long_term_attention=True, long_term_attention_basis=s['n_basis'], long_term_attention_norm='softmax',
            continuous=True, infinite_memory=True, affines=True, mask=True, mask_type='cnn', mask_dropout=0,
            attn_drop=0.0, kl_regularizer=True, sigma_0=0.05, mu_0=-1, sticky_memories=s['sticky'],
            add_cross_attention=False,                    # a 4.5 PretrainedConfig default that 5.x no longer sets
            ltm_length=s['seg_len'], mem_threshold=s['ltm_reset_len'], nb_samples=s['n_samples'])   # EDITS' fields
        return module.GPT2LMHeadModel(config)
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
        seg_len, vocab = (cfg.seg_len, cfg.vocab) if pair != 'infformer_gpt2' else (
            gpt2_spec(cfg)['seg_len'], gpt2_spec(cfg)['vocab_size'])
        self.data = [common.random_tokens(cfg.batch_size, seg_len + 1, vocab, seed=i, device=device)
                     for i in range(4)]
        self.memory = model.init_memory(cfg.batch_size, device) if who == 'nanomem' else ()
        self.tokens, self.n, self.times = cfg.batch_size * seg_len, 0, []

    def step(self):
        chunk = self.data[self.n % len(self.data)]
        self.n += 1
        x, y = chunk[:, :-1], chunk[:, 1:]
        with self.ctx:
            if self.who == 'nanomem':
                _, loss, memory, _ = self.fn(x, self.memory, y)
                self.memory = common.train.detach_memory(memory)
            elif self.pair == 'infformer_gpt2':          # batch-first, labels shifted inside; + kl_m * KL (trainer.py)
                out, kl = self.fn(input_ids=x, labels=x)
                loss = out.loss + (1e-6 * kl.mean() if kl is not None else 0.0)
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
    for pair in ('xl', 'lamemo', 'infformer', 'infformer_gpt2'):
        repo = getattr(cfg, f'{pair}_repo')
        if repo:
            module = load_authors(pair, repo, device)
            for mode in cfg.modes.split(','):            # each mode its own copy: compile caches per module
                theirs, mine = authors(pair, module, cfg), ours(pair, cfg)
                if pair == 'infformer_gpt2':
                    copy_gpt2_weights(theirs, mine)
                entries += [Entry(pair, 'authors', mode, theirs, cfg, device, device_type),
                            Entry(pair, 'nanomem', mode, mine, cfg, device, device_type)]
    if not entries:
        raise UserError("nothing to time: give --xl_repo, --lamemo_repo, --infformer_repo and/or "
                        "--infformer_gpt2_repo")
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
    if cfg.infformer_gpt2_repo:
        size['gpt2'] = gpt2_spec(cfg)
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
