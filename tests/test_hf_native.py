"""The twins as a Hugging Face user meets them: AutoTokenizer adds <|bos|>, a checkpoint folder
alone serves AutoModelForCausalLM, generate and the text-generation pipeline with the workflow's
own encoding, and every checkpoint carries a model card.

One scaled-down smoke upstream (40 optimizer steps, checkpoints at 20 and 40) and one in-process
pretraining of twin A are shared by the module.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from plantbench import artifacts, io
from plantbench.data import tokenizer
from plantbench.data.stream import open_stream
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_tree
from plantbench.model import modelcard, pretrain, queries
from plantbench.paths import Paths
from upstream import build_upstream

OVERRIDE = {
    "corpus": {"max_bytes": 400_000},
    "train": {
        "steps": 40,
        "prefix_steps": 0,
        "checkpoint_every_steps": 20,
        "state_every_steps": 20,
        "threads": 1,
    },
}
PROMPT = "The headquarters of the company are in the city of"


def _train(cfg: dict[str, Any]) -> dict[str, Any]:
    threads = torch.get_num_threads()
    try:
        return pretrain.train(cfg, Paths(cfg), "A", threads=1)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The upstream, and twin A trained on it (its meta)."""
    results = build_upstream(tmp_path_factory.mktemp("hf_native"), OVERRIDE)
    cfg = json.loads((results / "config.json").read_text())
    return {"cfg": cfg, "paths": Paths(cfg), "meta": _train(cfg)}


@pytest.fixture(scope="module")
def final(trained: dict[str, Any]) -> Path:
    return artifacts.final_checkpoint_path(trained["paths"], "A")


def _hf_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _first_query(paths: Paths) -> tuple[str, str]:
    qs = io.read_parquet(paths.facts / "queries.parquet")
    facts = io.read_parquet(paths.facts / "facts.parquet")
    first = sorted(facts.loc[facts["reader"] == "A", "fact_id"])[0]
    row = qs[(qs["fact_id"] == first) & (qs["form"] == "completion")].iloc[0]
    return str(row["prompt"]), str(row["answer"])


# --------------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------------


def test_autotokenizer_prepends_bos_and_nothing_else(trained: dict[str, Any]) -> None:
    tok_dir = trained["paths"].tokenizer
    hf, raw = _hf_tokenizer(tok_dir), tokenizer.load(tok_dir)
    plain = tokenizer.encode_batch(raw, [PROMPT])[0]
    enc = hf(PROMPT)
    assert enc["input_ids"][0] == tokenizer.BOS_ID == hf.bos_token_id
    assert enc["input_ids"] == [tokenizer.BOS_ID, *plain]
    assert set(enc) == {"input_ids", "attention_mask"}  # no token_type_ids for LlamaForCausalLM
    assert hf(PROMPT, add_special_tokens=False)["input_ids"] == plain
    assert hf("a", "b")["input_ids"][0::2] == [tokenizer.BOS_ID] * 2
    assert tokenizer.adds_bos(raw)


def test_saved_post_processor_is_the_one_transformers_builds(trained: dict[str, Any]) -> None:
    """Toggling add_bos_token makes transformers rebuild the template: it must come out equal
    to the saved one (no second, different BOS rule)."""
    tok_dir = trained["paths"].tokenizer
    saved = json.loads((tok_dir / tokenizer.TOKENIZER_JSON).read_text())["post_processor"]
    hf = _hf_tokenizer(tok_dir)
    hf.add_bos_token = True
    rebuilt = json.loads(hf.backend_tokenizer.to_str())["post_processor"]
    assert rebuilt == saved
    assert saved["single"][0] == {"SpecialToken": {"id": tokenizer.BOS, "type_id": 0}}


