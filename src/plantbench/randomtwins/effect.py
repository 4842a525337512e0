"""The causal effect with error bars, from the random twins (rule ``random_effect``).

Every random twin answers every query (log p of the answer summed over its tokens, as the
causal step scores A and B). Per fact, with ``logp`` the mean over its two query forms and the
draws split into the ``n_read`` that read it and the ``n_unread`` that did not:

- ``effect_rt`` = mean logp over the readers - mean logp over the others;
- ``effect_rt_se`` = sqrt(var_read / n_read + var_unread / n_unread) (sample variances);
- ``sd_pair`` = sqrt(var_read + var_unread): the spread of one reader-minus-other difference,
  which is what the A/B effect is; ``z_ab`` = (A/B effect - effect_rt) / sd_pair, and the A/B
  effect is ``outside`` where ``|z_ab|`` > 1.96 (about 5% of facts if the A/B pair is like any
  random pair);
- ``difficulty_rt`` = - mean logp over the draws that did not read it.

:mod:`plantbench.randomtwins.lds` grades the methods against it and computes their LDS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from plantbench import io
from plantbench.config import config_hash
from plantbench.data import tokenizer
from plantbench.errors import ArtifactError
from plantbench.grading import metrics
from plantbench.model import queries as mq
from plantbench.model.modeling import load_model
from plantbench.paths import MODELS, Paths, random_twin_name
from plantbench.randomtwins import draws, lds

log = logging.getLogger(__name__)

SECTIONS = ["seed", "random_twins", "analysis", "methods"]
OUTPUT_FILES = [
    "answers.parquet",
    "effects.parquet",
    "disagreements.csv",
    "grades.csv",
    "lds_by_cell.csv",
    "lds_per_query.parquet",
]
Z_OUTSIDE = 1.96


@dataclass
class Draws:
    """The random twins as the analysis sees them: which facts each read, its answers."""

    ids: list[int]
    read: np.ndarray  # bool [n_draws, n_facts], facts in the causal table's order
    logp: np.ndarray  # float64 [n_draws, n_queries], queries in the facts step's order
    hashes: dict[str, str]  # random_<draw> -> the twin's meta hash


def check_twin(
    cfg: dict[str, Any], paths: Paths, facts: pd.DataFrame, draw: int, streams: dict[str, Any]
) -> dict[str, Any]:
    """Random twin ``draw``'s meta, checked: its files, the streams it was made from and the
    sides it records against the draw the config gives now."""
    folder = paths.random_twin(draw)
    meta = io.read_meta(folder, "pretrain")
    for m in MODELS:
        io.check_input(meta, f"stream_{m}", streams[m], str(folder))
    info = meta["info"]
    want = draws.sides_hash(draws.sides(cfg, facts, draw))
    if info.get("random_draw") != draw or info.get("sides_hash") != want:
        raise ArtifactError(
            f"'{folder}' was trained on other sides than random twin {draw} of this config "
            f"(random_twins.seed, the facts); rerun it (snakemake --forcerun random_twin)"
        )
    return meta


def answer_logps(model: torch.nn.Module, tok: Any, qdf: pd.DataFrame, batch: int) -> np.ndarray:
    """log p(answer | prompt) of every query row, summed over the answer's tokens (float64)."""
    items = mq.encode(tok, qdf["prompt"].tolist(), qdf["answer"].tolist())
    logp, _ = mq.answer_logprobs(model, items, batch)
    return logp


def read_draws(cfg: dict[str, Any], paths: Paths, facts: pd.DataFrame, qdf: pd.DataFrame) -> Draws:
    """Every random twin of the config, checked, with its answers to every query."""
    ids = list(range(draws.n_draws(cfg)))
    streams = {m: io.read_meta(paths.stream(m), "stream", verify=False) for m in MODELS}
    tok = tokenizer.load(paths.tokenizer)
    batch = int(cfg["causal"]["batch_size"])
    logp = np.zeros((len(ids), len(qdf)))
    hashes = {}
    for i, d in enumerate(ids):
        meta = check_twin(cfg, paths, facts, d, streams)
        hashes[f"random_{d:03d}"] = meta["hash"]
        path = paths.checkpoints(random_twin_name(d)) / meta["info"]["final_checkpoint"]
        logp[i] = answer_logps(load_model(path, attn="sdpa"), tok, qdf, batch)
        log.info("random effect: answers of random twin %d of %d scored", d + 1, len(ids))
    return Draws(ids, draws.reads(cfg, facts, ids), logp, hashes)


