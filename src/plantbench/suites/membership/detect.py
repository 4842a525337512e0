"""One twin's pass of the membership suite: CRM's features, probes, baselines and controls.

For every sample of this twin (``membership/samples``), under its final checkpoint:

- L1: the cosine distance between the text-encoder embeddings (``features.encoder``) of the
  greedy continuations with and without the document;
- L2: the per-step KL(P_c || P_0) along the with-context continuation, as five statistics
  (mean, max, min, std, last step);
- L3: :class:`~plantbench.suites.membership.probe.LatentShift` fitted on the calibration samples;
- the likelihood baselines (:mod:`.likelihood`) on the document alone.

Then CRM-LR and CRM-XGB (L1 + L2 + L3), the baselines, the ablations (without L1 + L2; L1 + L2
only; PC1 only; supervised only; one layer; mean LTS; the raw last-layer hidden state), the
controls (shuffled labels; the other three prompt templates; Gaussian noise in the CRM-selected
blocks vs as many random blocks), AUC per layer, per cell and for learned vs unlearned members,
and the distractors under the probe fitted on all samples. Outputs in ``membership/<model>/``
(documented in results/README.md); ``probe.json`` is what ``plantbench serve`` loads.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from plantbench import artifacts, io
from plantbench.data import tokenizer
from plantbench.model.modeling import load_model
from plantbench.paths import Paths
from plantbench.rng import rng
from plantbench.suites.membership import likelihood
from plantbench.suites.membership.probe import LatentShift, auc_interval, classifier, oof_scores
from plantbench.suites.membership.settings import TEMPLATES, Settings, settings, settings_hash
from plantbench.suites.membership.trace import (
    Conditions,
    block_noise,
    document_stats,
    run_conditions,
)

log = logging.getLogger(__name__)
FILES = ["features.parquet", "aucs.parquet", "layers.parquet", "cells.parquet", "probe.json"]
L2_STATS = ("kl_mean", "kl_max", "kl_min", "kl_std", "kl_last")
AUC_COLUMNS = ["model", "group", "name", "n", "auc", "lo", "hi"]


@dataclass
class Features:
    l1: np.ndarray  # [n]
    l2: np.ndarray  # [n, 5]
    d: np.ndarray  # [n, L + 1, dim] displacements
    hc: np.ndarray  # [n, L + 1, dim]

    def split(self, n: int) -> tuple[Features, Features]:
        """The first ``n`` rows and the rest."""
        head = Features(self.l1[:n], self.l2[:n], self.d[:n], self.hc[:n])
        return head, Features(self.l1[n:], self.l2[n:], self.d[n:], self.hc[n:])

    def crm(self, shift: LatentShift, surface: bool = True) -> np.ndarray:
        lts = shift.transform(self.d)
        return np.column_stack([self.l1, self.l2, lts]) if surface else lts


def l2_stats(kl: np.ndarray) -> np.ndarray:
    """The five statistics of each row's per-step KL (NaN steps past a continuation's end
    skipped; a continuation of no step gets zeros)."""
    out = np.zeros((len(kl), len(L2_STATS)))
    for i, row in enumerate(kl):
        v = row[np.isfinite(row)]
        if len(v):
            out[i] = (v.mean(), v.max(), v.min(), v.std(), v[-1])
    return out


def surface_distance(encoder: Any, a: list[str], b: list[str]) -> np.ndarray:
    """Cosine distance of the encoder embeddings of paired texts (L1)."""
    from plantbench.attribution.encoder import encode_texts

    e = encode_texts(encoder, [*a, *b], what="continuations").astype(np.float64)
    x, y = e[: len(a)], e[len(a) :]
    num = (x * y).sum(1)
    den = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    return 1.0 - np.divide(num, den, out=np.ones_like(num), where=den > 0)


def features_of(c: Conditions, encoder: Any) -> Features:
    return Features(surface_distance(encoder, c.yc, c.y0), l2_stats(c.kl), c.hc - c.h0, c.hc)


def likelihood_scores(
    model: Any, tok: Any, texts: list[str], st: Settings, window: int
) -> np.ndarray:
    """``[n, 4]``: PPL, Zlib, Min-K%, Min-K%++ scores of each document alone."""
    ids = [x[: window - 1] for x in tokenizer.encode_batch(tok, texts)]
    rows = []
    for s in range(0, len(ids), st.batch):
        for (lp, mu, sigma), text in zip(
            document_stats(model, ids[s : s + st.batch]), texts[s : s + st.batch], strict=True
        ):
            rows.append(
                (
                    likelihood.ppl_score(lp),
                    likelihood.zlib_score(lp, text),
                    likelihood.min_k_score(lp, st.min_k),
                    likelihood.min_k_pp_score(lp, mu, sigma, st.min_k),
                )
            )
    return np.array(rows)


class Grader:
    """AUC rows of one twin: every feature set under cross-validation, every score directly."""

    def __init__(self, model: str, y: np.ndarray, st: Settings):
        self.model, self.y, self.st, self.rows = model, y.astype(int), st, []

    def score(self, group: str, name: str, s: np.ndarray, y: np.ndarray | None = None) -> float:
        y = self.y if y is None else y
        a, lo, hi = auc_interval(
            y, s, self.st.bootstrap, self.st.seed, f"{self.model}/{group}/{name}"
        )
        self.rows.append((self.model, group, name, len(y), a, lo, hi))
        return a

    def cv(
        self, group: str, name: str, x: np.ndarray, kind: str = "lr", y: np.ndarray | None = None
    ) -> np.ndarray:
        y = self.y if y is None else y
        p = oof_scores(x, y, kind, self.st.folds, self.st.cv_seed)
        self.score(group, name, p, y)
        return p

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=AUC_COLUMNS)


def _main(g: Grader, f: Features, shift: LatentShift, lik: np.ndarray) -> dict[str, np.ndarray]:
    """CRM, its ablations and the baselines; returns the out-of-fold probabilities kept."""
    oof = {
        "crm_lr": g.cv("crm", "CRM-LR", f.crm(shift)),
        "crm_xgb": g.cv("crm", "CRM-XGB", f.crm(shift), "xgb"),
    }
    g.cv("ablation", "CRM-LR without L1+L2", f.crm(shift, surface=False))
    g.cv("ablation", "CRM-XGB without L1+L2", f.crm(shift, surface=False), "xgb")
    g.cv("baseline", "L1+L2 only", np.column_stack([f.l1, f.l2]))
    lts = shift.transform(f.d)
    k = len(shift.layers_)
    g.cv("direction", "PC1 only", lts[:, :k])
    g.cv("direction", "supervised only", lts[:, k:])
    g.score("baseline", "mean LTS", lts[:, k:].mean(axis=1))
    best = best_layer(lts, k, g.y)
    g.cv("baseline", "single-layer LTS", lts[:, [best, k + best]])
    g.cv("baseline", "raw hidden state", f.hc[:, -1])
    for j, name in enumerate(("PPL", "Zlib-PPL", "Min-K% Prob", "Min-K%++")):
        g.score("likelihood", name, lik[:, j])
    g.cv(
        "control",
        "shuffled labels",
        f.crm(shift),
        y=rng(g.st.seed, "membership-perm", g.model).permutation(g.y),
    )
    return oof


def best_layer(lts: np.ndarray, k: int, y: np.ndarray) -> int:
    """The target layer whose supervised LTS separates best on its own (|AUC - 0.5|)."""
    from plantbench.suites.membership.probe import auc

    return int(np.argmax([abs(auc(y, lts[:, k + j]) - 0.5) for j in range(k)]))


def _layers(
    g: Grader, f: Features, shift: LatentShift, cal: np.ndarray, y: np.ndarray
) -> pd.DataFrame:
    """AUC per layer: LR on the layer's two LTS (directions fitted on the calibration set)."""
    st, rows = g.st, []
    for layer in range(f.d.shape[1]):
        one = LatentShift(-1.0).fit(f.d[cal][:, [layer]], y[cal].astype(bool))
        x = one.transform(f.d[:, [layer]])
        p = oof_scores(x, y, "lr", st.folds, st.cv_seed) if np.any(x) else np.full(len(y), 0.5)
        a, lo, hi = auc_interval(y, p, st.bootstrap, st.seed, f"{g.model}/layer/{layer}")
        rows.append((g.model, layer, float(shift.variance_ratio_[layer]), a, lo, hi))
    return pd.DataFrame(rows, columns=["model", "layer", "variance_ratio", "auc", "lo", "hi"])


