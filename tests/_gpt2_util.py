"""A tiny random GPT-2 in the Hugging Face hub format, for the tests of the GPT-2 forms (model_gpt2.py and the memory
forms built on it) and of pretrained.py: write_tiny_gpt2(dir) writes model.safetensors and config.json with
transformers' save_pretrained, as the hub's GPT-2 checkpoints are, and returns the GPT2LMHeadModel it wrote (in eval
mode) to compare with. transformers is a test-only dependency (requirements-test.txt)."""

from pathlib import Path

import pytest
import torch


def write_tiny_gpt2(dir, n_layer=2, n_head=2, n_embd=32, n_positions=64, seed=0, vocab_size=50257):
    """Write a random GPT-2 of this size to dir (created if missing); -> the transformers model, in eval mode.
    Its weights are random (N(0, 0.02), and the biases and LayerNorms too, so a transpose or a swapped bias shows)."""
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                                     n_layer=n_layer, n_head=n_head)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('bias') or '.ln_' in name:           # zeros and ones at init: make them random too
                p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(Path(dir), safe_serialization=True)
    return model.eval()
