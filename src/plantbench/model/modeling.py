"""The Llama-style model both twins share (transformers' LlamaForCausalLM), and the device every
step runs it on (:func:`compute_device`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from plantbench import layout
from plantbench.errors import ArtifactError, ConfigError

if TYPE_CHECKING:  # transformers' Llama import costs seconds: only the functions that need it pay
    from transformers import LlamaConfig, LlamaForCausalLM


def llama_config(
    model_cfg: dict[str, Any],
    vocab_size: int,
    window: int,
    *,
    bos: int,
    eos: int,
    pad: int,
    attn: str = "sdpa",
) -> LlamaConfig:
    """LlamaConfig from the ``model`` config section. ``attn``: 'sdpa' to train, 'eager' (math
    kernel) for per-example gradients. ``vocab_size``: the tokenizer's; ``model.vocab_size``
    (optional, at least as large) pads the embedding and the head to that many rows."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=model_rows(model_cfg, vocab_size),
        hidden_size=model_cfg["n_embd"],
        intermediate_size=model_cfg["intermediate"],
        num_hidden_layers=model_cfg["n_layer"],
        num_attention_heads=model_cfg["n_head"],
        num_key_value_heads=model_cfg["n_head"],
        max_position_embeddings=window,
        tie_word_embeddings=model_cfg["tie_embeddings"],
        rope_theta=float(model_cfg["rope_theta"]),
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        attn_implementation=attn,
    )


def model_rows(model_cfg: dict[str, Any], vocab_size: int) -> int:
    """Rows of the embedding and the head: ``model.vocab_size`` when set, else ``vocab_size``."""
    rows = int(model_cfg.get("vocab_size") or vocab_size)
    if rows < vocab_size:
        raise ConfigError(
            f"model.vocab_size = {rows} is smaller than the tokenizer's {vocab_size} tokens; "
            "raise it or leave it out (the model then takes the tokenizer's size)"
        )
    return rows


DEVICE_ENV = "PLANTBENCH_DEVICE"  # 'cpu' keeps a GPU job's model on the CPU; 'cuda' demands a GPU


def compute_device() -> torch.device:
    """Where a step runs its model: the job's GPU when it has one (Slurm's ``--gpus`` makes it the
    first visible device), else the CPU. ``PLANTBENCH_DEVICE=cpu`` forces the CPU,
    ``PLANTBENCH_DEVICE=cuda`` refuses to run without a GPU (no silent CPU fallback on a GPU
    partition)."""
    want = os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{DEVICE_ENV}={want!r}: expected auto, cpu or cuda")
    if want == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if want == "cuda":
        raise ConfigError(f"{DEVICE_ENV}=cuda but torch sees no GPU (CUDA_VISIBLE_DEVICES, driver)")
    return torch.device("cpu")


def device_of(model: torch.nn.Module) -> torch.device:
    """The device a model's weights are on (where its inputs must go)."""
    return next(model.parameters()).device


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array, from any device (a no-op copy-free view on the CPU)."""
    return t.detach().cpu().numpy()


def build_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """A freshly initialised model; the same seed gives the same weights on any machine."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def load_model(
    path: str | Path,
    *,
    attn: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> LlamaForCausalLM:
    """Load a checkpoint folder saved with ``save_pretrained``, in eval mode, onto ``device``
    (default :func:`compute_device`: the job's GPU when it has one)."""
    from transformers import LlamaForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ArtifactError(
            f"checkpoint '{path}' is missing or incomplete; rerun the pretrain step"
        )
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=dtype)
    model.to(compute_device() if device is None else torch.device(device))
    model.eval()
    return model


def block_linear_names(model: torch.nn.Module) -> list[str]:
    """Names of every nn.Linear inside the transformer blocks (not the embedding or head):
    the linears :data:`plantbench.layout.BLOCK_LINEARS` names, in every block (checked)."""
    names = [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}"
    ]
    kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
    if kinds != sorted(layout.BLOCK_LINEARS) or len(names) % len(layout.BLOCK_LINEARS):
        raise ArtifactError(
            f"the model's block linears are {', '.join(kinds)}, not plantbench.layout's "
            f"{', '.join(layout.BLOCK_LINEARS)} in every block; attribution, the plan and the "
            "benchmarks count those"
        )
    return names