CELL_SCORES = ("CRM-LR", "Min-K% Prob")  # the probe (out of fold) and the best baseline


def _cells(
    model: str, s: pd.DataFrame, scores: dict[str, np.ndarray], st: Settings
) -> pd.DataFrame:
    """Each score's AUC per cell (members of the cell vs the cell's non-members) and for
    learned / unlearned members (vs every non-member)."""
    rows = []
    y = s["member"].to_numpy()
    subsets = [
        (("cell", int(n), pos), g.index.to_numpy())
        for (n, pos), g in s.groupby(["n_docs", "position"], sort=True)
    ]
    for name, keep in (("learned", s["learned"]), ("not learned", ~s["learned"])):
        subsets.append(((name, -1, "all"), np.flatnonzero(~y | (y & keep.to_numpy()))))
    for score, p in scores.items():
        for key, i in subsets:
            tag = f"{model}/{score}/{key[0]}/{key[1]}/{key[2]}"
            a, lo, hi = auc_interval(y[i], p[i], st.bootstrap, st.seed, tag)
            rows.append((model, score, *key, int(y[i].sum()), int((~y[i]).sum()), a, lo, hi))
    cols = ["model", "score", "subset", "n_docs", "position", "members", "non_members"]
    return pd.DataFrame(rows, columns=[*cols, "auc", "lo", "hi"])


