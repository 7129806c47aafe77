"""Datasets for nanomem: the GPT-2 tokenizer and token shards (see data/README.md)."""
