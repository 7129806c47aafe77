"""
OpenAI's GPT-2 weights for the GPT-2 forms (model_gpt2.py and the memory forms built on it), as nanoGPT's
--init_from=gpt2 does, from the Hugging Face hub format (model.safetensors + config.json):

    python train.py --model=gpt2 --init_from=gpt2 ...              # also gpt2-medium, gpt2-large, gpt2-xl
    python train.py --model=infformer_gpt2 --init_from=gpt2:DIR    # a directory holding model.safetensors, config.json
    python train.py --model=infformer_gpt2 --init_from=gpt2:out-gpt2-demo   # or a GPT-2 that train.py made (ckpt.pt)
    python pretrained.py export --out_dir=out-gpt2-demo --to=DIR  # ours in the hub format, for transformers' tools

A hub name is looked up in the local Hugging Face cache first, then downloaded where the network is. The names are
mapped here, with the safetensors package: transformers is never imported. config.json fixes the architecture
(GPT2_FIELDS); a flag that contradicts it is an error. HF's GPT-2 uses Conv1D, which stores a weight as (in, out):
our nn.Linear wants (out, in), so those four weights are transposed. Every GPT-2 tensor must be in the file and fit;
a memory form's own parameters (other names) stay at their init and are listed in the log.
A GPT-2 trained here (train.py --model=gpt2) is a starting point too: gpt2:OUT_DIR reads OUT_DIR/ckpt.pt, whose
parameter names are already the hub's, and export() writes it in the hub format (GPT2LMHeadModel.from_pretrained
reads it). Every failure is a UserError: one line, never a traceback.
"""

import dataclasses
import json
import re
import textwrap
from pathlib import Path

import torch

from configurator import UserError, available_models, import_model

HUB_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')
HUB_ORG = 'openai-community'        # the hub's home of OpenAI's GPT-2 (the bare names redirect there)
FILES = ('model.safetensors', 'config.json')
GPT2_FIELDS = ('vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_positions', 'layer_norm_epsilon')   # config.json's
CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')      # stored (in, out)
LAYER_TENSORS = ('ln_1.weight', 'ln_1.bias', 'attn.c_attn.weight', 'attn.c_attn.bias', 'attn.c_proj.weight',
                 'attn.c_proj.bias', 'ln_2.weight', 'ln_2.bias', 'mlp.c_fc.weight', 'mlp.c_fc.bias',
                 'mlp.c_proj.weight', 'mlp.c_proj.bias')
IGNORED = re.compile(r'.*\.attn\.(masked_)?bias$')   # the causal-mask buffers older HF checkpoints hold


def is_gpt2(init_from):
    """Does --init_from name GPT-2 weights (a hub name or gpt2:DIR)?"""
    return init_from in HUB_NAMES or init_from.startswith('gpt2:')


def check_init_from(init_from, others=('scratch', 'resume')):
    """TrainConfig's check of --init_from (ValueError: configurator makes it one line)."""
    if init_from in others or init_from in HUB_NAMES or (init_from.startswith('gpt2:') and init_from[5:]):
        return
    raise ValueError(f"init_from must be {', '.join(others)}, {', '.join(HUB_NAMES)} or gpt2:DIR, got {init_from!r}")


def gpt2_names(n_layer):
    """The GPT-2 part's parameter names, Hugging Face GPT2LMHeadModel's (lm_head.weight is tied to wte's)."""
    names = ['transformer.wte.weight', 'transformer.wpe.weight']
    names += [f'transformer.h.{i}.{t}' for i in range(n_layer) for t in LAYER_TENSORS]
    return names + ['transformer.ln_f.weight', 'transformer.ln_f.bias', 'lm_head.weight']


def check_gpt2_form(model_name, module):
    """Only a model whose class says gpt2_form = True has GPT-2's parameters to load into."""
    if getattr(module.Model, 'gpt2_form', False):
        return
    forms = sorted((n for n in available_models() if getattr(import_model(n).Model, 'gpt2_form', False)),
                   key=lambda n: (n != 'gpt2', n))                       # GPT-2 alone first, then its memory forms
    raise UserError(f"model {model_name} has no GPT-2 form; use --model={' or '.join(forms) or 'gpt2'}")


# -----------------------------------------------------------------------------------------------------------
# Where the files are