def _controls(
    g: Grader, ctx: dict[str, Any], shift: LatentShift, cal: np.ndarray
) -> dict[str, list[int]]:
    """The other prompt templates and block noise: the model run again, AUC of CRM-LR.
    Returns the noised blocks (0-based decoder blocks) of each noise row."""
    model, tok, s, st = ctx["model"], ctx["tok"], ctx["samples"], ctx["st"]
    y = g.y.astype(bool)
    for t, template in enumerate(TEMPLATES[1:], start=1):
        f = features_of(
            run_conditions(model, tok, s, template, st.generate_tokens, st.batch), ctx["encoder"]
        )
        g.cv("control", f"template {t}", f.crm(LatentShift(st.pca_ratio).fit(f.d[cal], y[cal])))
    base = ctx["features"]
    blocks = [int(x) - 1 for x in shift.layers_ if x >= 1]
    others = [b for b in range(len(model.model.layers)) if b not in blocks] or list(
        range(len(model.model.layers))
    )
    pick = rng(st.seed, "membership-noise", g.model).choice(
        others, size=min(len(blocks), len(others)), replace=False
    )
    noised = {"CRM": blocks, "random": sorted(int(b) for b in pick)}
    for key, chosen in noised.items():
        with block_noise(model, chosen, st.noise, st.seed):
            c = run_conditions(model, tok, s, TEMPLATES[0], 0, st.batch)
        noisy = Features(base.l1, base.l2, c.hc - c.h0, c.hc)
        g.cv("noise", f"noise in {key} blocks", noisy.crm(shift))
    return noised


def _probe_json(
    shift: LatentShift, x: np.ndarray, y: np.ndarray, st: Settings, model: str
) -> dict[str, Any]:
    """The L3-only CRM-LR fitted on every sample, as plain numbers (what the server loads)."""
    lr = classifier("lr", st.cv_seed).fit(x, y)
    scaler, reg = lr[0], lr[-1]
    return {
        "model": model,
        "template": TEMPLATES[0],
        "layers": shift.layers_.tolist(),
        "pc1": shift.pc1_.tolist(),
        "sup": shift.sup_.tolist(),
        "mean": scaler.mean_.tolist(),
        "scale": scaler.scale_.tolist(),
        "coef": reg.coef_[0].tolist(),
        "intercept": float(reg.intercept_[0]),
    }


def _inputs(paths: Paths) -> tuple[dict[str, Any], pd.DataFrame]:
    meta = io.read_meta(paths.membership("samples"), "membership_samples")
    return meta, io.read_parquet(paths.membership("samples") / "samples.parquet")


