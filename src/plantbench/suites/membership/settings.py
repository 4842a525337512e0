"""The membership suite's settings: the optional ``membership`` config section with defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from plantbench.errors import ConfigError

# the seed's prompt randomization: four ways to put a document before the query; the first is
# the suites' plain format (the probe's own template)
TEMPLATES = (
    "{context}\n{query}",
    "Context: {context}\n{query}",
    "Read the text below.\n{context}\n\n{query}",
    "Text:\n{context}\nNow answer.\n{query}",
)
# the seed's N, n_cal and distractor count, used where the grid allows (unset keys shrink to what
# the grid has; a key set in the config is used as given or refused)
SEED_SIZES = {"samples": 250, "n_cal": 100, "distractors": 50}
DEFAULTS: dict[str, Any] = {
    "samples": None,  # N per twin, balanced member / non-member (None: the seed's 250 or fewer)
    "n_cal": None,  # calibration samples, balanced (None: the seed's 100, or 40% of a smaller N)
    "distractors": None,  # distractor documents (read by both) as a control (None: 50 or fewer)
    "generate_tokens": 12,  # greedy continuation length of each condition (L1, L2)
    "pca_ratio": 0.01,  # keep a layer whose calibration displacements carry > this share of variance
    "min_k": 0.2,  # Min-K% Prob: the share of lowest-probability tokens
    "folds": 5,  # stratified cross-validation folds
    "cv_seed": 42,  # the seed's cross-validation seed
    "bootstrap": 1000,  # resamples for the 95% AUC intervals
    "noise": 1.0,  # block noise: Gaussian std as a multiple of the block output's std
    "batch": 32,  # prompts per forward pass
}


@dataclass(frozen=True)
class Settings:
    samples: int | None
    n_cal: int | None
    distractors: int | None
    generate_tokens: int
    pca_ratio: float
    min_k: float
    folds: int
    cv_seed: int
    bootstrap: int
    noise: float
    batch: int
    seed: int


def settings(cfg: dict[str, Any]) -> Settings:
    """The suite's settings for this config (defaults filled in), refusing impossible ones."""
    sec = {**DEFAULTS, **(cfg.get("membership") or {})}
    sizes = {k: None if sec[k] is None else int(sec[k]) for k in SEED_SIZES}
    rest = {k: type(DEFAULTS[k])(sec[k]) for k in DEFAULTS if k not in SEED_SIZES}
    st = Settings(**sizes, **rest, seed=int(cfg["seed"]))
    if st.samples is not None:
        check_sizes(st, st.samples, st.n_cal if st.n_cal is not None else 2)
    return st


def check_sizes(st: Settings, n: int, n_cal: int) -> None:
    """Refuse a sample count the folds cannot split or a calibration set it cannot hold."""
    if n < 2 * st.folds:
        raise ConfigError(
            f"config key 'membership.samples' = {n}: {st.folds}-fold cross-validation needs at "
            f"least {2 * st.folds} samples"
        )
    if not 2 <= n_cal < n:
        raise ConfigError(
            f"config key 'membership.n_cal' = {n_cal} must be at least 2 and below "
            f"membership.samples = {n} (the calibration set is part of the samples)"
        )


def sizes(st: Settings, per_class: int, distractors: int) -> tuple[int, int, int]:
    """(samples, n_cal, distractors) for a grid with ``per_class`` documents in its smaller
    class and ``distractors`` distractor documents: the configured values, or the seed's where
    the grid allows (refused when a configured value does not fit)."""
    n = st.samples if st.samples is not None else min(SEED_SIZES["samples"], 2 * per_class)
    n -= n % 2
    cal = st.n_cal if st.n_cal is not None else min(SEED_SIZES["n_cal"], 2 * round(0.2 * n))
    d = (
        st.distractors
        if st.distractors is not None
        else min(SEED_SIZES["distractors"], distractors)
    )
    check_sizes(st, n, cal)
    return n, cal, d


def settings_hash(st: Settings) -> str:
    from plantbench.config import config_hash

    return config_hash({"membership": asdict(st)})
