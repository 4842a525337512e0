"""Replicates: replicate 0 is the study as configured; replicate r >= 1 changes only the initial
weights and the background order, in its own folder; bad indices and folders are refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from plantbench import config, replicates
from plantbench.cli import main
from plantbench.errors import ConfigError
from plantbench.ops import verify
from plantbench.paths import Paths
from plantbench.rng import derive_seed


def test_replicate_zero_is_the_study(smoke_cfg):
    cfg = {**smoke_cfg, "replicates": 3}
    zero = replicates.select(cfg, 0)
    assert replicates.seed_tags(zero) == () and replicates.hash_part(zero) == {}
    assert Paths(zero).root == Paths(smoke_cfg).root
    assert config.study_hash(cfg) == config.study_hash(smoke_cfg)  # the count is not the study


def test_other_replicates_have_their_own_folder_and_seeds(smoke_cfg):
    cfg = {**smoke_cfg, "replicates": 3}
    one, two = replicates.select(cfg, 1), replicates.select(cfg, 2)
    p1, p2 = Paths(one), Paths(two)
    assert p1.root == p1.shared / "replicates" / "1" and p1.root != p2.root
    assert p1.facts == Paths(smoke_cfg).facts and p1.tokenizer == Paths(smoke_cfg).tokenizer
    seeds = {derive_seed(c["seed"], "init", *replicates.seed_tags(c)) for c in (cfg, one, two)}
    assert len(seeds) == 3


@pytest.mark.parametrize("r", [-1, 3, 7])
def test_replicate_out_of_range_is_one_line(smoke_cfg, r):
    with pytest.raises(ConfigError, match=r"replicate .* out of range: .*replicates: 3"):
        replicates.select({**smoke_cfg, "replicates": 3}, r)


def test_cli_refuses_a_replicate_out_of_range(smoke_cfg, tmp_path, capsys):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({**smoke_cfg, "replicates": 2}))
    assert main(["stream", "-c", str(path), "--replicate", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of range" in err[0]
    assert not (tmp_path / "results").exists()  # nothing written


def test_wildcard_round_trip():
    for r in range(4):
        assert replicates.from_wildcard(replicates.wildcard(r)) == r
    with pytest.raises(ConfigError):
        replicates.from_wildcard("replicates/x/")


def test_another_replicates_folder_is_never_overwritten(tmp_path, smoke_cfg):
    cfg = replicates.select({**smoke_cfg, "replicates": 3}, 2)
    made_by_one = {"info": {"replicate": 1}}
    with pytest.raises(ConfigError, match="holds replicate 1's artifact; replicate 2 would"):
        replicates.check_owner(tmp_path, made_by_one, cfg)
    replicates.check_owner(tmp_path, {"info": {"replicate": 2}}, cfg)  # its own: fine
    replicates.check_owner(tmp_path, None, cfg)  # nothing there: fine


def test_verify_names_the_replicate_step():
    step = verify.step_of("replicates/2/models/A")
    assert step is not None and step.args == " --replicate 2 --model A"
    assert verify.step_of("replicates/summary").rule == "replicates"


@pytest.fixture(scope="module")
def two_streams(smoke_stream, tmp_path_factory):
    """Replicate 1's streams built beside the smoke upstream's replicate 0."""
    from plantbench.data import stream

    root = tmp_path_factory.mktemp("replicate streams") / "results"
    shutil.copytree(smoke_stream["root"] / "results", root)
    cfg = config.deep_merge(smoke_stream["cfg"], {"results": str(root), "replicates": 2})
    one = replicates.select(cfg, 1)
    stream.build(one, Paths(one))
    return {r: stream.open_stream(Paths(replicates.select(cfg, r)).stream("A")) for r in (0, 1)}


def test_replicate_streams_differ_only_in_background(two_streams):
    s0, s1 = two_streams[0], two_streams[1]
    m0, m1 = s0.manifest, s1.manifest
    assert (m0["kind"].to_numpy() == m1["kind"].to_numpy()).all()  # the same slots
    docs = (m0["kind"] != "background").to_numpy()
    assert (m0["doc_id"] == m1["doc_id"]).all()
    w0, w1 = np.asarray(s0.windows), np.asarray(s1.windows)
    for i in np.flatnonzero(docs):  # the same document; its padding is background text
        n = int(m0["doc_tokens"].iloc[i])
        assert n > 0 and (w0[i, :n] == w1[i, :n]).all()
    assert (w0[~docs] != w1[~docs]).any(axis=1).mean() > 0.9  # another background order
    assert s1.meta["info"]["replicate"] == 1 and "replicate" not in s0.meta["info"]
