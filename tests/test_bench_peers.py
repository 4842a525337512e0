"""The peer benchmark (`plantbench bench`, group "peers"): a missing peer is skipped with one clear
line, the rows compare ours with each peer (ratio = ours / peer), and, where a peer is installed,
its features on a tiny model have the expected dimension, are finite and have the scale of ours
(no timed assertions: speed on a shared machine is not a property of the code)."""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from plantbench import config
from plantbench.ops.bench import peers as bench_peers
from plantbench.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "tokenizer": {"vocab_size": 300},
    "stream": {"window": 32},
    "model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "intermediate": 64},
    "features": {"projection": "sketch", "grad_dims": 224, "batch_windows": 4},
}  # 14 block linears: the peers' 4 x 4 per module gives D = 224 exactly


def _tiny_cfg(tmp_path: Path) -> dict[str, Any]:
    return config.load([ROOT / "config.yaml"], {**TINY, "results": str(tmp_path / "results")})


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _fake_result(seconds: list[float], peak: float, norm: float, dims: int = 224) -> dict:
    return {
        "setup_seconds": 1.0,
        "projection": f"count sketch into D={dims}",
        "side": 4,
        "seconds": seconds,
        "peak_mb": peak,
        "dims": dims,
        "finite": True,
        "norms": np.full(8, norm),
    }


@pytest.mark.parametrize(
    ("dims", "modules", "side"), [(1792, 28, 8), (4096, 28, 12), (224, 14, 4), (15360, 84, 14)]
)
def test_peer_side_is_the_closest_square_per_module(dims: int, modules: int, side: int) -> None:
    p = bench_peers.peer_side(dims, modules)
    assert p == side
    assert all(abs(modules * p * p - dims) <= abs(modules * q * q - dims) for q in range(1, 64))


def test_paired_speedup_cancels_a_drift_between_rounds() -> None:
    # the machine slows 3x between rounds; within each round theirs takes 1.5x ours
    ours, theirs = [1.0, 3.0, 2.0], [1.5, 4.5, 3.0]
    assert bench_peers.paired_speedup(ours, theirs) == pytest.approx(1.5)
    assert bench_peers.paired_speedup([1.0, 1.0, 1.0], [1.0, 2.0, 9.0]) == 2.0  # the median
    with pytest.raises(ValueError, match="paired rounds"):
        bench_peers.paired_speedup([1.0], [1.0, 2.0])


def test_missing_peers_are_skipped_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _tiny_cfg(tmp_path)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        bench_peers.importlib.util,
        "find_spec",
        lambda name, *a: None if name in bench_peers.PEERS else real_find_spec(name, *a),
    )
    seen: dict[str, Any] = {}

    def measure(cfg: dict, source: dict, *, threads: int, rounds: int, peers: list) -> dict:
        seen.update(peers=peers, n=len(source["ids"]), rounds=rounds, what=source["what"])
        return {"ours": _fake_result([2.0, 1.0, 4.0], 100.0, 5.0)}

    monkeypatch.setattr(bench_peers, "measure", measure)
    with caplog.at_level(logging.INFO, logger="plantbench.ops.bench.peers"):
        rows = bench_peers.run_peers(cfg, Paths(cfg), threads=1, quick=True)
    assert seen["peers"] == ["ours@logra", "floor"] and seen["rounds"] == 3  # no peer
    assert seen["n"] % 4 == 0 and "fresh seeded model" in seen["what"]  # no study under tmp
    for peer in bench_peers.PEERS:
        line = f"peer benchmark: {peer} is not installed (make peers-bench installs it): skipped"
        assert caplog.text.count(line) == 1
    assert rows and all(r["stage"] == "peers" for r in rows)
    assert not any(p in r["what"] for r in rows for p in bench_peers.PEERS)
    best = next(r for r in rows if r["what"].startswith("ours (plantbench"))
    assert best["value"] == seen["n"] / 1.0  # best = the fastest round


def test_peer_rows_put_the_peer_as_reference(tmp_path: Path) -> None:
    cfg = _tiny_cfg(tmp_path)
    source = bench_peers._fresh_source(cfg, 8)
    got = {
        "ours": _fake_result([1.0, 2.0, 3.0], 100.0, 5.0),
        "dattri": _fake_result([2.0, 4.0, 8.0], 400.0, 4.0, dims=200),
    }
    rows = {r["what"]: r for r in bench_peers.rows_of(cfg, source, got, threads=1, rounds=3)}
    best = rows["ours vs dattri: windows/s, best"]
    assert best["value"] == 8.0 and best["reference"] == 4.0 and best["ratio"] == 2.0
    assert rows["ours vs dattri: windows/s, median"]["ratio"] == 2.0
    paired = rows["ours vs dattri: speed-up, median over rounds of the round's ratio"]
    assert paired["value"] == 2.0 and paired["ratio"] == 2.0
    assert rows["ours vs dattri: peak RSS increase"]["ratio"] == 0.25
    label = next(w for w in rows if w.startswith("dattri ") and w.endswith("windows/s, best"))
    assert "D=200" in label and "ours D=224" in label  # both D when they differ
    norm = next(r for w, r in rows.items() if w.startswith("check dattri: mean"))
    assert norm["ratio"] == 0.8


