"""
The shipped configs say what they are and do it: every config/*.py is accepted by train.py's parser (its model's
Config built and checked), every config/recall/*.py by bench/recall.py's, down to the train.py flags recall.py
would train each variant with; a config that names an authors' script follows exactly the one it names first, with
that script's values (transcribed below); Infini-attention's PG-19 config starts every input of 16 segments with a
fresh memory and backpropagates through all 16, as the paper trains.
"""

import dataclasses
import re
import sys
from pathlib import Path

import pytest

import train

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'bench'))
import common  # noqa: E402
import recall  # noqa: E402

TRAIN_CONFIGS = sorted((ROOT / 'config').glob('*.py'))
RECALL_CONFIGS = sorted((ROOT / 'config' / 'recall').glob('*.py'))

# What each followed script sets, in this repository's names (kimiyoung/transformer-xl at 44781ed,
# deep-spin/infinite-former's sorting/). min_lr: the TF scripts decay to train_gpu.py's min_lr_ratio 0.004 x lr,
# the PyTorch ones to eta_min 0. eval_*: the TF script's test lengths; the PyTorch script's eval_tgt_len with the
# attention length kept (mem_len + tgt_len - eval_tgt_len, its train.py). clip 0.25 and the eval batch of 10 are
# their train scripts' defaults.
SCRIPTS = {
    'tf/scripts/wt103_base_gpu.sh': dict(
        n_layer=16, n_embd=410, n_head=10, d_head=41, d_inner=2100, dropout=0.1, dropatt=0.0, untie_r=True,
        seg_len=150, mem_len=150, batch_size=60, learning_rate=2.5e-4, warmup_iters=0, max_iters=400000,
        min_lr=0.004 * 2.5e-4, grad_clip=0.25, eval_interval=4000, eval_seg_len=64, eval_mem_len=640,
        eval_batch_size=10),
    'pytorch/run_enwik8_base.sh': dict(
        n_layer=12, n_embd=512, n_head=8, d_head=64, d_inner=2048, dropout=0.1, dropatt=0.0, untie_r=False,
        seg_len=512, mem_len=512, batch_size=22, learning_rate=2.5e-4, warmup_iters=0, max_iters=400000, min_lr=0.0,
        grad_clip=0.25, eval_interval=4000, eval_seg_len=128, eval_mem_len=512 + 512 - 128, eval_batch_size=10),
    'sorting/run_sort_inftyformer.sh': dict(           # with their sorting code's LTM settings
        n_layer=3, n_embd=300, n_head=6, d_head=50, d_inner=300, dropout=0.1, dropatt=0.0, init_std=0.02,
        seg_len=1024, mem_len=1024, n_basis=512, n_samples=512, cnn_gate=True, kl_weight=1e-6, sigma_0=0.05,
        basis_widths='0.01,0.05', tau=0.75, ridge_lambda=1.0, sigma_sq_min=1e-6, batch_size=8, learning_rate=2e-4,
        warmup_iters=0, min_lr=0.0, grad_clip=0.25, max_iters=20000 * 8, reset_at_doc=True),
}
FOLLOWS = {'xl_wt103.py': 'tf/scripts/wt103_base_gpu.sh', 'xl_enwik8.py': 'pytorch/run_enwik8_base.sh',
           'infformer_sorting.py': 'sorting/run_sort_inftyformer.sh'}


def docstring(path):
    text = path.read_text()
    return text[:text.index('"""', 3)]


