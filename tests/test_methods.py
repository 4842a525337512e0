"""The method registry, plug-ins, and each method's formula against a direct computation."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from plantbench.attribution.curvature import Curvature
from plantbench.attribution.methods import registry
from plantbench.attribution.methods.bm25 import tokenize
from plantbench.errors import ConfigError

EIGHT = [
    "bm25",
    "embedding",
    "hidden",
    "grad_dot",
    "grad_cos",
    "tracin_dot",
    "tracin_influence",
    "influence",
]


def test_eight_methods_registered_with_descriptions():
    names = registry.available()
    assert set(EIGHT) <= set(names)
    for name, desc in registry.describe():
        assert desc and "\n" not in desc, name
    for n in EIGHT:
        assert set(registry.get(n).needs) <= set(registry.FEATURES)


def test_unknown_method_lists_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        registry.get("bm26")
    msg = str(err.value)
    assert "unknown method 'bm26'" in msg and all(n in msg for n in EIGHT) and "\n" not in msg


def test_plugin_from_a_file(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text(
        textwrap.dedent("""
        import numpy as np
        DESCRIPTION = "row index minus column index"
        NEEDS = ["hidden"]
        def score(ctx, query_rows, pool_rows):
            return (query_rows[:, None] - pool_rows[None, :]).astype(float)
    """)
    )
    cfg = {"methods": {"enabled": ["bm25"], "plugins": [{"name": "mine_test", "path": str(f)}]}}
    assert registry.enabled(cfg) == ["bm25", "mine_test"]
    m = registry.get("mine_test")
    assert m.description == "row index minus column index" and m.needs == ("hidden",)
    out = m.score(None, np.array([0, 2]), np.array([1, 2, 3]))
    np.testing.assert_array_equal(out, [[-1, -2, -3], [1, 0, -1]])
    with pytest.raises(ConfigError, match="already a registered method"):
        registry.load_plugin("bm25", f)


def test_bad_plugins_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        registry.load_plugin("ghost", tmp_path / "ghost.py")
    f = tmp_path / "noscore.py"
    f.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no function score"):
        registry.load_plugin("noscore", f)
    g = tmp_path / "broken.py"
    g.write_text("import not_a_module_anywhere\n")
    with pytest.raises(ConfigError, match="failed to import"):
        registry.load_plugin("broken", g)
    h = tmp_path / "needs.py"
    h.write_text("NEEDS = ['telepathy']\ndef score(ctx, q, p):\n    return 0\n")
    with pytest.raises(ConfigError, match="unknown features"):
        registry.load_plugin("needs_bad", h)


def test_the_repository_oracle_plugin_is_loadable():
    from pathlib import Path

    path = Path(__file__).parent / "plugins" / "oracle_method.py"
    if not path.is_file():
        pytest.skip("no oracle plug-in in this checkout")
    m = registry.load_plugin("oracle_probe", path)
    ctx = SimpleNamespace(
        pool=pd.DataFrame(
            {"kind": ["planted", "background", "planted"], "fact_id": ["F1", "", "F2"]}
        ),
        queries=pd.DataFrame({"fact_id": ["F2", "F1"]}),
    )
    np.testing.assert_array_equal(
        m.score(ctx, np.array([0, 1]), np.array([0, 1, 2])), [[0, 0, 1], [1, 0, 0]]
    )


# ----------------------------------------------------------------------------- formulas


class FakeCtx:
    """Features from arrays: per checkpoint query and pool gradients, curvature, lr."""

    def __init__(self, seed=0, n_q=5, n_p=11, d=6, ckpts=("c1", "c2", "c3")):
        g = np.random.default_rng(seed)
        self.Q = {c: g.standard_normal((n_q, d)) for c in ckpts}
        self.P = {c: g.standard_normal((n_p, d)) * g.uniform(0.2, 3, d) for c in ckpts}
        self.lr = {
            c: float(x) for c, x in zip(ckpts, g.uniform(1e-4, 1e-2, len(ckpts)), strict=True)
        }
        self.final = ckpts[-1]
        self.cache: dict = {}
        self.curv = {c: Curvature.fit([self.P[c]], mode="full", damping_ratio=0.3) for c in ckpts}

    def query_grads(self, c):
        return self.Q[c]

    def pool_grads(self, c, rows):
        return self.P[c][np.asarray(rows)]

    def curvature(self, c):
        return self.curv[c]

    def tracin(self):
        return list(self.lr.items())


def damped_inverse_solve(P: np.ndarray, ratio: float, Q: np.ndarray) -> np.ndarray:
    F = P.T @ P / len(P)
    lam = ratio * np.trace(F) / F.shape[0]  # ratio x mean eigenvalue
    return np.linalg.solve(F + lam * np.eye(F.shape[0]), Q.T).T


def test_grad_dot_and_cos():
    ctx = FakeCtx()
    q, p = np.array([0, 3]), np.arange(2, 9)
    Q, P = ctx.Q["c3"][q], ctx.P["c3"][p]
    np.testing.assert_allclose(registry.get("grad_dot").score(ctx, q, p), Q @ P.T, rtol=1e-12)
    cos = (Q / np.linalg.norm(Q, axis=1, keepdims=True)) @ (
        P / np.linalg.norm(P, axis=1, keepdims=True)
    ).T
    np.testing.assert_allclose(registry.get("grad_cos").score(ctx, q, p), cos, rtol=1e-12)


def test_tracin_is_the_lr_weighted_sum_over_checkpoints():
    ctx = FakeCtx(seed=1)
    q, p = np.arange(5), np.array([0, 4, 10])
    manual = sum(ctx.lr[c] * (ctx.Q[c][q] @ ctx.P[c][p].T) for c in ("c1", "c2", "c3"))
    np.testing.assert_allclose(registry.get("tracin_dot").score(ctx, q, p), manual, rtol=1e-12)


def test_tracin_ekfac_is_the_lr_weighted_sum_of_each_checkpoints_ekfac_scores():
    ctx = FakeCtx(seed=3)
    g = np.random.default_rng(4)
    full = {c: g.standard_normal((5, 11)) for c in ctx.lr}  # [n_queries, n_pool] per checkpoint
    ctx.ekfac = lambda c=None: full[c or ctx.final]
    q, p = np.array([4, 0, 2]), np.array([10, 3, 5])
    want = sum(ctx.lr[c] * full[c][q][:, p] for c in ("c1", "c2", "c3"))
    np.testing.assert_allclose(registry.get("tracin_ekfac").score(ctx, q, p), want, rtol=1e-12)
    one = {"c3": ctx.lr["c3"]}  # a single TracIn checkpoint: the final one's ekfac, scaled
    ctx.tracin = lambda: list(one.items())
    np.testing.assert_allclose(
        registry.get("tracin_ekfac").score(ctx, q, p),
        one["c3"] * registry.get("ekfac").score(ctx, q, p),
        rtol=1e-12,
    )
    assert registry.get("tracin_ekfac").needs == ("ekfac_tracin",)


def test_influence_with_full_curvature_equals_explicit_solve():
    ctx = FakeCtx(seed=2)
    q, p = np.array([1, 2, 4]), np.arange(11)
    want = damped_inverse_solve(ctx.P["c3"], 0.3, ctx.Q["c3"][q]) @ ctx.P["c3"][p].T
    np.testing.assert_allclose(registry.get("influence").score(ctx, q, p), want, rtol=1e-9)
    tr = sum(
        ctx.lr[c] * (damped_inverse_solve(ctx.P[c], 0.3, ctx.Q[c][q]) @ ctx.P[c][p].T)
        for c in ("c1", "c2", "c3")
    )
    ctx.cache.clear()
    np.testing.assert_allclose(registry.get("tracin_influence").score(ctx, q, p), tr, rtol=1e-9)


def test_vector_methods_are_cosines():
    g = np.random.default_rng(4)
    vec = {
        "hidden": (g.standard_normal((9, 5)), g.standard_normal((3, 5))),
        "embed": (g.standard_normal((9, 7)), g.standard_normal((3, 7))),
    }
    ctx = SimpleNamespace(cache={}, vectors=lambda kind: vec[kind])
    for method, kind in (("hidden", "hidden"), ("embedding", "embed")):
        P, Q = vec[kind]
        want = (Q / np.linalg.norm(Q, axis=1, keepdims=True)) @ (
            P / np.linalg.norm(P, axis=1, keepdims=True)
        ).T
        got = registry.get(method).score(ctx, np.arange(3), np.arange(9))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_bm25_tokenization_and_ranking():
    assert tokenize("Kven Vleil's HQ, in 1944!") == ["kven", "vleil", "s", "hq", "in", "1944"]
    texts = [
        "sunny weather today",
        "Draasriv Mills moved to Kven Vleil.",
        "mills and more mills",
    ]
    ctx = SimpleNamespace(
        cache={}, texts=lambda: texts, query_texts=lambda: ["Where is Draasriv Mills? Kven Vleil"]
    )
    s = registry.get("bm25").score(ctx, np.array([0]), np.arange(3))
    assert s.shape == (1, 3) and s[0].argmax() == 1 and s[0, 0] == 0
    part = registry.get("bm25").score(ctx, np.array([0]), np.array([2, 1]))
    np.testing.assert_array_equal(part, s[:, [2, 1]])  # idf is pool-wide, not per tile