def test_a_failing_peer_is_dropped_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The workers run in this process here (no spawn): ours on the tiny model, and a peer whose
    featurizer raises, as a broken install does."""

    class FakePool:
        def __init__(self, _n: int) -> None: ...
        def __enter__(self) -> FakePool:
            return self

        def __exit__(self, *exc: object) -> None: ...
        def apply(self, fn: Any, args: tuple = ()) -> Any:
            return fn(*args)

    class Ctx:
        Pool = FakePool

    def broken(*_: Any) -> Any:
        raise ImportError("No module named 'simple_parsing'")

    monkeypatch.setattr(bench_peers.mp, "get_context", lambda _kind: Ctx)
    monkeypatch.setattr(bench_peers, "_quiet", lambda: None)  # a worker's, not this process's
    monkeypatch.setenv("TQDM_DISABLE", "1")  # restored after the test
    monkeypatch.setattr(torch, "set_num_threads", lambda _n: None)
    monkeypatch.setitem(bench_peers.FEATURIZERS, "bergson", broken)
    cfg = _tiny_cfg(tmp_path)
    source = bench_peers._fresh_source(cfg, 8)
    with caplog.at_level(logging.WARNING, logger="plantbench.ops.bench.peers"):
        got = bench_peers.measure(cfg, source, threads=1, rounds=2, peers=["bergson"])
    assert list(got) == ["ours"]
    assert "peer benchmark: bergson failed (ImportError" in caplog.text
    ours = got["ours"]
    assert ours["dims"] == 224 and ours["finite"] and len(ours["seconds"]) == 2
    assert all(s > 0 for s in ours["seconds"]) and math.isfinite(ours["peak_mb"])


@pytest.mark.skipif(
    not any(_installed(p) for p in bench_peers.PEERS), reason="no peer installed (make peers-bench)"
)
def test_installed_peers_features_on_a_tiny_model(tmp_path: Path) -> None:
    """Real spawned workers: each installed peer's features have D = 224, are finite and have
    the norm of ours (a batch-size or token-count scaling would be a factor of 4 or 31)."""
    cfg = _tiny_cfg(tmp_path)
    peers = [p for p in bench_peers.PEERS if _installed(p)]
    source = bench_peers._fresh_source(cfg, 8)
    got = bench_peers.measure(cfg, source, threads=1, rounds=2, peers=peers)
    assert set(got) == {"ours", *peers}  # every installed peer ran
    for tool, res in got.items():
        assert res["dims"] == 224 and res["finite"], tool
        assert len(res["seconds"]) == 2 and all(s > 0 for s in res["seconds"]), tool
        assert res["side"] == 4 and math.isfinite(res["peak_mb"]), tool
        ratio = res["norms"].mean() / got["ours"]["norms"].mean()
        assert 0.7 < ratio < 1.4, (tool, ratio)
    rows = bench_peers.rows_of(cfg, source, got, threads=1, rounds=2)
    for peer in peers:
        r = next(r for r in rows if r["what"] == f"ours vs {peer}: windows/s, best")
        assert r["value"] > 0 and r["reference"] > 0 and r["ratio"] == r["value"] / r["reference"]


def test_ours_with_logra_is_compared_only_at_the_peers_side(tmp_path: Path) -> None:
    cfg = _tiny_cfg(tmp_path)
    source = bench_peers._fresh_source(cfg, 8)
    wide = {**_fake_result([8.0, 8.0, 8.0], 900.0, 5.0, dims=14 * 64), "side": 8}
    got = {
        "ours": _fake_result([1.0, 2.0, 3.0], 100.0, 5.0),
        "ours@logra": _fake_result([0.5, 1.0, 1.0], 50.0, 5.0),
        "bergson": _fake_result([2.0, 2.0, 2.0], 400.0, 5.0),
        "bergson@8": wide,
    }
    rows = {r["what"]: r for r in bench_peers.rows_of(cfg, source, got, threads=1, rounds=3)}
    assert rows["ours@logra vs bergson: windows/s, best"]["ratio"] == 4.0  # 16 vs 4 windows/s
    assert rows["ours vs bergson: windows/s, best"]["ratio"] == 2.0
    assert rows["ours vs bergson@8: windows/s, best"]["ratio"] == 8.0
    assert "ours@logra vs bergson@8: windows/s, best" not in rows  # not the same D
    label = next(w for w in rows if w.startswith("bergson@8 ") and w.endswith("best"))
    assert "D=896 (8x8 per module), ours D=224" in label


def test_the_floor_is_the_frozen_pass_and_bounds_every_tool(tmp_path: Path) -> None:
    """The floor's features are each window's summed loss (the unfused loss of the same
    model), its parameters stay as they were, and every tool's time is given over the
    floor's, round by round."""
    import torch

    from plantbench.attribution.gradients.capture import example_losses

    cfg = _tiny_cfg(tmp_path)
    source = bench_peers._fresh_source(cfg, 6)
    model = bench_peers._load({"model": source["model"]})
    flags = [p.requires_grad for p in model.parameters()]
    ids = torch.as_tensor(source["ids"])
    got = bench_peers._floor({"batch": 4}, model, None)(ids)  # batches of 4 and 2
    with torch.no_grad():
        want = example_losses(model, ids, torch.ones_like(ids, dtype=torch.bool))
    assert got.shape == (6, 1) and torch.allclose(got[:, 0], want, rtol=1e-5)
    assert [p.requires_grad for p in model.parameters()] == flags

    fakes = {
        "ours": _fake_result([2.0, 4.0, 2.0], 100.0, 5.0),
        "bergson": _fake_result([3.0, 3.0, 6.0], 400.0, 5.0),
        "floor": _fake_result([1.0, 2.0, 2.0], 10.0, 1.0, dims=1),
    }
    rows = {r["what"]: r for r in bench_peers.rows_of(cfg, source, fakes, threads=1, rounds=3)}
    over = ": time over the floor's, median over rounds of the round's ratio"
    assert rows["ours" + over]["value"] == 2.0  # rounds 2, 2, 1
    assert rows["bergson" + over]["value"] == 3.0  # rounds 3, 1.5, 3
    assert "floor" + over not in rows and not any(w.startswith("ours vs floor") for w in rows)
