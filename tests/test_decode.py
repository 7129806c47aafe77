"""
The decode step that generate() runs at every token (each model file's Model.step, over its OpenSegment), for every
model: what a CUDA graph needs of it, checked on the CPU, and the captured step itself where a GPU is present.

A CUDA graph records the kernels of one call and replays them on the same memory, so the step must take the same
shapes at every token, never synchronise with the host, and read and write only buffers that stay where they are,
from one segment to the next. torch.compile with fullgraph=True, dynamic=False and error_on_recompile finds a
break or a changing shape on the CPU; the buffers' addresses are compared directly. Each model file's own tests
check that generate() picks forward()'s tokens; here the compiled and the captured step must pick generate()'s.
"""

import pytest
import torch
import torch._dynamo

import train
from _models import TINY_MODELS

# every model and the settings that change its step; seg_len 4 so that a few tokens cross several segments
SMALL = dict(n_layer=2, seg_len=4, init_std=0.5)
VARIANTS = {
    'xl': dict(TINY_MODELS['xl'], mem_len=6),
    'xl_same_length': dict(TINY_MODELS['xl'], mem_len=6, same_length=True, clamp_len=3, pre_lnorm=True),
    'xl_no_memory': dict(TINY_MODELS['xl'], mem_len=0),
    'lamemo': dict(TINY_MODELS['lamemo'], mem_len=6),
    'lamemo_short_memory': dict(TINY_MODELS['lamemo'], mem_len=3, pre_lnorm=True),
    'compressive': dict(TINY_MODELS['compressive'], mem_len=4, cmem_len=4),
    'compressive_most_used': dict(TINY_MODELS['compressive'], mem_len=4, cmem_len=4, compression='most_used'),
    'infini_linear': TINY_MODELS['infini'],
    'infini_delta': dict(TINY_MODELS['infini'], memory_update='delta'),
    'infformer': dict(TINY_MODELS['infformer'], mem_len=4, sticky=False),
    'infformer_sticky': dict(TINY_MODELS['infformer'], mem_len=4),
    'gpt2': TINY_MODELS['gpt2'],
    'infformer_gpt2': dict(TINY_MODELS['infformer_gpt2'], sticky=False),
    'infformer_gpt2_sticky': TINY_MODELS['infformer_gpt2'],
    'compressive_gpt2': TINY_MODELS['compressive_gpt2'],
    'compressive_gpt2_fifo': dict(TINY_MODELS['compressive_gpt2'], mem_len=4, cmem_len=4, compression='mean_pool'),
    'infini_gpt2_linear': TINY_MODELS['infini_gpt2'],
    'infini_gpt2_delta': dict(TINY_MODELS['infini_gpt2'], memory_update='delta'),
}


def build(name, device='cpu'):
    spec = dict(VARIANTS[name], **SMALL)
    module = train.import_model(spec.pop('model'))
    torch.manual_seed(0)
    return module.Model(module.Config(**spec)).to(device).eval()


def prompt_and_memory(model, prompt_len, device='cpu'):
    """A prompt of prompt_len tokens and the memory of 6 tokens before it (read by forward(), as sample.py does)."""
    g = torch.Generator().manual_seed(prompt_len)
    before, prompt = torch.randint(0, model.config.vocab_size, (2, 6 + prompt_len), generator=g).to(device).split(
        [6, prompt_len], dim=1)
    memory = model.init_memory(2, device)
    with torch.no_grad():
        for piece in before.split(model.config.seg_len, dim=1):
            _, _, memory, _ = model(piece, memory)
    return prompt, memory


@pytest.mark.parametrize('name', list(VARIANTS))
def test_step_compiles_once_as_one_graph(name):
    """Across 4 segment boundaries the single-token step is one graph (no break: no host sync, no Python branch on
    a value), compiled once (the same shapes and strides, no Python state that changes), and picks the same tokens."""
    model = build(name)
    prompt, memory = prompt_and_memory(model, 6)                  # a segment, then 2 tokens of the next
    expected = model.generate(prompt, 17, temperature=0.0, memory=memory)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    compiled = torch.compile(model.step, backend=backend, fullgraph=True, dynamic=False)
    plain = model.step
    # each single token through the step as a graph takes it (every slot), the prompt's pieces as decode() feeds them
    model.step = lambda tokens, seg, filled=None: (compiled(tokens.contiguous(), seg) if tokens.size(1) == 1
                                                   else plain(tokens, seg, filled))
    with torch._dynamo.config.patch(error_on_recompile=True):    # torch's own patch (see tests/test_torch_config.py)
        assert torch.equal(model.generate(prompt, 17, temperature=0.0, memory=memory), expected)
    assert len(graphs) == 1


@pytest.mark.parametrize('name', list(VARIANTS))
def test_segments_reuse_the_buffers_of_the_first(name):
    """Every segment after the first opens in the first one's OpenSegment, its tensors at the same addresses: the
    buffers a graph captured in one segment reads in the next (refill)."""
    model = build(name)
    prompt, memory = prompt_and_memory(model, 3)
    opened, open_segment = [], model.open_segment

    def recording(memory, tokens, seg=None):
        logits, seg = open_segment(memory, tokens, seg)
        opened.append((seg, [t.data_ptr() for t in tensors(seg)]))
        return logits, seg
    model.open_segment = recording
    model.generate(prompt, 15, temperature=0.0, memory=memory)
    assert len(opened) == 5                                       # 3 + 14 tokens fed (not the last made), by 4
    assert all(seg is opened[0][0] and ptrs == opened[0][1] for seg, ptrs in opened)


def tensors(x):
    if torch.is_tensor(x):
        return [x]
    items = vars(x).values() if hasattr(x, '__dataclass_fields__') else x if isinstance(x, (list, tuple)) else []
    return [t for item in items for t in tensors(item)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('prompt_len', [1, 6])
@pytest.mark.parametrize('name', list(VARIANTS))
def test_captured_step_picks_the_same_tokens(name, prompt_len, dtype):
    """generate(cuda_graph=True), the step recorded once and replayed across segments, equals the step run op by op,
    in float32 and under bf16 autocast."""
    model = build(name, 'cuda')
    prompt, memory = prompt_and_memory(model, prompt_len, 'cuda')
    with torch.autocast('cuda', dtype=dtype, enabled=dtype != torch.float32):
        plain = model.generate(prompt, 17, temperature=0.0, memory=memory)
        captured = model.generate(prompt, 17, temperature=0.0, memory=memory, cuda_graph=True)
    assert torch.equal(captured, plain)


def test_cuda_graph_off_cuda_is_a_clear_error():
    model = build('xl')
    with pytest.raises(ValueError, match='CUDA device'):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, cuda_graph=True)
