"""The membership suite (seed 001): the latent trajectory shift, the classifiers, the likelihood
baselines, the samples and the audit server on cases with known answers."""

from __future__ import annotations

import math
import shutil
import socket
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from plantbench import config
from plantbench.data import facts, tokenizer
from plantbench.errors import ConfigError
from plantbench.suites.membership import likelihood, probe, samples, trace
from plantbench.suites.membership.settings import TEMPLATES, settings
from test_report_html import chromium
from tiny_models import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SMOKE = [ROOT / "config.yaml", ROOT / "tests" / "smoke" / "config.yaml"]


def _shifted_pair(n=200, layers=4, dim=16, seed=0):
    """States of n samples in two conditions; members' displacement at layer 2 lies along a
    known unit direction u (+), non-members' against it (-); layer 0 never moves."""
    g = np.random.default_rng(seed)
    u = np.zeros(dim)
    u[3] = 0.6
    u[7] = -0.8
    member = np.arange(n) % 2 == 0
    h0 = g.normal(size=(n, layers, dim))
    hc = h0 + 0.05 * g.normal(size=(n, layers, dim))
    hc[:, 0] = h0[:, 0]
    hc[:, 2] += np.where(member, 1.0, -1.0)[:, None] * 3 * u
    return h0, hc, member, u


def test_a_known_direction_gives_auc_one_and_is_pc1():
    h0, hc, member, u = _shifted_pair()
    cal = np.arange(len(member)) < 60
    shift = probe.LatentShift(0.01).fit((hc - h0)[cal], member[cal])
    assert shift.layers_.tolist() == [2]  # the only layer whose displacement carries variance
    assert abs(shift.pc1_[0] @ u) == pytest.approx(1.0, abs=1e-3)
    assert shift.sup_[0] @ u == pytest.approx(1.0, abs=1e-3)  # members minus non-members
    x = shift.transform(hc - h0)
    p = probe.oof_scores(x, member.astype(int), "lr", 5, 42)
    assert probe.auc(member, p) > 0.99
    px = probe.oof_scores(x, member.astype(int), "xgb", 5, 42)
    assert probe.auc(member, px) > 0.99


def test_shuffled_labels_give_chance_auc():
    h0, hc, member, _ = _shifted_pair(n=400, seed=1)
    shuffled = np.random.default_rng(5).permutation(member)
    shift = probe.LatentShift(0.01).fit((hc - h0)[:100], shuffled[:100])
    p = probe.oof_scores(shift.transform(hc - h0), shuffled.astype(int), "lr", 5, 42)
    assert abs(probe.auc(shuffled, p) - 0.5) < 0.1


def test_no_layer_kept_is_refused():
    d = np.zeros((20, 3, 4))
    with pytest.raises(ConfigError, match="membership.pca_ratio"):
        probe.LatentShift(0.01).fit(d, np.arange(20) % 2 == 0)


def test_auc_of_a_hand_made_ranking_and_its_interval():
    from sklearn.metrics import roc_auc_score

    y, s = np.array([1, 0, 1, 0]), np.array([0.9, 0.8, 0.3, 0.1])
    assert probe.auc(y, s) == 0.75 == roc_auc_score(y, s)
    assert probe.auc(np.array([1, 0]), np.array([0.5, 0.5])) == 0.5  # ties count half
    a, lo, hi = probe.auc_interval(y, s, 200, 0, "t")
    assert a == 0.75 and 0 <= lo <= a <= hi <= 1
    assert math.isnan(probe.auc(np.array([1, 1]), np.array([0.1, 0.2])))


