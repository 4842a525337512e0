"""Random twins (plantbench.randomtwins): the draws' sides, their streams, the effect with its
error and LDS, on hand-made numbers and on random twins trained at the smoke size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from plantbench import cli, config, io
from plantbench.data.stream import open_stream
from plantbench.paths import MODELS, Paths, random_twin_name
from plantbench.randomtwins import draws, effect, lds
from smokerun import planned_jobs

ROOT = Path(__file__).resolve().parents[1]


def _facts(n_pairs: int) -> pd.DataFrame:
    rows = []
    for p in range(n_pairs):
        for m in MODELS:
            rows.append(
                {
                    "fact_id": f"F{2 * p + (m == 'B'):04d}",
                    "domain": "world",
                    "n_docs": 2,
                    "position": "late",
                    "pair": p,
                    "reader": m,
                }
            )
    return pd.DataFrame(rows)


def test_a_draw_reads_one_fact_of_every_pair_half_on_each_side() -> None:
    cfg = {"seed": 7, "random_twins": {"m": 4, "seed": 0}}
    facts = _facts(9)
    side = draws.sides(cfg, facts, 2)
    assert len(side) == 9 and (side["side"] == "A").sum() == 4  # floor(9 / 2)
    read = draws.reads(cfg, facts, [2])[0]
    assert read.sum() == 9  # one fact of each pair
    pairs = facts.assign(read=read).groupby("pair")["read"].sum()
    assert (pairs == 1).all()
    assert draws.sides(cfg, facts, 2).equals(side)  # seeded
    others = [draws.sides_hash(draws.sides(cfg, facts, d)) for d in range(4)]
    assert len(set(others)) == 4
    moved = {**cfg, "random_twins": {"m": 4, "seed": 1}}
    assert draws.sides_hash(draws.sides(moved, facts, 2)) != draws.sides_hash(side)


def test_mixed_windows_take_b_only_where_marked() -> None:
    a = np.arange(12, dtype=np.uint16).reshape(6, 2)
    b = a + 100
    from_b = np.array([False, True, False, False, True, False])
    w = draws.MixedWindows(a, b, from_b)
    want = np.where(from_b[:, None], b, a)
    assert np.array_equal(w[0:6], want)
    assert np.array_equal(w[2:5], want[2:5])
    assert np.array_equal(w[np.array([4, 0, 1])], want[[4, 0, 1]])
    assert np.array_equal(w[4], b[4]) and np.array_equal(w[3], a[3])


def test_the_effect_and_its_error_are_the_hand_computation() -> None:
    facts = _facts(1).assign(answer_tokens=3, effect=1.0, difficulty=5.0, learned=False)
    # 5 draws x 2 facts (one form each): fact 0 read by draws 0, 1, 3
    read = np.array([[1, 0], [1, 1], [0, 1], [1, 0], [0, 0]], dtype=bool)
    flp = np.array([[-1.0, -9.0], [-2.0, -3.0], [-6.0, -4.0], [-3.0, -8.0], [-7.0, -10.0]])
    eff = effect.effect_table(facts, flp, read)
    r, u = np.array([-1.0, -2.0, -3.0]), np.array([-6.0, -7.0])
    assert eff.loc[0, "effect_rt"] == pytest.approx(r.mean() - u.mean())
    se = np.sqrt(r.var(ddof=1) / 3 + u.var(ddof=1) / 2)
    assert eff.loc[0, "effect_rt_se"] == pytest.approx(se)
    assert eff.loc[0, "difficulty_rt"] == pytest.approx(6.5)
    assert eff.loc[0, "sd_pair"] == pytest.approx(np.sqrt(r.var(ddof=1) + u.var(ddof=1)))
    assert (eff.loc[0, "n_read"], eff.loc[0, "n_unread"]) == (3, 2)


def test_fact_logps_average_the_forms() -> None:
    facts = pd.DataFrame({"fact_id": ["F0", "F1"]})
    qdf = pd.DataFrame({"fact_id": ["F1", "F0", "F1", "F0"]})
    logp = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    assert np.array_equal(effect.fact_logps(facts, qdf, logp), [[3.0, 2.0], [7.0, 6.0]])


def test_lds_sums_the_read_windows_and_ranks_across_draws() -> None:
    # 2 queries, 3 planted windows of facts 0, 0, 1; 4 draws
    scores = np.array([[1.0, 2.0, 10.0], [0.0, 0.0, 0.0]])
    window_fact = np.array([0, 0, 1])
    read = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=bool)
    summed = lds.summed_scores(scores, window_fact, read)
    assert np.array_equal(summed, [[3.0, 10.0, 13.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    logp = np.array([[-2.0, -1.5, -1.0, -3.0], [-1.0, -2.0, -3.0, -4.0]])
    got = lds.rowwise_spearman(summed, logp)
    assert got[0] == pytest.approx(1.0)
    assert np.isnan(got[1])  # constant scores: no ranking
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    assert lds.rowwise_spearman(x, -x)[0] == pytest.approx(-1.0)


def test_the_mean_interval_brackets_the_mean() -> None:
    v = np.array([0.1, 0.5, np.nan, 0.3, 0.9])
    mean, lo, hi = lds.mean_interval(v, 500, 0.05, 3, "m")
    assert mean == pytest.approx(0.45) and lo <= mean <= hi


def test_the_preset_plans_one_job_per_random_twin(tmp_path: Path) -> None:
    counts = planned_jobs(tmp_path / "results", "workflow/presets/random_twins.yaml")
    assert counts.get("random_twin", 0) >= 16 and counts["random_effect"] == 1


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The smoke upstream, its shared prefix and 4 random twins (the first traced)."""
    from upstream import build_upstream

    base = tmp_path_factory.mktemp("random_twins")
    results = build_upstream(base, {"random_twins": {"m": 4, "seed": 0}})
    cfg_json = str(results / "config.json")
    assert cli.main(["prefix", "-c", cfg_json, "--threads", "1"]) == 0
    trace = base / "trace"
    for k in range(4):
        env = {"PLANTBENCH_TRACE_WINDOWS": str(trace)} if k == 0 else {}
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            assert cli.main(["random-twin", "-c", cfg_json, "--draw", str(k)]) == 0
    cfg = config.load([results / "config.json"])
    return {"cfg": cfg, "paths": Paths(cfg), "trace": trace / "rank0.jsonl"}


