"""
train.py's ways to compile: --compile_blocks=True (each layer block compiled in place, identical blocks sharing
one graph) and --compile_mode=reduce-overhead (the compiled step replayed as CUDA graphs, each optimizer step one
generation: torch.compiler.cudagraph_mark_step_begin() first, the carried memory copied out of the graphs' buffers).
CPU only: the CUDA graphs themselves need a GPU (bench/gpu_size.sh); here the step's own logic must leave training
bit-identical, and the compiled blocks must equal the eager model.
"""
import sys
from pathlib import Path

import pytest
import torch

import train
from _train_util import assert_identical, assert_one_line_error, flags, load, make_pattern_dataset, run_main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))
import common  # noqa: E402

SIZE = dict(vocab_size=128, n_layer=3, n_embd=32, n_head=2, d_head=16, d_inner=64, seg_len=8)
VARIANTS = common.variant_table(mem_len=8, cmem_len=4, n_basis=8)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return make_pattern_dataset(tmp_path_factory.mktemp('data'), n_train=2000, n_eval=200)


def segments(model, step, n=3, batch_size=2, seed=0):
    """n training segments through step(idx, memory, targets) with the memory carried and detached, each loss
    backpropagated. -> the losses, the gradients of every parameter, the final memory"""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, SIZE['vocab_size'], (batch_size, n * SIZE['seg_len'] + 1), generator=g)
    memory, losses, T = model.init_memory(batch_size, 'cpu'), [], SIZE['seg_len']
    for s in range(n):
        _, loss, memory, _ = step(idx[:, s * T:(s + 1) * T], memory, idx[:, s * T + 1:(s + 1) * T + 1])
        loss.backward()
        memory = train.detach_memory(memory)
        losses.append(loss.detach())
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return torch.stack(losses), grads, memory


@pytest.mark.parametrize('name', list(VARIANTS))
def test_compile_blocks_traces_one_block_for_every_layer(name):
    """Every model: its 3 blocks over 3 segments (the memory empty, then filling) are traced once, as one graph, with
    no recompile; with dynamo's eager backend the losses, gradients and memory are the eager model's, bit for bit."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    eager, _ = common.build(VARIANTS[name], **SIZE)
    model, _ = common.build(VARIANTS[name], **SIZE)
    assert train.compile_model(model, blocks=True, backend='eager') is model      # in place: the same state_dict keys
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = segments(model, model)
    assert counters['stats']['unique_graphs'] == 1 and counters['frames']['ok'] == 1, dict(counters['frames'])
    expected = segments(eager, eager)
    assert_identical(got[0], expected[0], 'losses')
    assert_identical(got[1], expected[1], 'grads')
    assert_identical(train.memory_to_dict(got[2]), train.memory_to_dict(expected[2]), 'memory')
    assert model.state_dict().keys() == eager.state_dict().keys()


@pytest.mark.parametrize('name', list(VARIANTS))
def test_whole_model_compiles_once_over_training_steps(name):
    """Three training steps, the memory carried from init_memory's: one graph, no recompile (the no-memory baseline
    once compiled twice: its empty memory came back from forward in other strides than init_memory's)."""
    torch._dynamo.reset()
    model, _ = common.build(VARIANTS[name], **SIZE)
    compiled = train.compile_model(model, backend='eager')
    with torch._dynamo.config.patch(error_on_recompile=True):
        segments(model, compiled)