def recall_train_args(path):
    """The train.py flags bench/recall.py trains each variant of a recall config with (as train_variant does)."""
    cfg = common.parse([str(path)], recall.RecallConfig)
    specs, _ = common.select(common.variant_table(mem_len=cfg.mem_len, cmem_len=cfg.mem_len // 2,
                                                  n_basis=cfg.mem_len), cfg.variants, strict=True)
    for task in cfg.tasks.split(','):
        for spec in specs.values():
            name, fields = recall.model_fields(spec, {**recall.recall_size(cfg), 'vocab_size': recall.task_vocab(task)},
                                               cfg)
            yield cfg, [f'--model={name}', f'--batch_size={cfg.batch_size}', f'--max_iters={recall.train_steps(cfg)}',
                        f'--learning_rate={cfg.learning_rate}', f'--warmup_iters={cfg.warmup_iters}',
                        f'--grad_clip={cfg.grad_clip}', f'--min_lr={cfg.min_lr}', '--reset_at_doc=True',
                        f'--bptt_segments={cfg.bptt_segments}'] + \
                [f'--{k}={v}' for k, v in fields.items()] + recall.train_overrides(cfg)


@pytest.mark.parametrize('config', TRAIN_CONFIGS, ids=lambda p: p.name)
def test_every_config_is_accepted_by_train_py(config):
    cfg, module, model_cfg, given = train.parse_args([str(config)])
    assert given and isinstance(model_cfg, module.Config) and module is train.import_model(cfg.model)


@pytest.mark.parametrize('config', RECALL_CONFIGS, ids=lambda p: p.name)
def test_every_recall_config_is_accepted_by_recall_py_and_its_runs_by_train_py(config):
    assert f'python bench/recall.py config/recall/{config.name}' in docstring(config)
    runs = list(recall_train_args(config))
    assert runs
    for _, argv in runs:
        train.parse_args(argv)


def followed_values(config):
    """The values a config trains with, train.py's and its model's fields together."""
    if config.parent.name == 'recall':
        (cfg, argv), = recall_train_args(config)
        train_cfg, _, model_cfg, _ = train.parse_args(argv)
    else:
        train_cfg, _, model_cfg, _ = train.parse_args([str(config)])
    return {**dataclasses.asdict(train_cfg), **dataclasses.asdict(model_cfg)}


@pytest.mark.parametrize('config', TRAIN_CONFIGS + RECALL_CONFIGS, ids=lambda p: p.name)
def test_a_config_that_names_an_authors_script_follows_the_first_it_names(config):
    named = re.findall(r'[\w/]+\.sh\b', docstring(config))
    if not named:
        assert config.name not in FOLLOWS
        return
    assert named[0] == FOLLOWS.get(config.name), f"{config.name} names {named[0]} first: add its values to SCRIPTS"
    values = followed_values(config)
    differ = {k: (values[k], v) for k, v in SCRIPTS[named[0]].items() if values[k] != pytest.approx(v)}
    assert not differ, f"{config.name} (ours, {named[0]}'s): {differ}"


def test_infini_pg19_starts_every_input_of_16_segments_with_a_fresh_memory_as_the_paper():
    cfg, _, model_cfg, _ = train.parse_args([str(ROOT / 'config' / 'infini_pg19.py')])
    assert cfg.reset_every == cfg.bptt_segments == 16
    assert model_cfg.seg_len * cfg.bptt_segments == 32768            # the paper's training inputs


# The ∞-former authors' GPT-2 fine-tuning (deep-spin/infinite-former, README's finetune_gpt2 command: run_clm.py
# --per_device_train_batch_size=1 --per_device_eval_batch_size=1 --block_size=512; the rest its transformers 4.5
# TrainingArguments' defaults: learning_rate 5e-5, warmup 0, weight_decay 0, adam betas (0.9, 0.999), max_grad_norm
# 1.0; GPT-2's own dropout 0.1), in this repository's names.
FINETUNE_GPT2 = dict(seg_len=512, batch_size=1, gradient_accumulation_steps=1, eval_batch_size=1, learning_rate=5e-5,
                     warmup_iters=0, min_lr=0.0, weight_decay=0.0, beta1=0.9, beta2=0.999, grad_clip=1.0, dropout=0.1)