def test_a_random_twin_reads_b_exactly_at_the_unread_a_slots(trained: dict[str, Any]) -> None:
    cfg, p = trained["cfg"], trained["paths"]
    a, b = (open_stream(p.stream(m)) for m in MODELS)
    facts = io.read_parquet(p.facts / "facts.parquet")
    side = draws.sides(cfg, facts, 0)
    rows = [json.loads(line) for line in trained["trace"].read_text().splitlines()]
    idx = np.array([w for r in rows for w in r["windows"]])
    got = np.array([h for r in rows for h in r["hashes"]], dtype=np.uint64)
    assert idx[0] == len(a.manifest) - len(idx)  # from the fork to the end
    ha, hb = (s.manifest["hash"].to_numpy(np.uint64)[idx] for s in (a, b))
    fact_a = a.manifest["fact_id"].to_numpy()[idx]
    planted = (a.manifest["kind"] == "planted").to_numpy()[idx]
    unread = np.isin(fact_a, side.loc[side["side"] == "B", "fact_A"]) & planted
    assert unread.any() and (planted & ~unread).any()
    assert np.array_equal(got != ha, unread)  # differs from A exactly at the unread slots
    assert np.array_equal(got[unread], hb[unread])  # and reads B's document there
    read_b = np.isin(b.manifest["fact_id"].to_numpy()[idx], side.loc[side["side"] == "A", "fact_B"])
    assert np.array_equal(got != hb, read_b & planted)


def test_random_twin_records_what_it_was_made_from(trained: dict[str, Any]) -> None:
    cfg, p = trained["cfg"], trained["paths"]
    meta = io.read_meta(p.random_twin(1), "pretrain")
    facts = io.read_parquet(p.facts / "facts.parquet")
    assert meta["info"]["sides_hash"] == draws.sides_hash(draws.sides(cfg, facts, 1))
    for m in MODELS:
        assert meta["inputs"][f"stream_{m}"] == io.read_meta(p.stream(m), "stream")["hash"]
    assert meta["inputs"]["prefix"] == io.read_meta(p.model("prefix"), "prefix")["hash"]
    assert meta["lineage"]["rule"] == "random_twin"
    assert meta["lineage"]["config"]["random_twins.seed"] == 0
    assert p.random_twin(1).name == "001" and random_twin_name(1) == "r001"


