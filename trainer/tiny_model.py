"""A tiny causal LM with random weights and a character tokenizer, built locally: nothing is
downloaded, so a first judge can be trained end to end offline on CPU (``stepq tiny-model``),
and the tests and benchmarks build theirs the same way."""

from __future__ import annotations

import string
from pathlib import Path


def build_tiny_model(
    path: Path, seed: int = 0, n_positions: int = 1024, n_embd: int = 32, n_layer: int = 2, n_head: int = 2
) -> Path:
    """Save a small GPT-2 (2 layers of width 32 unless told) with a character-level
    tokenizer to ``path``."""
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
        vocab_size=len(vocab),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def build_tiny_llama(
    path: Path, seed: int = 0, max_positions: int = 2048, hidden_size: int = 128, num_layers: int = 2
) -> Path:
    """Save a 2-layer Llama (head dimension 64: vLLM's CPU kernels need it) with a
    character-level tokenizer, a BOS token and a chat template, to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = sorted(set(string.printable))
    vocab = {"<eos>": 0, "<unk>": 1, "<bos>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", unk_token="<unk>", pad_token="<eos>", bos_token="<bos>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=hidden_size // 64,
        head_dim=64,
        max_position_embeddings=max_positions,
        bos_token_id=2,
        eos_token_id=0,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).float().save_pretrained(path)
    return path
