"""The context suite's settings: the optional ``context`` config section with its defaults.

Absent keys take the defaults below; ``segments`` defaults to the in-context check's k
(``causal.context_segments``), which the stream step has already checked fits the twins' window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plantbench import layout
from plantbench.errors import ConfigError

DEFAULTS: dict[str, Any] = {
    "ablations": 32,  # ContextCite: random ablation masks per context (keep probability 1/2)
    "lasso_alpha": 0.01,  # ContextCite: the Lasso's L1 weight (scikit-learn's alpha)
    "shapley_permutations": 16,  # TokenSHAP: Monte Carlo permutations per context
    "tracllm_top": 2,  # TracLLM: nodes kept at each level of the binary search
    "tracllm_loo_weight": 2.0,  # TracLLM: w_loo of max(w_loo * LOO, STC)
    "at2_ridge": 1e-4,  # AT2: ridge weight (x the mean diagonal of the normal equations)
    "attntrace_top_k": 5,  # AttnTrace: a segment's score sums its K highest-scoring tokens
    "attntrace_subsamples": 8,  # AttnTrace: random context subsamples besides the full context
    "attntrace_keep": 0.5,  # AttnTrace: keep probability of a segment in a subsample
    "lds_masks": 32,  # LDS: held-out random ablations per context
    "top_k": [1, 2, 3],  # BCS / Util / RmI at these k (by default those below context.segments)
    "drop_k": [1, 3, 5],  # Drop@k (capped at the segment count)
    "rbo": [0.5, 0.8],  # CAC: rank-biased overlap persistences
    "bootstrap": 1000,  # resamples of facts for the 95% intervals
    "batch": 16,  # ablations per forward pass
    "lattice": 64,  # run all 2^k ablations up front when 2^k is at most this
}


@dataclass(frozen=True)
class Settings:
    segments: int
    methods: tuple[str, ...]
    ablations: int
    lasso_alpha: float
    shapley_permutations: int
    tracllm_top: int
    tracllm_loo_weight: float
    at2_ridge: float
    attntrace_top_k: int
    attntrace_subsamples: int
    attntrace_keep: float
    lds_masks: int
    top_k: tuple[int, ...]
    drop_k: tuple[int, ...]
    rbo: tuple[float, ...]
    bootstrap: int
    batch: int
    lattice: int
    seed: int


def settings(cfg: dict[str, Any]) -> Settings:
    """The suite's settings for this config (defaults filled in)."""
    from plantbench.suites.context.methods import registry

    sec = {**DEFAULTS, **cfg.get("context", {})}
    k = int(sec.get("segments", layout.context_segments(cfg)))
    if "top_k" not in cfg.get("context", {}):  # the default k's that a context this size has
        sec["top_k"] = [x for x in DEFAULTS["top_k"] if x < k]
    if any(int(x) >= k for x in sec["top_k"]):
        raise ConfigError(
            f"config key 'context.top_k' = {list(sec['top_k'])}: every k must be below the "
            f"{k} segments of a context (context.segments)"
        )
    return Settings(
        segments=k,
        methods=tuple(sec.get("methods", registry.names())),
        ablations=int(sec["ablations"]),
        lasso_alpha=float(sec["lasso_alpha"]),
        shapley_permutations=int(sec["shapley_permutations"]),
        tracllm_top=int(sec["tracllm_top"]),
        tracllm_loo_weight=float(sec["tracllm_loo_weight"]),
        at2_ridge=float(sec["at2_ridge"]),
        attntrace_top_k=int(sec["attntrace_top_k"]),
        attntrace_subsamples=int(sec["attntrace_subsamples"]),
        attntrace_keep=float(sec["attntrace_keep"]),
        lds_masks=int(sec["lds_masks"]),
        top_k=tuple(int(x) for x in sec["top_k"]),
        drop_k=tuple(int(x) for x in sec["drop_k"]),
        rbo=tuple(float(x) for x in sec["rbo"]),
        bootstrap=int(sec["bootstrap"]),
        batch=int(sec["batch"]),
        lattice=int(sec["lattice"]),
        seed=int(cfg["seed"]),
    )


def settings_hash(st: Settings) -> str:
    """The hash the suite's artifacts record as their config (every setting, defaults filled)."""
    from dataclasses import asdict

    from plantbench.config import config_hash

    return config_hash({"context": asdict(st)})  # canonical JSON writes tuples as lists