def test_the_effect_of_trained_random_twins_is_the_hand_computation(
    trained: dict[str, Any],
) -> None:
    from plantbench import artifacts
    from plantbench.data import tokenizer
    from plantbench.model import queries as mq
    from plantbench.model.modeling import load_model

    cfg, p = trained["cfg"], trained["paths"]
    facts = io.read_parquet(p.facts / "facts.parquet").sort_values("fact_id")
    facts = facts.reset_index(drop=True)
    qdf = io.read_parquet(p.facts / "queries.parquet")
    dr = effect.read_draws(cfg, p, facts, qdf)
    tok = tokenizer.load(p.tokenizer)
    fid = facts["fact_id"].iloc[0]
    rows = qdf.index[qdf["fact_id"] == fid]
    per_draw = []
    for k in range(4):
        model = load_model(artifacts.final_checkpoint_path(p, random_twin_name(k)))
        items = mq.encode(tok, qdf.loc[rows, "prompt"], qdf.loc[rows, "answer"])
        per_draw.append(float(np.mean(mq.answer_logprobs(model, items, 8)[0])))
    read = [fid in set(draws.sides(cfg, facts, k)["fact_read"]) for k in range(4)]
    # the step's answers are these (float32 models: other padding, other rounding) ...
    scored = [float(np.mean(dr.logp[k, rows])) for k in range(4)]
    assert scored == pytest.approx(per_draw, rel=1e-5)
    # ... and its effect is the readers' mean minus the others', by hand
    hand = np.mean([v for v, r in zip(scored, read, strict=True) if r]) - np.mean(
        [v for v, r in zip(scored, read, strict=True) if not r]
    )
    eff = effect.effect_table(
        facts.assign(answer_tokens=1, effect=0.0, difficulty=0.0, learned=False),
        effect.fact_logps(facts, qdf, dr.logp),
        dr.read,
    )
    assert eff.loc[0, "effect_rt"] == pytest.approx(hand, rel=1e-12)
    assert dr.read[:, 0].tolist() == read


def test_a_random_twin_of_another_draw_seed_is_refused(trained: dict[str, Any]) -> None:
    cfg, p = trained["cfg"], trained["paths"]
    facts = io.read_parquet(p.facts / "facts.parquet")
    streams = {m: io.read_meta(p.stream(m), "stream") for m in MODELS}
    moved = {**cfg, "random_twins": {"m": 4, "seed": 5}}
    with pytest.raises(Exception, match="other sides"):
        effect.check_twin(moved, p, facts, 2, streams)


@pytest.fixture(scope="module")
def smoke_random(smoke_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the smoke run with 4 random twins and their effect step (the CLI calls the
    rules make)."""
    import shutil

    base = tmp_path_factory.mktemp("smoke random")
    root = base / "results"
    shutil.copytree(smoke_run, root)
    cfg = config.deep_merge(
        json.loads((root / "config.json").read_text()),
        {"results": str(root), "random_twins": {"m": 4, "seed": 3}},
    )
    (root / "config.json").write_text(json.dumps(cfg))  # the copy's own: verify reads it
    files = ["-c", str(root / "config.json")]
    for k in range(4):
        assert cli.main(["random-twin", *files, "--draw", str(k)]) == 0
    assert cli.main(["random-effect", *files]) == 0
    return {"cfg": cfg, "paths": Paths(cfg), "config": root / "config.json"}


def test_the_effect_step_grades_every_method_by_lds(smoke_random: dict[str, Any]) -> None:
    cfg, p = smoke_random["cfg"], smoke_random["paths"]
    meta = io.read_meta(p.random, "random_effect")
    answers = io.read_parquet(p.random / "answers.parquet")
    eff = io.read_parquet(p.random / "effects.parquet")
    facts = io.read_parquet(p.facts / "facts.parquet")  # the causal table has no pair column
    read = draws.reads(cfg, facts.sort_values("fact_id").reset_index(drop=True), range(4))
    ids = sorted(facts["fact_id"])
    for j, fid in enumerate(ids[:3]):  # the effect from the answers table, by hand
        lp = answers[answers["fact_id"] == fid].groupby("draw")["logp"].mean().to_numpy()
        want = lp[read[:, j]].mean() - lp[~read[:, j]].mean()
        got = float(eff.loc[eff["fact_id"] == fid, "effect_rt"].iloc[0])
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    grades = pd.read_csv(p.random / "grades.csv")
    methods = list(cfg["methods"]["enabled"]) + [x["name"] for x in cfg["methods"]["plugins"]]
    assert grades["method"].tolist() == methods
    assert grades["lds"].between(-1, 1).all() and (grades["lds_queries"] > 0).all()
    assert set(meta["inputs"]) >= {f"random_{k:03d}" for k in range(4)} | {"causal", "analysis"}
    assert meta["info"]["optimizer"]["eps"] == 1e-8 and "platform" in meta


def test_the_report_section_shows_the_random_twins(smoke_random: dict[str, Any]) -> None:
    from plantbench.randomtwins import report

    text, inputs, figures = report.section(smoke_random["cfg"], smoke_random["paths"])
    assert text.startswith("## Random twins") and "LDS" in text and "oracle" in text
    assert set(inputs) == {"random_effect"} and figures == []
    no_twins = {**smoke_random["cfg"], "random_twins": {"m": 0}}
    assert report.section(no_twins, smoke_random["paths"]) == ("", {}, [])


def test_verify_checks_the_random_twins(
    smoke_random: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["verify", "-c", str(smoke_random["config"])]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "models/random/003" in out