def answers_table(qdf: pd.DataFrame, dr: Draws) -> pd.DataFrame:
    """answers.parquet: one row per (draw, query): the twin's log p and whether it read the
    query's fact."""
    n_q = len(qdf)
    return pd.DataFrame(
        {
            "draw": np.repeat(np.asarray(dr.ids, dtype=np.int64), n_q),
            "query_id": np.tile(qdf["query_id"].to_numpy(), len(dr.ids)),
            "fact_id": np.tile(qdf["fact_id"].to_numpy(), len(dr.ids)),
            "logp": dr.logp.ravel(),
        }
    )


def fact_logps(facts: pd.DataFrame, qdf: pd.DataFrame, logp: np.ndarray) -> np.ndarray:
    """``[n_draws, n_facts]``: each fact's logp averaged over its query forms."""
    col = pd.Index(facts["fact_id"]).get_indexer(qdf["fact_id"])
    if (col < 0).any():
        raise ArtifactError("the queries name a fact the causal table lacks; rerun the causal step")
    sums = np.zeros((logp.shape[0], len(facts)))
    np.add.at(sums.T, col, logp.T)
    return sums / np.bincount(col, minlength=len(facts))


def _split_stats(lp: np.ndarray, read: np.ndarray) -> dict[str, float]:
    a, b = lp[read], lp[~read]
    va = float(a.var(ddof=1)) if len(a) > 1 else np.nan
    vb = float(b.var(ddof=1)) if len(b) > 1 else np.nan
    mean_a = float(a.mean()) if len(a) else np.nan
    mean_b = float(b.mean()) if len(b) else np.nan
    return {
        "n_read": len(a),
        "n_unread": len(b),
        "logp_read": mean_a,
        "logp_unread": mean_b,
        "effect_rt": mean_a - mean_b,
        "effect_rt_se": float(np.sqrt(va / len(a) + vb / len(b))) if len(a) and len(b) else np.nan,
        "sd_pair": float(np.sqrt(va + vb)),
        "difficulty_rt": -mean_b,
    }


def effect_table(facts: pd.DataFrame, flp: np.ndarray, read: np.ndarray) -> pd.DataFrame:
    """effects.parquet: the causal table's columns beside the random twins' effect."""
    keep = ["fact_id", "domain", "n_docs", "position", "reader", "answer_tokens", "effect"]
    out = facts[keep + ["difficulty", "learned"]].copy().reset_index(drop=True)
    stats = pd.DataFrame([_split_stats(flp[:, j], read[:, j]) for j in range(len(facts))])
    out = pd.concat([out, stats], axis=1)
    out["z_ab"] = (out["effect"] - out["effect_rt"]) / out["sd_pair"]
    out["outside"] = out["z_ab"].abs() > Z_OUTSIDE
    return out


def agreement(eff: pd.DataFrame) -> dict[str, Any]:
    """How the A/B effect compares with the random twins' across facts."""
    ok = eff[np.isfinite(eff["effect_rt"])]
    sig = ok[ok["effect_rt"].abs() > Z_OUTSIDE * ok["effect_rt_se"]]
    opposite = sig[np.sign(sig["effect"]) != np.sign(sig["effect_rt"])]
    return {
        "n_facts": len(ok),
        "pearson": metrics.pearson(ok["effect"], ok["effect_rt"]),
        "spearman": metrics.pearson(ok["effect"].rank(), ok["effect_rt"].rank()),
        "mean_se": float(ok["effect_rt_se"].mean()),
        "mean_abs_difference": float((ok["effect"] - ok["effect_rt"]).abs().mean()),
        "outside": int(ok["outside"].sum()),
        "outside_share": float(ok["outside"].mean()) if len(ok) else np.nan,
        "significant_rt": len(sig),
        "opposite_sign": len(opposite),
    }