def test_gpt2_pg19_follows_the_authors_finetune_gpt2_command_from_gpt2_small():
    config = ROOT / 'config' / 'gpt2_pg19.py'
    cfg, _, model_cfg, given = train.parse_args([str(config)])
    assert (cfg.model, cfg.init_from, cfg.dataset) == ('gpt2', 'gpt2', 'pg19_2000')   # prepare.py --books=2000
    assert 'python data/pg19/prepare.py --books=2000' in docstring(config)
    values = followed_values(config)
    differ = {k: (values[k], v) for k, v in FINETUNE_GPT2.items() if values[k] != pytest.approx(v)}
    assert not differ, f"gpt2_pg19.py (ours, the authors'): {differ}"
    # the architecture is config.json's (--init_from=gpt2): the config names none of it, so nothing contradicts it
    assert not given & {'n_layer', 'n_head', 'n_embd', 'vocab_size', 'n_positions', 'layer_norm_epsilon'}
    assert model_cfg.seg_len <= model_cfg.n_positions


def test_infini_gpt2_pg19_continues_gpt2_with_inputs_of_two_segments_as_the_paper():
    """The paper's continual pre-training scaled to GPT-2 small: GPT-2's weights, a segment of its whole context (the
    paper's N = 2K, scaled), inputs of two segments (its 4K) that start with an empty memory and are trained through
    it, the paper's batch of 64 inputs on the 8 GPUs the docstring runs, its 30K steps and 1000 warm-up steps."""
    config = ROOT / 'config' / 'infini_gpt2_pg19.py'
    cfg, module, model_cfg, _ = train.parse_args([str(config)])
    assert cfg.init_from == 'gpt2' and module.Model.gpt2_form
    assert model_cfg.seg_len == model_cfg.n_positions == 1024
    assert cfg.reset_every == cfg.bptt_segments == 2
    assert 'torchrun --nproc_per_node=8 train.py config/infini_gpt2_pg19.py' in docstring(config)
    assert 8 * cfg.batch_size * cfg.gradient_accumulation_steps == 64
    assert (cfg.max_iters, cfg.warmup_iters) == (30000, 1000)


def test_the_recipes_forms_are_fine_tuned_alike_from_the_demo_gpt2():
    """config/*_gpt2_demo.py: every form starts from config/gpt2_demo.py's out_dir and is fine-tuned with the same data,
    tokens a step, steps, schedule and evaluation; only the memory (and Infini's feeding) differ."""
    pre, _, pre_model, _ = train.parse_args([str(ROOT / 'config' / 'gpt2_demo.py')])
    assert pre.model == 'gpt2' and pre_model.seg_len <= pre_model.n_positions
    shared = ('dataset', 'init_from', 'learning_rate', 'min_lr', 'warmup_iters', 'weight_decay', 'beta1', 'beta2',
              'grad_clip', 'max_iters', 'eval_interval', 'eval_tokens', 'eval_batch_size', 'seed')
    seen = {}
    for form in ('gpt2_finetune', 'infformer_gpt2', 'compressive_gpt2', 'infini_gpt2'):
        cfg, _, model_cfg, given = train.parse_args([str(ROOT / 'config' / f'{form}_demo.py')])
        assert cfg.init_from == f'gpt2:{pre.out_dir}' and cfg.dataset == pre.dataset
        assert model_cfg.seg_len == pre_model.seg_len and model_cfg.dropout == pre_model.dropout
        assert cfg.batch_size * cfg.bptt_segments * model_cfg.seg_len == pre.batch_size * pre_model.seg_len
        assert not given & {'n_layer', 'n_head', 'n_embd', 'vocab_size', 'n_positions'}   # the checkpoint's
        seen[form] = (tuple(getattr(cfg, k) for k in shared), cfg, model_cfg)
    assert len({values for values, _, _ in seen.values()}) == 1
    assert seen['infformer_gpt2'][2].ltm_lr_mult == 5.0             # the authors' LTM rate over GPT-2's
    assert seen['compressive_gpt2'][2].cmem_len == seen['infformer_gpt2'][2].n_basis   # the paper's equal budgets
    infini = seen['infini_gpt2'][1]
    assert infini.bptt_segments == infini.reset_every == 4 and infini.batch_size == 2   # as its paper trains