def run(cfg: dict[str, Any], paths: Paths, model_name: str, *, threads: int = 1) -> dict[str, Any]:
    from plantbench.attribution.encoder import resolve_encoder

    torch.set_num_threads(threads)
    st = settings(cfg)
    meta, samples = _inputs(paths)
    encoder = resolve_encoder(cfg["features"]["encoder"])
    tok = tokenizer.load(paths.tokenizer)
    model_meta = io.read_meta(paths.model(model_name), "pretrain", verify=False)
    model = load_model(artifacts.final_checkpoint_path(paths, model_name), attn="sdpa")
    mine = samples[samples["model"] == model_name].reset_index(drop=True)
    s = mine[mine["kind"] != "distractor"].reset_index(drop=True)
    dis = mine[mine["kind"] == "distractor"].reset_index(drop=True)
    y, cal = s["member"].to_numpy(), s["cal"].to_numpy()
    log.info("membership %s: %d samples, %d distractors", model_name, len(s), len(dis))
    both = pd.concat([s, dis], ignore_index=True)
    c = run_conditions(model, tok, both, TEMPLATES[0], st.generate_tokens, st.batch)
    f_all = features_of(c, encoder)
    f, f_dis = f_all.split(len(s))
    shift = LatentShift(st.pca_ratio).fit(f.d[cal], y[cal])
    window = int(model.config.max_position_embeddings)
    lik = likelihood_scores(model, tok, list(s["context"]), st, window)
    g = Grader(model_name, y, st)
    oof = _main(g, f, shift, lik)
    g.score("crm", "CRM-LR, held-out samples only", oof["crm_lr"][~cal], y[~cal])
    layers = _layers(g, f, shift, cal, y)
    layers["selected"] = layers["layer"].isin(shift.layers_)
    log.info("membership %s: CRM-LR AUC %.3f; controls", model_name, g.rows[0][4])
    ctx = {"model": model, "tok": tok, "samples": s, "st": st, "encoder": encoder, "features": f}
    noised = _controls(g, ctx, shift, cal)
    full = classifier("lr", st.cv_seed).fit(f.crm(shift), y)
    # the control: none when the grid has no distractor documents (facts.distractors_per_entity 0)
    p_dis = full.predict_proba(f_dis.crm(shift))[:, 1] if len(dis) else np.zeros(0)
    tables = {
        "features": _feature_table(both, f_all, shift, lik, oof, p_dis, c.cut),
        "aucs": g.table(),
        "layers": layers,
        "cells": _cells(
            model_name, s, dict(zip(CELL_SCORES, (oof["crm_lr"], lik[:, 2]), strict=True)), st
        ),
    }
    probe = _probe_json(shift, f.crm(shift, surface=False), y, st, model_name)
    info = {"layers": [int(x) for x in shift.layers_], "noise_blocks": noised}
    return _write(paths, model_name, st, (meta, model_meta), tables, probe, info)


def _feature_table(
    both: pd.DataFrame,
    f: Features,
    shift: LatentShift,
    lik: np.ndarray,
    oof: dict[str, np.ndarray],
    p_dis: np.ndarray,
    cut: np.ndarray,
) -> pd.DataFrame:
    """Per sample (then distractor): its keys, every feature, the baselines' scores and the
    probes' probabilities (out-of-fold for samples; the probe fitted on all samples for
    distractors)."""
    n = len(lik)
    t = both[
        ["sample_id", "kind", "member", "cal", "doc_id", "fact_id", "n_docs", "position", "learned"]
    ].copy()
    t["cut"] = cut
    t["l1"] = f.l1
    for j, name in enumerate(L2_STATS):
        t[name] = f.l2[:, j]
    lts = shift.transform(f.d)
    k = len(shift.layers_)
    for j, layer in enumerate(shift.layers_):
        t[f"lts_pc1_{layer}"] = lts[:, j]
        t[f"lts_sup_{layer}"] = lts[:, k + j]
    for j, name in enumerate(likelihood.NAMES):
        t[name] = np.concatenate([lik[:, j], np.full(len(t) - n, np.nan)])
    t["p_crm_lr"] = np.concatenate([oof["crm_lr"], p_dis])
    t["p_crm_xgb"] = np.concatenate([oof["crm_xgb"], np.full(len(t) - n, np.nan)])
    return t


def _write(
    paths: Paths,
    model_name: str,
    st: Settings,
    metas: tuple[dict[str, Any], dict[str, Any]],
    tables: dict[str, pd.DataFrame],
    probe: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    meta, model_meta = metas
    feats, crm = tables["features"], tables["aucs"].set_index("name")["auc"]
    out = paths.membership(model_name)
    with io.atomic_dir(out) as tmp:
        for name, df in tables.items():
            io.write_parquet(tmp / f"{name}.parquet", df)
        io.write_text(tmp / "probe.json", json.dumps(probe, indent=1, sort_keys=True) + "\n")
        return io.write_meta(
            tmp,
            "membership_detect",
            FILES,
            config_hash=settings_hash(st),
            inputs={"samples": meta["hash"], "model": model_meta["hash"]},
            info={
                "model": model_name,
                "samples": int((feats["kind"] != "distractor").sum()),
                "distractors": int((feats["kind"] == "distractor").sum()),
                "contexts_cut": int(feats["cut"].sum()),
                **extra,
                "crm_lr_auc": float(crm["CRM-LR"]),
                "crm_xgb_auc": float(crm["CRM-XGB"]),
            },
        )