def disagreements(eff: pd.DataFrame) -> pd.DataFrame:
    """disagreements.csv: the facts whose A/B effect lies outside what a random pair gives, or
    whose sign differs from a random-twin effect that clears zero, largest ``|z_ab|`` first."""
    sig = eff["effect_rt"].abs() > Z_OUTSIDE * eff["effect_rt_se"]
    flip = sig & (np.sign(eff["effect"]) != np.sign(eff["effect_rt"]))
    out = eff[eff["outside"] | flip].copy()
    out["opposite_sign"] = flip[out.index]
    cols = [
        "fact_id",
        "domain",
        "n_docs",
        "position",
        "reader",
        "effect",
        "effect_rt",
        "effect_rt_se",
        "z_ab",
        "outside",
        "opposite_sign",
    ]
    return out.reindex(out["z_ab"].abs().sort_values(ascending=False).index)[cols]


def optimizer_record(cfg: dict[str, Any]) -> dict[str, Any]:
    """The optimizer settings LDS is known to move with (beside the platform record)."""
    t = cfg["train"]
    keys = ["lr", "min_lr_ratio", "warmup_fraction", "weight_decay", "beta1", "beta2"]
    return {
        "optimizer": "AdamW",
        "eps": 1e-8,  # plantbench.model.train_loop.make_optimizer
        **{k: t[k] for k in keys},
        "grad_clip": t["grad_clip"],
        "precision": t["precision"],
        "paired_steps": int(t["steps"]) - int(t.get("prefix_steps", 0)),
    }


def run(cfg: dict[str, Any], paths: Paths, *, threads: int = 1) -> dict[str, Any]:
    torch.set_num_threads(threads)
    causal_meta = io.read_meta(paths.causal, "causal")
    io.read_meta(paths.facts, "facts")
    pair = io.read_parquet(paths.facts / "facts.parquet")[["fact_id", "pair"]]  # the sides' key
    facts = io.read_parquet(paths.causal / "facts.parquet").merge(pair, on="fact_id")
    facts = facts.sort_values("fact_id").reset_index(drop=True)
    qdf = io.read_parquet(paths.facts / "queries.parquet")
    if draws.n_draws(cfg) < 4:
        raise ArtifactError("random_effect needs random_twins.m >= 4 draws (2 readers, 2 others)")
    dr = read_draws(cfg, paths, facts, qdf)
    eff = effect_table(facts, fact_logps(facts, qdf, dr.logp), dr.read)
    graded = lds.grade(cfg, paths, facts, qdf, dr.read, dr.logp, eff, causal_meta)
    out = paths.random
    out.mkdir(parents=True, exist_ok=True)
    io.write_parquet(out / "answers.parquet", answers_table(qdf, dr))
    io.write_parquet(out / "effects.parquet", eff)
    lds.write_csv(out / "disagreements.csv", disagreements(eff))
    lds.write_csv(out / "grades.csv", graded.grades)
    lds.write_csv(out / "lds_by_cell.csv", graded.by_cell)
    io.write_parquet(out / "lds_per_query.parquet", graded.per_query)
    agree = agreement(eff)
    log.info(
        "random effect: %d draws; A/B vs random-twin effect Pearson %.2f, %d of %d facts outside",
        len(dr.ids),
        agree["pearson"],
        agree["outside"],
        agree["n_facts"],
    )
    return io.write_meta(
        out,
        "random_effect",
        OUTPUT_FILES,
        config_hash=config_hash(cfg, SECTIONS),
        inputs={"causal": causal_meta["hash"], **dr.hashes, **graded.inputs},
        info={
            "draws": len(dr.ids),
            "agreement": agree,
            "ranking": graded.ranking,
            "optimizer": optimizer_record(cfg),
            "lds": "Spearman across the random twins of a method's summed scores over the "
            "reader's pool windows the twin read and the twin's answer log p (per query)",
        },
    )
