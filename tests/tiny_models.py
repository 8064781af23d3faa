"""A tiny causal LM and character tokenizer built locally (nothing is downloaded)."""

from __future__ import annotations

import string
from pathlib import Path


def build_tiny_model(path: Path, seed: int = 0, n_positions: int = 1024) -> Path:
    """Save a 2-layer GPT-2 with a character-level tokenizer to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    chars = sorted(set(string.printable))
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>", pad_token="<eos>")
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(vocab), n_positions=n_positions, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(path)
    return path