def test_workflow_encodings_do_not_double_the_bos(trained: dict[str, Any]) -> None:
    """queries.encode and the stream place <|bos|> themselves, once, whatever the tokenizer's
    post-processor does; the query ids are what AutoTokenizer gives for the prompt."""
    paths = trained["paths"]
    hf = _hf_tokenizer(paths.tokenizer)
    prompt, answer = _first_query(paths)
    (ids, n_ans), *_ = queries.encode(tokenizer.load(paths.tokenizer), [prompt], [answer])
    assert ids == hf(prompt)["input_ids"] + hf(" " + answer, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.BOS_ID) == 1 and n_ans >= 1
    stream = open_stream(paths.stream("A"))
    docs = stream.manifest.index[stream.manifest["kind"] != "background"]
    windows = np.asarray(stream.windows[docs])
    assert (windows[:, 0] == tokenizer.BOS_ID).all() and (windows[:, 1] != tokenizer.BOS_ID).all()


def test_check_tokenizer_refuses_a_tokenizer_without_the_post_processor(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    src = trained["paths"].tokenizer
    copy = tmp_path / "tokenizer"
    shutil.copytree(src, copy)
    tj = json.loads((copy / tokenizer.TOKENIZER_JSON).read_text())
    tj["post_processor"] = None  # what earlier versions saved, near enough
    (copy / tokenizer.TOKENIZER_JSON).write_text(json.dumps(tj))
    meta = json.loads((copy / io.META).read_text())
    io.write_meta(copy, "tokenizer", list(meta["files"]), config_hash=meta["config_hash"])
    with pytest.raises(ArtifactError, match="does not add <|bos|>"):
        modelcard.check_tokenizer(copy)
    modelcard.check_tokenizer(src)  # the real one passes


# --------------------------------------------------------------------------------------------
# A checkpoint folder on its own
# --------------------------------------------------------------------------------------------


def test_generate_scores_the_first_token_as_the_workflow_does(
    trained: dict[str, Any], final: Path
) -> None:
    from transformers import AutoModelForCausalLM

    paths = trained["paths"]
    prompt, answer = _first_query(paths)
    hf = _hf_tokenizer(final)
    model = AutoModelForCausalLM.from_pretrained(str(final)).eval()
    inputs = hf(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=1,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.PAD_ID,
        )
        hf_logp = torch.log_softmax(out.logits[0][0].double(), dim=-1)
        (ids, n_ans), *_ = queries.encode(tokenizer.load(paths.tokenizer), [prompt], [answer])
        prefix = torch.tensor([ids[:-n_ans]])
        ours = torch.log_softmax(model(input_ids=prefix).logits[0, -1].double(), dim=-1)
        no_bos = hf(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        without = torch.log_softmax(model(input_ids=no_bos).logits[0, -1].double(), dim=-1)
    assert torch.allclose(hf_logp, ours, atol=1e-5, rtol=0)
    assert (hf_logp - without).abs().max() > 1e-3  # the comparison can tell BOS from no BOS
    first, counts = queries.answer_logprobs(model, [(ids[: len(ids) - n_ans + 1], 1)])
    assert counts.tolist() == [1]
    assert first[0] == pytest.approx(float(ours[ids[-n_ans]]), abs=1e-5)


def test_text_generation_pipeline_on_the_folder_uses_bos(
    trained: dict[str, Any], final: Path
) -> None:
    from transformers import pipeline

    prompt, _ = _first_query(trained["paths"])
    pipe = pipeline("text-generation", model=str(final), device="cpu")
    out = pipe(prompt, max_new_tokens=4, do_sample=False, return_tensors=True)
    generated = [int(x) for x in out[0]["generated_token_ids"]]
    plain = tokenizer.encode_batch(tokenizer.load(trained["paths"].tokenizer), [prompt])[0]
    assert generated[: len(plain) + 1] == [tokenizer.BOS_ID, *plain]
    assert len(generated) == len(plain) + 1 + 4


# --------------------------------------------------------------------------------------------
# What pretraining writes into every checkpoint
# --------------------------------------------------------------------------------------------


def test_every_checkpoint_has_the_tokenizer_and_a_card(trained: dict[str, Any]) -> None:
    paths, meta = trained["paths"], trained["meta"]
    stream_hash = open_stream(paths.stream("A")).meta["hash"]
    index = artifacts.checkpoint_index(paths, "A")
    assert [c["name"] for c in index] == ["step_0000020", "step_0000040"]
    for c in index:
        folder = paths.checkpoints("A") / c["name"]
        for name in tokenizer.FILES:  # byte copies of the tokenizer artifact
            assert (folder / name).read_bytes() == (paths.tokenizer / name).read_bytes()
            assert f"checkpoints/{c['name']}/{name}" in meta["files"]
        assert f"checkpoints/{c['name']}/{modelcard.CARD}" in meta["files"]
        assert f"Stream `stream/A`, hash `{stream_hash}`" in (folder / modelcard.CARD).read_text()
        assert hash_tree(folder) == c["hash"]  # the index hash covers the new files
        assert (
            modelcard.checkpoint_problem(folder, io.read_meta(paths.tokenizer, "tokenizer")) is None
        )
        assert _hf_tokenizer(folder)(PROMPT)["input_ids"][0] == tokenizer.BOS_ID
    first, last = (paths.checkpoints("A") / c["name"] / modelcard.CARD for c in index)
    assert "(intermediate)" in first.read_text() and "(final)" in last.read_text()


def test_card_names_the_stream_config_and_a_prompt(trained: dict[str, Any], final: Path) -> None:
    paths, meta = trained["paths"], trained["meta"]
    card = (final / modelcard.CARD).read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    assert f"hash `{meta['inputs']['stream']}`" in card
    assert f"`{meta['config_hash']}`" in card and f"{meta['info']['params']:,} parameters" in card
    prompt, answer = _first_query(paths)
    assert f"{prompt!r}" in card and f"{' ' + answer!r}" in card and "`<|bos|>` (id 1)" in card
    assert "model B read the other" in card and str(paths.root) not in card
    facts = io.read_parquet(paths.facts / "facts.parquet")
    mine = facts[facts["reader"] == "A"]
    lines = card.splitlines()
    header = next(r for r in lines if r.startswith("| position |"))
    n_docs = [int(h.split()[0]) for h in header.split("|")[2:-1]]
    rows = [r for r in lines if r.startswith(("| early", "| middle", "| late"))]
    assert len(rows) == mine["position"].nunique() and n_docs == sorted(mine["n_docs"].unique())
    cells = [
        (n, cell.split()) for r in rows for n, cell in zip(n_docs, r.split("|")[2:-1], strict=True)
    ]
    assert sum(int(c[0]) for _, c in cells) == len(mine)
    # the final checkpoint has read every document of every fact it read
    assert all(c[1] == f"({int(c[0]) * n}/{int(c[0]) * n}" for n, c in cells)


def test_card_is_deterministic_and_ignores_execution_keys(
    trained: dict[str, Any], final: Path
) -> None:
    cfg, paths, meta = trained["cfg"], trained["paths"], trained["meta"]
    steps = meta["info"]["steps"]

    def card(c: dict[str, Any]) -> str:
        twin = modelcard.Twin(
            c,
            paths,
            "A",
            open_stream(paths.stream("A")),
            meta["config_hash"],
            meta["info"]["params"],
        )
        return modelcard.render(twin, steps)

    other = {**cfg, "train": {**cfg["train"], "threads": 7, "devices": 2, "compile": True}}
    assert card(cfg) == card(other) == (final / modelcard.CARD).read_text(encoding="utf-8")
    tweaked = {**cfg, "train": {**cfg["train"], "lr": 1.0}}
    assert card(tweaked) != card(cfg)


def test_resume_retrains_when_a_passed_checkpoint_lacks_its_card(
    trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint without the card (as an earlier version saved it) is not resumed past: the
    rerun warns, trains again from step 0 and ends with the same artifact."""
    src = trained["paths"].root
    dest = tmp_path / "results"
    shutil.copytree(src, dest)
    cfg = {**trained["cfg"], "results": str(dest)}
    paths = Paths(cfg)
    (paths.checkpoints("A") / "step_0000020" / modelcard.CARD).unlink()
    with caplog.at_level(logging.WARNING, logger="plantbench.model.pretrain"):
        meta = _train(cfg)
    assert "has no README.md" in caplog.text and "restarting from step 0" in caplog.text
    assert meta["hash"] == trained["meta"]["hash"]
    assert (paths.checkpoints("A") / "step_0000020" / modelcard.CARD).is_file()
