"""LoGra projected per-example gradients and the sharded gradient store."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from plantbench.attribution.gradients.capture import example_losses, projected_grads
from plantbench.attribution.gradients.projector import (
    Projector,
    check_blocks_nonzero,
    choose_module_dims,
)
from plantbench.attribution.gradients.reference import (
    dense_random_projection,
    exact_grads_flat,
    exact_grads_projected,
    rademacher_block,
)
from plantbench.attribution.gradients.store import GRADS_FILE, SHARD_JSON, GradientStore
from plantbench.attribution.gradients.writer import ShardWriter, extract_to_shard, shard_identity
from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.model.modeling import block_linear_names, build_model, llama_config

T = 12
V = 64


def tiny_model(attn: str = "eager") -> torch.nn.Module:
    cfg = llama_config(
        {
            "n_embd": 32,
            "intermediate": 64,
            "n_layer": 2,
            "n_head": 2,
            "tie_embeddings": True,
            "rope_theta": 10000.0,
        },
        V,
        T,
        bos=0,
        eos=1,
        pad=2,
        attn=attn,
    )
    m = build_model(cfg, 1234)
    m.eval()
    return m


@pytest.fixture(scope="module")
def model64():
    return tiny_model().double()


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, V, (5, T), generator=g)
    loss_mask = torch.rand(5, T, generator=g) > 0.35  # partial mask
    attn = torch.ones(5, T, dtype=torch.long)
    attn[1, 9:] = 0  # right padded
    attn[3, :4] = 0  # left padded
    ids[1, 9:] = 2
    ids[3, :4] = 2
    return ids, loss_mask, attn


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_hook_gradient_equals_dense_projection_of_exact_gradient(model64, batch):
    ids, loss_mask, attn = batch
    proj = Projector.from_model(model64, seed=11, k_in=4, k_out=3)  # k_in != k_out on purpose
    fast = projected_grads(model64, proj, ids, loss_mask, attn, dtype=torch.float64)
    exact = exact_grads_projected(model64, proj, ids, loss_mask, attn, dtype=torch.float64)
    assert fast.shape == (5, 14 * 12)
    kinds = set()
    for name in proj.module_names:
        sl = proj.slices[name]
        assert exact[:, sl].norm() > 0, name
        for n in range(5):
            assert rel(fast[n, sl], exact[n, sl]) < 1e-10, (name, n)
        kinds.add(name.rsplit(".", 1)[-1])
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    check_blocks_nonzero(fast, proj)
    # the loss mask really matters (the comparison above is not vacuous)
    full = projected_grads(
        model64, proj, ids, torch.ones_like(loss_mask), attn, dtype=torch.float64
    )
    assert rel(full, fast) > 1e-3


def test_exact_flat_gradient_is_each_examples_own_weight_gradient(model64, batch):
    ids, loss_mask, attn = batch
    names = block_linear_names(model64)
    flat = exact_grads_flat(model64, names, ids, loss_mask, attn)
    weights = [dict(model64.named_modules())[n].weight for n in names]
    assert flat.shape == (5, sum(w.numel() for w in weights))
    for i in (1, 3):  # the padded examples, through an independent path (plain .backward())
        model64.zero_grad()
        loss = example_losses(model64, ids[i : i + 1], loss_mask[i : i + 1], attn[i : i + 1])
        loss.sum().backward()
        want = torch.cat([w.grad.reshape(-1) for w in weights])
        assert rel(flat[i], want) < 1e-12, i
    model64.zero_grad(set_to_none=True)
    assert rel(flat[0], flat[2]) > 0.1  # different examples, different gradients


def _assembled_r(seed: int, p: int, d: int, block: int) -> torch.Tensor:
    sizes = [min(block, p - s) for s in range(0, p, block)]
    return torch.cat([rademacher_block(seed, b, r, d, torch.float64) for b, r in enumerate(sizes)])


def test_dense_random_projection_is_g_times_a_seeded_rademacher_matrix():
    p, d, block = 150, 13, 32  # 4 full blocks + 22 rows; 13 bits per row: unaligned bytes
    g = torch.randn(3, p, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = _assembled_r(7, p, d, block)
    assert r.shape == (p, d)
    assert torch.equal(r.abs(), torch.full_like(r, 1 / math.sqrt(d)))  # +-1/sqrt(D) only
    assert abs(float(r.sign().mean())) < 0.1
    for b in range(1, 5):  # every block from its own generator (no repeated row pattern)
        assert not torch.equal(r[b * block : b * block + 22], r[:22]), b
    gram = r.T @ r  # unstructured: columns nearly orthogonal, diagonal exactly P/D
    assert torch.allclose(gram.diagonal(), torch.full((d,), p / d, dtype=torch.float64))
    assert float((gram - torch.diag(gram.diagonal())).abs().max()) < 0.5 * p / d
    want = g @ r
    times: dict[str, float] = {}
    for tile in (1, 3, 7, 32, 1000):  # the processing tile does not change the result
        got = dense_random_projection(g, d, 7, block_rows=block, tile_rows=tile, times=times)
        assert rel(got, want) < 1e-13, tile
    assert times["generate"] > 0 and times["matmul"] > 0
    # deterministic; another seed (or block size) is another matrix; fewer rows = leading rows
    assert torch.equal(
        dense_random_projection(g, d, 7, block_rows=block),
        dense_random_projection(g, d, 7, block_rows=block),
    )
    assert rel(dense_random_projection(g, d, 8, block_rows=block), want) > 0.5
    assert rel(dense_random_projection(g, d, 7, block_rows=block + 1), want) > 0.5
    assert (
        rel(dense_random_projection(g[:, :70], d, 7, block_rows=block), g[:, :70] @ r[:70]) < 1e-13
    )


def test_dense_random_projection_preserves_norms():
    g = torch.randn(4, 4096, generator=torch.Generator().manual_seed(1))
    y = dense_random_projection(g, 256, 3, block_rows=1000, tile_rows=300)
    ratio = (y.norm(dim=1) / g.norm(dim=1)) ** 2  # E|g R|^2 = |g|^2, rel. std sqrt(2/256)
    assert y.dtype == torch.float32 and bool(((ratio > 0.6) & (ratio < 1.4)).all()), ratio


def test_batched_equals_one_at_a_time_with_padding(model64, batch):
    ids, loss_mask, attn = batch
    proj = Projector.from_model(model64, seed=3)
    model32 = tiny_model()
    for model, dtype, tol in ((model64, torch.float64, 1e-12), (model32, torch.float32, 1e-5)):
        together = projected_grads(model, proj, ids, loss_mask, attn, dtype=dtype)
        for n in range(ids.shape[0]):
            real = attn[n].bool()  # the example alone, with its padding removed
            alone = projected_grads(
                model, proj, ids[n : n + 1, real], loss_mask[n : n + 1, real], dtype=dtype
            )
            assert rel(together[n], alone[0]) < tol, (dtype, n)


def test_model_state_restored_and_eager_required(batch):
    ids, loss_mask, _ = batch
    m = tiny_model()
    m.train()
    proj = Projector.from_model(m, seed=0)
    projected_grads(m, proj, ids, loss_mask)
    assert m.training and all(p.requires_grad for p in m.parameters())
    assert all(p.grad is None for p in m.parameters())  # parameter grads never computed
    with pytest.raises(PlantbenchError, match="attn='eager'"):
        projected_grads(tiny_model("sdpa"), proj, ids, loss_mask)


def test_projection_regenerates_from_seed_and_is_never_zero(model64):
    a = Projector.from_model(model64, seed=42)
    b = Projector.from_model(model64, seed=42)
    c = Projector.from_model(model64, seed=43)
    assert a.module_names == block_linear_names(model64)
    assert a.dims == 14 * 64 and a.module_dims == [(8, 8)] * 14
    for name in a.module_names:
        for side in ("in", "out"):
            pa = a.matrix(name, side, torch.float64)
            assert torch.equal(pa, b.matrix(name, side, torch.float64))
            assert not torch.equal(pa, c.matrix(name, side, torch.float64))
            k = pa.shape[0]
            # N(0, 1/k) entries: squared column norms average ~1 (norm preserving)
            assert 0.7 < float((pa**2).sum(0).mean()) < 1.3, (name, side, k)
    # the in/out matrices of different modules are different draws
    n0, n1 = a.module_names[:2]
    assert not torch.equal(a.matrix(n0, "in"), a.matrix(n1, "in"))
    a.check()
    zeroed = Projector.from_model(model64, seed=42)
    zeroed.matrix(n1, "out", torch.float64).zero_()  # simulate a projection that vanished
    with pytest.raises(ArtifactError, match=n1):
        zeroed.check()


def test_check_blocks_nonzero_catches_a_dead_block(model64, batch):
    ids, loss_mask, attn = batch
    proj = Projector.from_model(model64, seed=1)
    g = projected_grads(model64, proj, ids, loss_mask, attn, dtype=torch.float64).numpy()
    check_blocks_nonzero(g, proj)
    name = proj.module_names[5]
    g[:, proj.slices[name]] = 0
    with pytest.raises(ArtifactError, match=name):
        check_blocks_nonzero(g, proj)


def test_choose_module_dims():
    assert choose_module_dims(15360, 60) == (16, 16)
    assert choose_module_dims(1792, 28) == (8, 8)
    assert choose_module_dims(96, 1) == (8, 12)
    with pytest.raises(PlantbenchError):
        choose_module_dims(10, 28)


# --------------------------------------------------------------------------- store


def ident(proj, **over):
    base = dict(
        dtype="float32",
        checkpoint="final",
        checkpoint_step=1200,
        manifest_hash="m1",
        config_hash="c1",
        model="A",
    )
    base.update(over)
    return shard_identity(proj, **base)


def write_synthetic(path, keys, identity, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((len(keys), identity["dims"])).astype(np.float32)
    w = ShardWriter(path, keys, identity)
    for a, b in w.pending_batches(3):
        w.write(a, g[a:b])
    w.finalize()
    return g


def test_window_features_do_not_depend_on_shard_or_batch(model64, tmp_path):
    g = torch.Generator().manual_seed(9)
    windows = torch.randint(3, V, (10, T), generator=g).numpy()
    keys = np.array([105, 3, 77, 8, 41, 600, 12, 19, 250, 7])
    proj = Projector.from_model(model64, seed=17)
    idt = ident(proj)
    extract_to_shard(model64, proj, windows[:4], keys[:4], tmp_path / "a0", idt, batch_rows=3)
    extract_to_shard(model64, proj, windows[4:], keys[4:], tmp_path / "a1", idt, batch_rows=4)
    extract_to_shard(model64, proj, windows[:7], keys[:7], tmp_path / "b0", idt, batch_rows=2)
    extract_to_shard(model64, proj, windows[7:], keys[7:], tmp_path / "b1", idt, batch_rows=1)
    sa = GradientStore.open([tmp_path / "a1", tmp_path / "a0"])  # order given does not matter
    sb = GradientStore.open([tmp_path / "b0", tmp_path / "b1"])
    assert sorted(sa.keys.tolist()) == sorted(keys.tolist()) == sorted(sb.keys.tolist())
    ra, rb = sa.get(keys), sb.get(keys)
    np.testing.assert_allclose(ra, rb, rtol=1e-6, atol=1e-7 * np.abs(ra).max())
    alone = projected_grads(
        model64,
        proj,
        torch.as_tensor(windows[5:6]),
        torch.ones(1, T, dtype=torch.bool),
        dtype=torch.float64,
    ).numpy()
    np.testing.assert_allclose(
        sa.get([keys[5]])[0],
        alone[0].astype(np.float32),
        rtol=1e-6,
        atol=1e-7 * np.abs(alone).max(),
    )
    check_blocks_nonzero(ra, proj)
    # streaming in chunks returns every row exactly once, keyed
    seen = np.concatenate([k for k, _ in sa.chunks(3)])
    assert sorted(seen.tolist()) == sorted(keys.tolist())
    assert sa.block_sizes == [64] * 14


def test_store_roundtrip_float16_and_layout(model64, tmp_path):
    proj = Projector.from_model(model64, seed=1)
    idt = ident(proj, dtype="float16")
    g = write_synthetic(tmp_path / "s0", [4, 5, 6, 7, 8], idt)
    meta = json.loads((tmp_path / "s0" / SHARD_JSON).read_text())
    assert meta["keys"] == [4, 5, 6, 7, 8] and meta["rows"] == 5 and meta["complete"] is True
    assert meta["projection_seed"] == 1 and meta["dims"] == proj.dims and meta["dtype"] == "float16"
    assert [m[0] for m in meta["modules"]] == proj.module_names
    assert (tmp_path / "s0" / GRADS_FILE).stat().st_size == 5 * proj.dims * 2
    assert not list(tmp_path.glob(".*partial"))  # temp folder renamed away
    s = GradientStore.open([tmp_path / "s0"])
    np.testing.assert_array_equal(s.get([6, 4]), g[[2, 0]].astype(np.float16).astype(np.float32))
    with pytest.raises(ArtifactError, match="window 99"):
        s.get([99])


@pytest.mark.parametrize(
    "field,value",
    [
        ("projection_seed", 2),
        ("checkpoint", "step300"),
        ("checkpoint_step", 300),
        ("manifest_hash", "m2"),
        ("dtype", "float16"),
        ("config_hash", "c2"),
        ("model", "B"),
    ],
)
def test_store_refuses_mismatched_metadata(model64, tmp_path, field, value):
    proj = Projector.from_model(model64, seed=1)
    write_synthetic(tmp_path / "s0", [0, 1, 2], ident(proj))
    if field == "projection_seed":
        other = ident(Projector.from_model(model64, seed=value))
    else:
        other = ident(proj, **{field: value})
    write_synthetic(tmp_path / "s1", [3, 4], other)
    with pytest.raises(ArtifactError) as err:
        GradientStore.open([tmp_path / "s0", tmp_path / "s1"])
    msg = str(err.value)
    assert "\n" not in msg and f"'{field}'" in msg and str(tmp_path / "s1" / SHARD_JSON) in msg


def test_store_refuses_different_module_list_or_dims(model64, tmp_path):
    proj = Projector.from_model(model64, seed=1)
    write_synthetic(tmp_path / "s0", [0, 1], ident(proj))
    write_synthetic(tmp_path / "s1", [2, 3], ident(Projector.from_model(model64, seed=1, k_in=4)))
    with pytest.raises(ArtifactError, match="'modules'"):
        GradientStore.open([tmp_path / "s0", tmp_path / "s1"])
    fewer = Projector(proj.specs[:-1], seed=1)
    write_synthetic(tmp_path / "s2", [4], ident(fewer))
    with pytest.raises(ArtifactError, match="'modules'"):
        GradientStore.open([tmp_path / "s0", tmp_path / "s2"])


def test_store_refuses_overlap_truncation_corruption_and_unfinished(model64, tmp_path):
    proj = Projector.from_model(model64, seed=1)
    idt = ident(proj)
    write_synthetic(tmp_path / "s0", [0, 1, 2], idt)
    write_synthetic(tmp_path / "s1", [2, 3], idt)
    with pytest.raises(ArtifactError, match="window 2"):
        GradientStore.open([tmp_path / "s0", tmp_path / "s1"])

    shutil.copytree(tmp_path / "s0", tmp_path / "cut")
    f = tmp_path / "cut" / GRADS_FILE
    with open(f, "rb+") as fh:
        fh.truncate(f.stat().st_size - 4)
    with pytest.raises(ArtifactError, match="truncated") as err:
        GradientStore.open([tmp_path / "cut"])
    assert str(f) in str(err.value)

    shutil.copytree(tmp_path / "s0", tmp_path / "flip")
    f = tmp_path / "flip" / GRADS_FILE
    data = bytearray(f.read_bytes())
    data[17] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="hash"):
        GradientStore.open([tmp_path / "flip"])

    w = ShardWriter(tmp_path / "half", [10, 11, 12], idt)
    w.write(0, np.ones((1, proj.dims), np.float32))
    with pytest.raises(ArtifactError, match="not written"):
        w.finalize()
    with pytest.raises(ArtifactError, match="unfinished"):
        GradientStore.open([tmp_path / "half"])


def test_shard_writer_resumes_after_interruption(model64, tmp_path):
    proj = Projector.from_model(model64, seed=1)
    idt = ident(proj)
    rng = np.random.default_rng(0)
    g = rng.standard_normal((7, proj.dims)).astype(np.float32)
    w = ShardWriter(tmp_path / "s", list(range(7)), idt)
    w.write(0, g[0:3])
    w.write(5, g[5:7])
    del w  # crash: nothing finalized
    assert not (tmp_path / "s").exists()
    w = ShardWriter(tmp_path / "s", list(range(7)), idt)
    assert w.pending.tolist() == [3, 4]
    assert list(w.pending_batches(10)) == [(3, 5)]
    w.write(3, g[3:5])
    w.finalize()
    np.testing.assert_array_equal(GradientStore.open([tmp_path / "s"]).get(range(7)), g)
    # a finished shard with the same identity is recognised; a new identity restarts the partial
    assert ShardWriter(tmp_path / "s", list(range(7)), idt).complete
    w = ShardWriter(tmp_path / "t", list(range(3)), idt)
    w.write(0, g[:1])
    w = ShardWriter(tmp_path / "t", list(range(3)), ident(proj, checkpoint="other"))
    assert w.pending.tolist() == [0, 1, 2]


def test_store_refuses_overflowing_float16(model64, tmp_path):
    proj = Projector.from_model(model64, seed=1)
    w = ShardWriter(tmp_path / "s", [0], ident(proj, dtype="float16"))
    with pytest.raises(ArtifactError, match="float32"):
        w.write(0, np.full((1, proj.dims), 1e6, np.float32))