def test_likelihood_baselines_equal_hand_computed_values():
    lp = [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert likelihood.ppl_score(lp) == -3.0
    assert likelihood.min_k_score(lp, 0.4) == -4.5  # the 2 lowest of 5
    assert likelihood.min_k_score(lp, 0.1) == -5.0  # at least one token
    assert likelihood.zlib_score(lp, "abc") == pytest.approx(-3.0 / len(zlib.compress(b"abc")))
    mu, sigma = [-1.0, -1.0, -2.0, -2.0, -1.0], [1.0, 2.0, 1.0, 0.5, 2.0]
    # standardized: 0, -0.5, -1, -4, -2 -> the 2 lowest: -4, -2
    assert likelihood.min_k_pp_score(lp, mu, sigma, 0.4) == -3.0
    with pytest.raises(ValueError, match="no scored token"):
        likelihood.min_k_score([], 0.2)


# ---- samples on the smoke grid -------------------------------------------------------------


@pytest.fixture(scope="module")
def grid():
    cfg = config.load(SMOKE)
    t = facts.build(cfg)
    learned = pd.DataFrame({"fact_id": t["facts"]["fact_id"], "learned": False})
    return cfg, t, learned


def _samples(cfg, t, learned, **over):
    st = settings({**cfg, "membership": over})
    return samples.build(t["facts"], learned, t["documents"], t["distractors"], t["queries"], st)


def test_samples_are_balanced_members_of_their_twin_and_cover_every_fact(grid):
    cfg, t, learned = grid
    s = _samples(cfg, t, learned, samples=40, n_cal=10, distractors=8)
    reader = t["facts"].set_index("fact_id")["reader"]
    for m in ("A", "B"):
        mine = s[s["model"] == m]
        counts = mine["kind"].value_counts().to_dict()
        assert counts == {"member": 20, "non_member": 20, "distractor": 8}
        mem, non = mine[mine["kind"] == "member"], mine[mine["kind"] == "non_member"]
        assert (mem["fact_id"].map(reader) == m).all() and (non["fact_id"].map(reader) != m).all()
        assert (
            mem["cal"].sum() == non["cal"].sum() == 5
            and not mine.loc[mine["kind"] == "distractor", "cal"].any()
        )
        assert set(mem["fact_id"]) == set(t["facts"].loc[t["facts"]["reader"] == m, "fact_id"])
        assert mine["query"].str.startswith("Question:").all()
    pd.testing.assert_frame_equal(s, _samples(cfg, t, learned, samples=40, n_cal=10, distractors=8))


def test_bad_membership_settings_fail_with_one_line_naming_the_key(grid):
    cfg, t, learned = grid
    with pytest.raises(ConfigError, match="membership.samples"):
        _samples(cfg, t, learned, samples=10_000, n_cal=10)
    with pytest.raises(ConfigError, match="membership.n_cal"):
        settings({**cfg, "membership": {"samples": 40, "n_cal": 40}})
    with pytest.raises(ConfigError, match="membership.samples"):
        settings({**cfg, "membership": {"samples": 6, "n_cal": 2}})


# ---- the twin's passes ------------------------------------------------------------------------


def _tiny_llama(window=64, vocab=300):
    return tiny_llama(n_layer=3, vocab=vocab, window=window, seed=4)


def test_batched_last_states_equal_each_prompt_alone():
    model = _tiny_llama()
    prompts = [[1, 5, 9, 13], [1, 7], [1, 20, 21, 22, 23, 24]]
    batched = trace.last_states(model, prompts)
    for p, h in zip(prompts, batched, strict=True):
        np.testing.assert_allclose(trace.last_states(model, [p])[0], h, atol=1e-5)
    assert batched.shape == (3, 4, 32)


def test_block_noise_changes_states_from_the_noised_block_on_only():
    model = _tiny_llama()
    p = [[1, 5, 9, 13, 40]]
    clean = trace.last_states(model, p)[0]
    with trace.block_noise(model, [1], 1.0, seed=0):
        noisy = trace.last_states(model, p)[0]
    np.testing.assert_array_equal(clean[:2], noisy[:2])  # embeddings and block 0's output
    assert np.abs(clean[2:] - noisy[2:]).max() > 1e-3
    np.testing.assert_array_equal(trace.last_states(model, p)[0], clean)  # the hook is gone


# ---- the audit server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auditor(grid):
    from plantbench.suites.membership.serve import Auditor

    cfg, t, _ = grid
    tok = tokenizer.train_batches(cfg, [t["documents"]["text"].tolist()[:80]])
    model = _tiny_llama(window=128, vocab=tok.get_vocab_size())
    k, dim = 2, 32
    g = np.random.default_rng(0)
    sample = {
        "model": "A",
        "template": TEMPLATES[0],
        "layers": [1, 3],
        "pc1": g.normal(size=(k, dim)).tolist(),
        "sup": g.normal(size=(k, dim)).tolist(),
        "mean": [0.0] * (2 * k),
        "scale": [1.0] * (2 * k),
        "coef": [0.1] * (2 * k),
        "intercept": 0.0,
    }
    return Auditor(model, tok, sample)


def test_the_server_answers_over_http_and_refuses_bad_requests(auditor, grid):
    from fastapi.testclient import TestClient

    from plantbench.suites.membership.serve import app

    _, t, _ = grid
    client = TestClient(app(auditor))
    doc = t["documents"]["text"].iloc[0]
    r = client.post("/audit", json={"context": doc[:200], "query": "Question: Who?\nAnswer:"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["layers"] == [1, 3] and len(body["lts_pc1"]) == len(body["lts_sup"]) == 2
    assert 0 < body["probability"] < 1
    assert body == auditor.audit(doc[:200], "Question: Who?\nAnswer:")
    empty = client.post("/audit", json={"context": "  ", "query": "Question: Who?"})
    assert empty.status_code == 422 and "context is empty" in empty.json()["detail"]
    long = client.post("/audit", json={"context": doc * 20, "query": "Question: Who?"})
    assert long.status_code == 422 and "window" in long.json()["detail"]
    assert client.post("/audit", json={"context": "x"}).status_code == 422  # no query field
    assert "Membership audit" in client.get("/").text
    assert client.get("/health").json()["window"] == 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_dashboard_plots_the_trajectory_in_a_headless_browser(auditor, grid, tmp_path):
    import uvicorn
    from matplotlib.image import imread

    from plantbench.suites.membership.serve import app

    browser = next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if browser is None:
        pytest.skip("no Chromium binary on PATH")
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app(auditor), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        from urllib.parse import urlencode

        _, t, _ = grid
        query = urlencode(
            {"context": t["documents"]["text"].iloc[0][:200], "query": "Question: Who?\nAnswer:"}
        )
        shot = tmp_path / "dashboard.png"
        url = f"http://127.0.0.1:{port}/?{query}"
        chromium(browser, url, tmp_path, "--window-size=900,800", f"--screenshot={shot}")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    img = imread(shot)[..., :3]
    # the supervised trajectory is drawn in orange (#dd8452) and PC1 in blue (#4c72b0)
    for colour in ((0xDD, 0x84, 0x52), (0x4C, 0x72, 0xB0)):
        near = np.abs(img * 255 - np.array(colour)).max(axis=-1) < 12
        assert near.sum() > 200, f"no trajectory drawn in {colour}"


def test_kl_is_zero_for_identical_conditions_and_positive_otherwise():
    model = _tiny_llama()
    p = [[1, 5, 9]]
    y = [[13, 14, 15]]
    same = trace.kl_steps(model, p, p, y, 4)
    assert np.allclose(same[0, :3], 0, atol=1e-9) and np.isnan(same[0, 3])
    other = trace.kl_steps(model, [[1, 30, 31, 32, 5, 9]], p, y, 3)
    assert (other > 0).all()
    assert torch.is_tensor(trace.continuation_logprobs(model, p, y)[0])


def test_cell_aucs_compare_each_cells_members_with_its_own_non_members():
    from plantbench.suites.membership.detect import _cells
    from plantbench.suites.membership.settings import settings as membership_settings

    cfg = config.load(SMOKE)
    st = membership_settings({**cfg, "membership": {"bootstrap": 20}})
    s = pd.DataFrame(
        {
            "member": [True, False, True, False, True, False],
            "n_docs": [1, 1, 1, 1, 4, 4],
            "position": ["early"] * 6,
            "learned": [True, False, False, False, True, False],
        }
    )
    perfect = np.array([0.9, 0.1, 0.8, 0.2, 0.7, 0.6])
    backwards = 1 - perfect
    t = _cells("A", s, {"CRM-LR": perfect, "Min-K% Prob": backwards}, st)
    crm = t[t["score"] == "CRM-LR"].set_index(["subset", "n_docs"])
    assert crm.loc[("cell", 1), "members"] == 2 and crm.loc[("cell", 1), "auc"] == 1.0
    assert crm.loc[("cell", 4), "auc"] == 1.0  # 0.7 vs 0.6 inside the cell
    assert crm.loc[("learned", -1), ["members", "non_members"]].tolist() == [2, 3]
    assert (t.loc[t["score"] == "Min-K% Prob", "auc"] < 0.5).all()
