"""Dense recall windows, the stream's loss masks, and the shared prefix trained once."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from micro_study import micro_cfg
from plantbench import config, io, layout
from plantbench.data import corpus, facts, recall, stream, tokenizer
from plantbench.errors import ArtifactError, ConfigError
from plantbench.model import pretrain
from plantbench.paths import MODELS, Paths

RECALL = {"prefix_share": 1.0, "paired_share": 0.1, "ramp": 0.5}


def _cfg(root: Path, **stream_over: object) -> dict:
    return micro_cfg(
        root,
        stream={"window": 256, "recall": {**RECALL, **stream_over}},
        train={"steps": 24, "prefix_steps": 8, "checkpoint_every_steps": 8},
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Paths]:
    """facts .. stream of a micro study with a prefix of recall windows."""
    cfg = _cfg(tmp_path_factory.mktemp("recall") / "results")
    p = Paths(cfg)
    facts.run(cfg, p.facts)
    corpus.run(cfg, p.corpus)
    tokenizer.run(cfg, p.corpus, p.tokenizer)
    stream.build(cfg, p)
    return cfg, p


def _mode(cfg: dict, loss: str) -> dict:
    return config.deep_merge(cfg, {"stream": {"recall": {"loss": loss}}})


def _tables(p: Paths) -> dict:
    names = ("facts", "documents", "distractors", "candidates")
    return {n: io.read_parquet(p.facts / f"{n}.parquet") for n in names}


def test_recall_windows_carry_loss_on_their_answers_only(built) -> None:
    cfg, p = built
    tok = tokenizer.load(p.tokenizer)
    w = recall.RecallGenerator(_mode(cfg, "answers"), _tables(p), tok).window(3, 1.0)
    assert w.ids.dtype == tokenizer.token_dtype(tok.get_vocab_size()) == np.uint16  # compact
    text = tok.decode(w.ids.tolist())
    targets = tok.decode(w.ids[w.mask == 1].tolist())
    assert w.queries >= 1 and w.mask[0] == 0 and w.mask.sum() < (w.ids != 0).sum() / 2
    # every target token belongs to an answer that the window's context states
    for answer in targets.split():
        assert text.count(answer) >= 2, answer
    assert "Question" not in targets and "\n" not in targets


def test_queries_mode_adds_the_prompts_but_never_the_context(built) -> None:
    cfg, p = built
    tok = tokenizer.load(p.tokenizer)
    tables = _tables(p)
    ans = recall.RecallGenerator(_mode(cfg, "answers"), tables, tok).window(5, 1.0)
    q = recall.RecallGenerator(_mode(cfg, "queries"), tables, tok).window(5, 1.0)
    assert np.array_equal(ans.ids, q.ids)  # the same window, another mask
    assert (q.mask >= ans.mask).all() and q.mask.sum() > ans.mask.sum()
    first_line = tok.decode(q.ids[: np.flatnonzero(q.mask)[0]].tolist())
    assert "Question" not in first_line.split("\n")[0]  # the context carries no loss


def test_a_recall_window_is_a_pure_function_of_its_index_and_stage(built) -> None:
    cfg, p = built
    tok = tokenizer.load(p.tokenizer)
    g1 = recall.RecallGenerator(cfg, _tables(p), tok)
    g2 = recall.RecallGenerator(cfg, _tables(p), tok)
    a, b = g1.window(11, 0.3), g2.window(11, 0.3)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.mask, b.mask)
    assert not np.array_equal(g1.window(12, 0.3).ids, a.ids)


def test_the_curriculum_raises_k_from_one_to_the_context_size() -> None:
    assert list(recall.k_distribution(0.0, 4)) == [1.0, 0.0, 0.0, 0.0]
    assert recall.k_distribution(0.3, 4)[1] > 0 and recall.k_distribution(0.3, 4)[2] == 0
    final = recall.k_distribution(1.0, 4)
    assert np.allclose(final, [0.1, 0.2, 0.3, 0.4])


def test_no_recall_window_holds_a_grid_name_s_tokens(built) -> None:
    cfg, p = built
    s = stream.open_stream(p.stream("A"))
    tok = tokenizer.load(p.tokenizer)
    guard = recall.GridGuard(recall.grid_sequences(tok, _tables(p)["facts"]))
    rows = np.flatnonzero(s.manifest["kind"].to_numpy() == "recall")
    assert len(rows) == sum(layout.recall_counts(cfg).values()) > 0
    assert all(guard.find(np.asarray(s.windows[i])) is None for i in rows)
    # the guard does find one where it is
    seq = recall.grid_sequences(tok, _tables(p)["facts"])[0]
    assert guard.find(np.array([5, *seq, 7])) == seq


def test_the_stream_hashes_masks_with_their_windows_and_the_prefix_is_shared(built) -> None:
    cfg, p = built
    a, b = (stream.open_stream(p.stream(m)) for m in MODELS)
    P = layout.prefix_windows(cfg)
    assert (a.manifest["kind"].to_numpy()[:P] == "recall").all()  # prefix_share 1.0
    assert np.array_equal(a.manifest["hash"][:P], b.manifest["hash"][:P])
    planted = np.flatnonzero(a.manifest["kind"].to_numpy() == "planted")
    assert planted.min() >= P  # the grid is read after the fork
    mask = a.loss_mask(range(P))
    assert mask.shape == (P, a.windows.shape[1]) and 0 < mask.sum() < mask.size * 0.75
    assert (mask[:, 0] == 0).all()  # the context's first line never carries loss
    assert (a.loss_mask(planted) == 1).all()  # documents keep the full loss
    flipped = mask.copy()
    flipped[0, np.flatnonzero(mask[0])[0]] = 0  # another mask: another hash
    from plantbench.hashing import window_hashes

    rows = np.array([0])
    h0 = window_hashes(np.asarray(a.windows[:1]), mask[:1], rows)
    h1 = window_hashes(np.asarray(a.windows[:1]), flipped[:1], rows)
    assert h0[0] == a.manifest["hash"][0] != h1[0]


def test_batch_shows_the_loss_each_window_carries(built) -> None:
    cfg, p = built
    s = stream.open_stream(p.stream("A"))
    text = stream.format_batch(s, 0, tokenizer.load(p.tokenizer))
    assert "recall" in text and " loss " in text.splitlines()[1]


def test_the_prefix_and_the_fork_give_the_twin_a_straight_run_gives(built, tmp_path) -> None:
    """The shared prefix trained once, then twin A from its state, is bitwise twin A trained
    from step 0 on its own stream."""
    cfg, p0 = built
    root = tmp_path / "results"
    shutil.copytree(p0.shared, root)
    cfg = {**cfg, "results": str(root)}
    p = Paths(cfg)
    meta = pretrain.train(cfg, p, pretrain.PREFIX, threads=1)
    assert meta["info"]["steps"] == layout.prefix_steps(cfg)
    forked = pretrain.train(cfg, p, "A", threads=1)
    w_fork = pretrain.load_state(p.train_state("A") / pretrain.STATE)["model"]
    assert forked["inputs"]["prefix"] == meta["hash"]
    shutil.rmtree(p.model("A"))
    straight = pretrain.train(cfg, p, "A", threads=1, fork=False)
    w_straight = pretrain.load_state(p.train_state("A") / pretrain.STATE)["model"]
    assert all(torch.equal(w_fork[k], w_straight[k]) for k in w_fork)
    assert forked["hash"] == straight["hash"]  # the same checkpoints and loss log, byte for byte


def test_a_fork_state_of_another_config_is_refused(built, tmp_path) -> None:
    cfg, p0 = built
    root = tmp_path / "results"
    shutil.copytree(p0.shared, root)
    cfg = {**cfg, "results": str(root)}
    p = Paths(cfg)
    pretrain.train(cfg, p, pretrain.PREFIX, threads=1)
    other = config.deep_merge(cfg, {"train": {"lr": 1.0e-3}})
    with pytest.raises(ArtifactError, match="rerun the pretrain_prefix step"):
        pretrain.train(other, p, "A", threads=1)


def test_a_recall_share_that_leaves_no_room_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="stream.recall.paired_share"):
        _cfg(tmp_path / "results", paired_share=0.99)  # checking the config refuses it
    assert not (tmp_path / "results").exists()


def test_the_paper_preset_forks_at_its_first_step() -> None:
    """The paper preset's early span starts at 0: no shared prefix, its 11 checkpoints kept."""
    root = Path(__file__).resolve().parents[1]
    cfg = config.load([root / "config.yaml", root / "workflow" / "presets" / "paper.yaml"])
    assert layout.prefix_steps(cfg) == 0 and layout.prefix_windows(cfg) == 0
    assert len(layout.checkpoint_steps(cfg["train"])) == 11


def test_the_prefix_is_byte_identical_when_trained_again(built, tmp_path) -> None:
    """fork.pt holds every RNG state: seeded, so a second run writes the same bytes."""
    cfg, p0 = built
    forks = []
    for name in ("one", "two"):
        root = tmp_path / name / "results"
        shutil.copytree(p0.shared, root)
        p = Paths({**cfg, "results": str(root)})
        meta = pretrain.train({**cfg, "results": str(root)}, p, pretrain.PREFIX, threads=1)
        forks.append(((p.model(pretrain.PREFIX) / pretrain.FORK).read_bytes(), meta["hash"]))
    assert forks[0] == forks[1]