def test_inductor_compiled_blocks_equal_eager_within_fp32_rounding():
    """Transformer-XL's blocks compiled by inductor with mode reduce-overhead (on a CPU inductor skips the CUDA graphs
    and compiles as by default: the CPU path of --compile_mode=reduce-overhead --compile_blocks=True): losses, every
    gradient and the memory within fp32 rounding of eager over 2 segments, one graph for both layers."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    size = dict(SIZE, n_layer=2)
    eager, _ = common.build(VARIANTS['xl'], **size)
    model, _ = common.build(VARIANTS['xl'], **size)
    compiled = train.compile_model(model, 'reduce-overhead', blocks=True)
    losses, grads, memory = segments(model, compiled, n=2)
    assert counters['stats']['unique_graphs'] == 1
    losses_e, grads_e, memory_e = segments(eager, eager, n=2)
    torch.testing.assert_close(losses, losses_e, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_e.keys()
    for n in grads_e:
        torch.testing.assert_close(grads[n], grads_e[n], rtol=1e-4, atol=1e-5, msg=n)
    torch.testing.assert_close(memory.mem, memory_e.mem, rtol=1e-5, atol=1e-5)


def comparable(ckpt):
    return {k: ckpt[k] for k in ('model', 'optimizer', 'memory', 'step', 'data_position', 'best_val_loss')}


def test_cuda_graph_step_logic_leaves_training_bit_identical(data_dir, tmp_path, monkeypatch):
    """--compile_mode=reduce-overhead's own part of the step, run eagerly (compile_model leaves the model as it is):
    one cudagraph_mark_step_begin() per optimizer step and the carried memory copied; with micro-batches and BPTT over
    2 segments the weights, optimizer state and memories equal a plain run's bit for bit."""
    common_flags = dict(batch_size=2, gradient_accumulation_steps=2, bptt_segments=2, max_iters=3, eval_interval=3)
    train.train(flags(data_dir, tmp_path / 'plain', **common_flags))
    marks, copies = [], []
    detach = train.detach_memory
    monkeypatch.setattr(train, 'compile_model', lambda model, mode, blocks: model)
    monkeypatch.setattr(torch.compiler, 'cudagraph_mark_step_begin', lambda: marks.append(1))
    monkeypatch.setattr(train, 'detach_memory', lambda memory, copy=False: copies.append(copy) or detach(memory, copy))
    train.train(flags(data_dir, tmp_path / 'graphs', compile=True, compile_mode='reduce-overhead', **common_flags))
    assert len(marks) == 3 and copies == [True] * 3 * 2                      # steps; steps x micro-batches
    assert_identical(comparable(load(tmp_path / 'graphs' / 'ckpt.pt')),
                     comparable(load(tmp_path / 'plain' / 'ckpt.pt')))


@pytest.mark.parametrize('bad, fragments', [
    (['--compile_mode=fast'], ['compile_mode must be one of', 'reduce-overhead']),
    (['--compile=False', '--compile_mode=reduce-overhead'], ['need --compile=True']),
    (['--compile=False', '--compile_blocks=True'], ['need --compile=True']),
])
def test_bad_compile_flags_give_one_line_errors(bad, fragments, data_dir, tmp_path, capsys):
    code, _, err = run_main([f for f in flags(data_dir, tmp_path / 'out') if not f.startswith('--compile=')] + bad,
                            capsys)
    assert code == 2
    assert_one_line_error(err, *fragments)


def test_compile_flags_parse_and_ask_for_compile():
    """A compile flag given without --compile (None: on for CUDA) turns compiling on, on a CPU too."""
    cfg = train.parse_args(['--compile_mode=reduce-overhead', '--compile_blocks=True'])[0]
    assert (cfg.compile, cfg.compile_mode, cfg.compile_blocks) == (None, 'reduce-overhead', True)
    assert train.cuda_graphs(cfg) is False                                   # resolved by train(): not yet
    cfg.compile = True
    assert train.cuda_graphs(cfg) is True
    for mode, graphs in (('max-autotune', True), ('max-autotune-no-cudagraphs', False), ('default', False)):
        cfg.compile_mode = mode
        assert train.cuda_graphs(cfg) is graphs, mode


def test_compile_blocks_needs_layers():
    with pytest.raises(train.UserError, match='model.layers'):
        train.compile_model(torch.nn.Linear(2, 2), blocks=True)