def locate(init_from):
    """The directory for --init_from: gpt2:DIR (the hub's files, or a train.py out_dir with ckpt.pt), or a hub name's
    in the Hugging Face cache (downloaded where the network is)."""
    if init_from.startswith('gpt2:'):
        directory = Path(init_from[len('gpt2:'):]).expanduser()
        missing = [f for f in FILES if not (directory / f).is_file()]
        if not missing or (directory / 'ckpt.pt').is_file():
            return directory
        raise UserError(f"--init_from={init_from}: {directory} has no {' or '.join(missing)} (a GPT-2 in the "
                        f"Hugging Face format: model.safetensors and config.json), nor a ckpt.pt (the out_dir of "
                        f"train.py --model=gpt2)")
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(f"--init_from={init_from} needs the huggingface_hub package (pip install huggingface_hub), "
                        f"or the files in a directory: --init_from=gpt2:DIR") from None
    repo = f'{HUB_ORG}/{init_from}'
    for repo_id, local_only in ((repo, True), (init_from, True), (repo, False)):   # the cache, then the hub
        try:
            directory = Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=list(FILES),
                                                               local_files_only=local_only))
        except Exception:                          # not cached, offline, unreachable: the next way, then one line
            continue
        if all((directory / f).is_file() for f in FILES):
            return directory
    raise UserError(f"--init_from={init_from}: not in the Hugging Face cache and the hub cannot be reached; "
                    f"download {' and '.join(FILES)} from https://huggingface.co/{repo} into a directory DIR and "
                    f"use --init_from=gpt2:DIR (`hf download {repo} {' '.join(FILES)} --local-dir DIR` fetches them "
                    f"where the network is)")


# -----------------------------------------------------------------------------------------------------------
# The architecture (config.json) and the weights (model.safetensors), or both from a checkpoint of ours


def read_gpt2_config(directory):
    """{field: value} of GPT2_FIELDS from directory/config.json."""
    path = Path(directory) / 'config.json'
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    missing = [k for k in GPT2_FIELDS if k not in hf] if isinstance(hf, dict) else list(GPT2_FIELDS)
    if missing:
        raise UserError(f"{path} is not a GPT-2 config.json: it has no {', '.join(missing)}")
    return {k: hf[k] for k in GPT2_FIELDS}


