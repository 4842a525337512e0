"""A seeded, randomly initialised twin-shaped model for the suites' tests (no training)."""

from __future__ import annotations

import torch

from plantbench.data import tokenizer
from plantbench.model.modeling import build_model, llama_config


def tiny_llama(*, n_layer: int, vocab: int, window: int, seed: int) -> torch.nn.Module:
    """A 32-wide Llama with the project's special token ids, in eval mode."""
    shape = {
        "n_embd": 32,
        "intermediate": 64,
        "n_layer": n_layer,
        "n_head": 2,
        "tie_embeddings": True,
        "rope_theta": 10000.0,
    }
    conf = llama_config(
        shape,
        vocab_size=vocab,
        window=window,
        bos=tokenizer.BOS_ID,
        eos=tokenizer.EOS_ID,
        pad=tokenizer.PAD_ID,
    )
    return build_model(conf, seed=seed).eval()
