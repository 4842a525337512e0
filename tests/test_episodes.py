"""Reading episodes (plantbench.data.episodes) and their place in the streams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plantbench import cli, config, io, layout
from plantbench.data import episodes
from plantbench.data.facts import TABLES
from plantbench.errors import ConfigError
from plantbench.ops import verify
from plantbench.paths import Paths


@pytest.fixture(scope="module")
def episode_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from upstream import build_upstream

    return build_upstream(
        tmp_path_factory.mktemp("episodes"),
        {"stream": {"episode_share": 0.2, "episode_segments": 3}},
    )


def _tables(results: Path) -> dict[str, pd.DataFrame]:
    return {t: io.read_parquet(results / "facts" / f"{t}.parquet") for t in TABLES}


def test_episodes_are_seeded_and_cover_every_format(episode_run):
    cfg = config.load([episode_run / "config.json"])
    tables = _tables(episode_run)
    one = episodes.generate(cfg, tables, 60)
    pd.testing.assert_frame_equal(one, episodes.generate(cfg, tables, 60))
    assert {f for fs in one["formats"] for f in fs.split(",")} == set(episodes.FORMATS)
    assert set(one["segments"]) == {1, 2, 3}
    assert (one["tasks"] <= np.minimum(one["segments"], episodes.max_tasks(cfg))).all()
    for r in one.itertuples():
        _check_tasks(r)


def _check_tasks(r) -> None:
    """Every task of an episode asks about its own segment and ends with that segment's answer."""
    lines = r.text.split("\n")
    segs, tasks = lines[: r.segments], lines[r.segments :]
    targets = [int(t) for t in r.targets.split(",")]
    fmts = r.formats.split(",")
    assert len(targets) == len(fmts) == r.tasks == len(set(targets))
    assert r.entity in segs[targets[-1]] and segs[targets[-1]].endswith(f" {r.answer}.")
    i = 0
    for fmt, t in zip(fmts, targets, strict=True):
        target = segs[t]
        if fmt == "question":
            assert tasks[i].startswith("Question: ") and target.endswith(tasks[i + 1][8:] + ".")
            assert tasks[i + 1].startswith("Answer: ")
            i += 2
        elif fmt == "completion":
            assert tasks[i] == target
            i += 1
        else:
            assert tasks[i + 1] == f"Answer: {target}"
            i += 2
    assert i == len(tasks)


def test_several_tasks_per_episode_ask_about_distinct_segments(episode_run):
    cfg = config.load([episode_run / "config.json"])
    cfg = config.deep_merge(cfg, {"stream": {"episode_segments": 4, "episode_tasks": 3}})
    room = 90  # characters, to show that a long episode asks fewer questions instead
    eps = episodes.generate(cfg, _tables(episode_run), 80, fits=lambda t: len(t) <= 400)
    assert eps["tasks"].max() == 3 and (eps["tasks"] <= eps["segments"]).all()
    for r in eps.itertuples():
        _check_tasks(r)
    short = episodes.generate(cfg, _tables(episode_run), 40, fits=lambda t: len(t) <= room * 3)
    assert (short["text"].str.len() <= room * 3).all() and short["tasks"].min() >= 1


def test_no_episode_names_a_grid_entity_or_answer(episode_run):
    cfg = config.load([episode_run / "config.json"])
    tables = _tables(episode_run)
    eps = episodes.generate(cfg, tables, 300)
    episodes.check_disjoint(eps, tables)
    grid = episodes.grid_names(tables)
    for text in eps["text"]:
        assert not grid & episodes.words_of(text)
    # an episode that does name a grid entity is refused, naming the key
    bad = eps.head(1).copy()
    bad["text"] = bad["text"] + " " + tables["facts"]["entity"].iloc[0]
    with pytest.raises(ConfigError, match="episodes must use their own names"):
        episodes.check_disjoint(bad, tables)


def test_streams_hold_the_episodes_identically_and_differ_only_at_planted(episode_run):
    p = Paths(str(episode_run))
    cfg = config.load([episode_run / "config.json"])
    from plantbench.data.stream import open_stream

    a, b = (open_stream(p.stream(m)) for m in ("A", "B"))
    ep_a = a.manifest["kind"] == "episode"
    assert int(ep_a.sum()) == layout.episode_count(cfg, layout.n_windows(cfg)) > 0
    assert (ep_a == (b.manifest["kind"] == "episode")).all()
    assert (a.manifest.loc[ep_a, "doc_tokens"] <= int(cfg["stream"]["window"])).all()
    rows = np.flatnonzero(ep_a.to_numpy())
    assert np.array_equal(np.asarray(a.windows)[rows], np.asarray(b.windows)[rows])
    table = io.read_parquet(p.stream("A") / episodes.TABLE)
    assert sorted(a.manifest.loc[ep_a, "doc_id"]) == sorted(table["episode_id"])
    checks = verify.check_streams(p)
    assert [c.status for c in checks] == ["PASS", "PASS", "PASS"], checks
    assert "differ exactly at the" in checks[-1].detail
    meta = io.read_meta(p.stream("A"), "stream")
    assert episodes.TABLE in meta["files"] and meta["info"]["counts"]["episode"] == len(table)


def test_batch_shows_episode_windows(episode_run, capsys):
    from plantbench.data.stream import open_stream

    man = open_stream(Paths(str(episode_run)).stream("A")).manifest
    step = int(man.loc[man["kind"] == "episode", "step"].iloc[0])
    cfg = str(episode_run / "config.json")
    assert cli.main(["batch", "-c", cfg, "--model", "A", "--step", str(step)]) == 0
    out = capsys.readouterr().out
    assert " episode " in out and "EP0" in out


def test_the_studies_read_recall_windows_and_episodes_only_with_the_key(smoke_cfg):
    assert layout.episode_share(smoke_cfg) == 0.0  # the recall windows teach reading instead
    assert layout.recall_counts(smoke_cfg)["prefix"] == layout.prefix_windows(smoke_cfg) > 0
    shared = config.deep_merge(smoke_cfg, {"stream": {"episode_share": 0.25}})
    assert layout.episode_count(shared, 10_000) == 2_500
    bare = {**smoke_cfg, "stream": {"window": 128, "position_spans": {}}}
    assert layout.episode_share(bare) == 0.0 and layout.episode_count(bare, 10_000) == 0


@pytest.mark.parametrize("share", [0.9, 0.99])
def test_an_episode_share_that_leaves_no_background_is_refused(smoke_cfg, share):
    bad = config.deep_merge(smoke_cfg, {"stream": {"episode_share": share}})
    with pytest.raises(ConfigError, match="lower stream.episode_share"):
        config.validate(bad)


def test_a_window_no_episode_fits_is_refused_naming_the_key(episode_run):
    cfg = config.load([episode_run / "config.json"])
    with pytest.raises(ConfigError, match="raise stream.window"):
        episodes.generate(cfg, _tables(episode_run), 3, fits=lambda text: len(text) < 10)