def read_safetensors(path):
    """The tensors of a model.safetensors, named as GPT2LMHeadModel names them, Conv1D weights (in, out)."""
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:
        raise UserError("--init_from=gpt2... needs the safetensors package (pip install safetensors)") from None
    try:
        found = load_file(path)
    except (OSError, SafetensorError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    # GPT2LMHeadModel's files name its tensors transformer.*, GPT2Model's (the hub's gpt2) without the prefix
    return {(k if k.startswith(('transformer.', 'lm_head.')) else 'transformer.' + k): v
            for k, v in found.items() if not IGNORED.match(k)}


def read_checkpoint(path):
    """A GPT-2 that train.py made (--model=gpt2), as the hub holds one: -> (its model_config, its tensors named and
    laid out as in a model.safetensors, the tokenizer it was trained on: its data's meta, for data.tokenizer.from_meta,
    None for GPT-2's BPE). Our parameter names are the hub's; nn.Linear's (out, in) weights are stored transposed, as
    Conv1D's (in, out)."""
    from runs import load_checkpoint                 # here: runs.py needs nothing of this module
    ckpt = load_checkpoint(path)                     # a damaged file or one not ours: one line
    if ckpt['model_name'] != 'gpt2':
        raise UserError(f"{path} holds a {ckpt['model_name']!r} model, not GPT-2 alone (--model=gpt2): only a GPT-2 "
                        f"is a starting point in the hub format")
    tensors = {k: v.t().contiguous() if k.endswith(CONV1D) else v for k, v in ckpt['model'].items()}
    return dict(ckpt['model_config']), tensors, ckpt.get('tokenizer')


def tokenizer_name(meta):
    """'gpt2', 'bytes', ... : the name of the tokenizer a data meta (or None: GPT-2's BPE) describes."""
    return (meta or {}).get('tokenizer', 'gpt2')


def read_gpt2(directory):
    """GPT-2's architecture and weights from a directory of locate(): -> ({GPT2_FIELDS}, tensors, the file read,
    the tokenizer they read: None (GPT-2's BPE) for the hub's files, a checkpoint's own data meta for ours)"""
    directory = Path(directory)
    if all((directory / f).is_file() for f in FILES):
        path = directory / 'model.safetensors'
        return read_gpt2_config(directory), read_safetensors(path), path, None
    path = directory / 'ckpt.pt'
    config, tensors, meta = read_checkpoint(path)
    return {k: config[k] for k in GPT2_FIELDS}, tensors, path, meta


def configure(model_cfg, given, hf, source):
    """model_cfg with GPT-2's architecture hf ({GPT2_FIELDS}, read from source); a flag the user gave (given) that
    contradicts it is an error. A seg_len the user did not give is cut to n_positions where it is longer."""
    hf = dict(hf)
    if 'seg_len' not in given and isinstance(hf['n_positions'], int) and model_cfg.seg_len > hf['n_positions']:
        hf['seg_len'] = hf['n_positions']
    for k, value in hf.items():
        if k in given and k != 'seg_len' and getattr(model_cfg, k) != value:
            raise UserError(f"--{k}={getattr(model_cfg, k)} contradicts {source} ({k}={value}): the pretrained "
                            f"weights fix it")
    try:
        return dataclasses.replace(model_cfg, **hf)
    except (ValueError, TypeError) as e:
        raise UserError(f"with {source}'s architecture: {e}") from None


def load_weights(model, found, path):
    """Copy GPT-2's tensors found (read from path, laid out as the hub's) into model's GPT-2 part.
    -> (tensors loaded, names left at init)"""
    found = dict(found)
    params = dict(model.named_parameters(remove_duplicate=False))
    wanted = gpt2_names(model.config.n_layer)
    head = found.pop('lm_head.weight', None)                   # tied to wte: files often leave it out
    wte = found.get('transformer.wte.weight')
    if head is not None and wte is not None and not torch.equal(head, wte):
        raise UserError(f"{path}: lm_head.weight differs from transformer.wte.weight; GPT-2 ties them")
    found['lm_head.weight'] = wte
    missing = [k for k in wanted if k not in params]
    if missing:
        raise UserError(f"the model has no parameter {missing[0]}: it is not a GPT-2 form")
    absent = [k for k in wanted if found.get(k) is None]
    if absent:
        more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
        raise UserError(f"{path} has no tensor {absent[0]}{more}: not a GPT-2 of this config")
    with torch.no_grad():
        for k in wanted[:-1]:                                  # lm_head.weight is wte's
            tensor = found[k].t() if k.endswith(CONV1D) else found[k]
            if tensor.shape != params[k].shape:
                stored = f" (stored as Conv1D {tuple(found[k].shape)})" if k.endswith(CONV1D) else ""
                raise UserError(f"{path}: {k} has shape {tuple(tensor.shape)}{stored}, the model's is "
                                f"{tuple(params[k].shape)}")
            params[k].copy_(tensor)
    gpt2 = set(wanted)
    left = [k for k in params if k not in gpt2]
    return len(wanted), left


def init_from_gpt2(init_from, model_name, module, model_cfg, given, tokenizer='gpt2', data_dir=None):
    """The model of --init_from=gpt2... : config.json's architecture, GPT-2's weights, the rest at init. tokenizer:
    the data's (data_dir's), which must be the one the weights were trained on (the hub's: GPT-2's BPE; a checkpoint
    of ours: its own, e.g. bytes); None: any. -> (model_cfg, model, one line for the log, the tokenizer the weights
    read: a data meta for data.tokenizer.from_meta, None for GPT-2's BPE)"""
    check_gpt2_form(model_name, module)
    hf, tensors, path, meta = read_gpt2(locate(init_from))
    trained_on = tokenizer_name(meta)
    if tokenizer is not None and tokenizer != trained_on:
        read = "GPT-2 BPE" if trained_on == 'gpt2' else trained_on
        raise UserError(f"--init_from={init_from} reads {read} tokens, but {data_dir or 'the data'} holds "
                        f"{tokenizer} tokens")
    model_cfg = configure(model_cfg, given, hf, path.parent / 'config.json' if path.suffix == '.safetensors' else path)
    model = module.Model(model_cfg)
    n, left = load_weights(model, tensors, path)
    left = list(dict.fromkeys(re.sub(r'\.h\.\d+\.', '.h.*.', k) for k in left))   # one name for every layer's
    note = f"; left at init: {', '.join(left)}" if left else ""
    return model_cfg, model, f"loaded GPT-2 weights from {path} ({n} tensors){note}", meta


# -----------------------------------------------------------------------------------------------------------
# Ours in the hub format: python pretrained.py export --out_dir=OUT --to=DIR


@dataclasses.dataclass
class ExportConfig:
    """Write a GPT-2 that train.py made (--model=gpt2) in the Hugging Face hub format (config.json,
    model.safetensors), which transformers' GPT2LMHeadModel.from_pretrained reads, and --init_from=gpt2:DIR."""
    out_dir: str = 'out-gpt2-demo'     # a train.py --model=gpt2 run
    checkpoint: str = 'ckpt.pt'        # which of its checkpoints: ckpt.pt (the last) or best.pt
    to: str = ''                       # the directory to write config.json and model.safetensors into
    overwrite: bool = False            # replace the files of an earlier export in `to`


def hub_config(model_config):
    """config.json for transformers' GPT2LMHeadModel: GPT2Config's names, and what our model_gpt2.py fixes (tanh
    GELU, tied embeddings, 1/sqrt(d_head) attention scale, GPT-2's end-of-text token)."""
    return {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2',
            **{k: model_config[k] for k in GPT2_FIELDS}, 'n_inner': None, 'activation_function': 'gelu_new',
            'resid_pdrop': model_config['dropout'], 'embd_pdrop': model_config['dropout'],
            'attn_pdrop': model_config['dropout'], 'initializer_range': model_config['init_std'],
            'scale_attn_weights': True, 'tie_word_embeddings': True, 'bos_token_id': 50256, 'eos_token_id': 50256}


def export(out_dir, to, checkpoint='ckpt.pt', overwrite=False):
    """Write out_dir/checkpoint (a GPT-2 of train.py) to `to` as config.json + model.safetensors, each file written
    whole or not at all. -> the two paths"""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise UserError("export needs the safetensors package (pip install safetensors)") from None
    if not to:
        raise UserError("export needs --to=DIR, the directory to write config.json and model.safetensors into")
    config, tensors, meta = read_checkpoint(Path(out_dir) / checkpoint)
    tokenizer = tokenizer_name(meta)
    if tokenizer != 'gpt2':
        raise UserError(f"{Path(out_dir) / checkpoint} was trained on {tokenizer} tokens, not GPT-2's BPE: the hub "
                        f"format's GPT-2 reads BPE")
    tensors = {k: v.contiguous() for k, v in tensors.items() if k in set(gpt2_names(config['n_layer'])[:-1])}
    directory = Path(to).expanduser()
    paths = [directory / f for f in FILES]
    there = [p.name for p in paths if p.exists()]
    if there and not overwrite:
        raise UserError(f"{directory} already holds {' and '.join(there)}; --overwrite=True replaces them")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path in paths:
            tmp = path.with_name(path.name + '.tmp')
            if path.suffix == '.safetensors':        # lm_head.weight is wte's: left out, as save_pretrained does
                save_file(tensors, tmp, metadata={'format': 'pt'})
            else:
                tmp.write_text(json.dumps(hub_config(config), indent=2) + '\n')
            tmp.replace(path)
    except OSError as e:
        raise UserError(f"cannot write {directory}: {e.strerror or e}") from None
    return paths


VERBS = {'export': ExportConfig}      # verb -> the dataclass of its flags, whose docstring says what it does


def verbs_help():
    """--help: the verbs and what each does."""
    lines = ["usage: python pretrained.py VERB [--name=value ...]", '',
             "GPT-2's weights come in through train.py --init_from=gpt2 (or gpt2:DIR); this script's verbs:"]
    for verb, cls in VERBS.items():
        lines += textwrap.wrap(' '.join(cls.__doc__.split()), 116, initial_indent=f"  {verb:<8}  ",
                               subsequent_indent=' ' * 12)
    return '\n'.join(lines + ['', "python pretrained.py VERB --help lists the verb's flags."])


def main(argv=None):
    """python pretrained.py export --out_dir=OUT --to=DIR; --help lists the verbs, export --help its flags."""
    import sys

    import configurator

    def go(argv):
        if argv and argv[0] in configurator.HELP_FLAGS:
            print(verbs_help())
            sys.exit(0)
        if not argv or argv[0] not in VERBS:
            raise UserError("usage: python pretrained.py export --out_dir=OUT_DIR --to=DIR (--help lists the verbs)")
        cfg = configurator.parse_args(argv[1:], ExportConfig, allow_model_fields=False, command=argv[0])[0]
        for path in export(cfg.out_dir, cfg.to, cfg.checkpoint, cfg.overwrite):
            print(f"wrote {path}")
        print(f"transformers: GPT2LMHeadModel.from_pretrained({str(Path(cfg.to).expanduser())!r}); nanomem: "
              f"--init_from=gpt2:{cfg.to}")
    configurator.run_cli(go, sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    main()
