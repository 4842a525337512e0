"""Memorizing sweep (issue "Twins that read", item 4): the paired part of both twins retrained
from a finished study's shared prefix under config overrides, then the answer key.

An experiment, not a workflow step. The workflow refuses a prefix state made with another train
config or another stream prefix (``models/prefix/fork.pt``); this script accepts the finished
study's fork for the variant on purpose: only the paired part differs (steps, documents per
fact ...), and the variant's stream prefix differs from the study's only in which
invented names the recall windows avoid (the grid's). Everything else is the package's own
code: ``plantbench config``, ``facts``, ``stream``, ``pretrain`` (both twins at once, one thread
each) and ``causal``.

    python workflow/scripts/memorize_sweep.py STUDY_RESULTS OUT_FOLDER 'YAML OVERRIDES'
    e.g. ... results sweep/s2d2 '{train: {steps: 7360}, facts: {n_docs: [2, 8, 32, 128]}}'

The optimizer's own hyperparameters (weight decay, betas, eps, the peak learning rate) come back
with its state from the fork, so overriding them here changes nothing: a ``train.weight_decay:
0`` variant reproduced the study's answer key bitwise. The schedule's length does follow the
variant (``train.steps``). To change the paired part's peak learning rate, set
``PLANTBENCH_LR_FACTOR`` (default 1): the fork state's learning rates (every param group's
``lr`` and ``initial_lr``, the scheduler's ``base_lrs`` and ``_last_lr``) are scaled by it as it
is loaded; set ``train.lr`` in the overrides to the scaled value too, so the recorded config says
what was used. Each twin prints the learning rates it continues with.

It prints the causal step's recipe summary (``learned_final_loss`` is the learned facts' mean
answer loss per token) and the learned share and answer loss per cell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
LR_FACTOR = float(os.environ.get("PLANTBENCH_LR_FACTOR", "1"))


def plantbench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "plantbench", *args], check=True)


def prepare(study: Path, out: Path, over: dict[str, Any]) -> Path:
    """The variant's config, facts and streams; corpus and tokenizer linked, prefix copied."""
    res = out / "results"
    res.mkdir(parents=True, exist_ok=True)
    (out / "over.yaml").write_text(yaml.safe_dump({**over, "results": str(res)}))
    cfg = out / "config.json"
    plantbench(
        "config", "-c", str(ROOT / "config.yaml"), "-c", str(out / "over.yaml"), "--out", str(cfg)
    )
    for d in ("corpus", "tokenizer"):
        if not (res / d).exists():
            os.symlink((study / d).resolve(), res / d)
    plantbench("facts", "-c", str(cfg))
    plantbench("stream", "-c", str(cfg), "--replicate", "0")
    if not (res / "models/prefix").exists():
        shutil.copytree(study / "models/prefix", res / "models/prefix")
    return cfg


def scale_lr(state: dict[str, Any], factor: float) -> None:
    """The paired part's peak learning rate times ``factor``, in a fork state as loaded."""
    for g in state["optimizer"]["param_groups"]:
        g["lr"] *= factor
        if "initial_lr" in g:
            g["initial_lr"] *= factor
    sched = state["scheduler"]
    sched["base_lrs"] = [b * factor for b in sched["base_lrs"]]
    if "_last_lr" in sched:
        sched["_last_lr"] = [b * factor for b in sched["_last_lr"]]


def pretrain(cfg: Path, model: str) -> int:
    """One twin from the study's fork, its config and stream-prefix hashes accepted."""
    import torch

    from plantbench import cli
    from plantbench.model import pretrain as P
    from plantbench.paths import Paths

    torch.set_num_threads(1)
    conf = json.loads(cfg.read_text())
    load = P.load_state

    def accept(path: Path) -> dict[str, Any] | None:
        state = load(path)
        if state is not None and Path(path).name == P.FORK:
            state["config_hash"] = P.train_config_hash(conf)
            state["stream_hash"] = P.prefix_hash(conf, Paths(conf))
            if LR_FACTOR != 1:
                scale_lr(state, LR_FACTOR)
            lrs = [g["lr"] for g in state["optimizer"]["param_groups"]]
            print(f"{model}: continues from the fork at lr {lrs}", flush=True)
        return state

    P.load_state = accept
    return cli.main(
        ["pretrain", "-c", str(cfg), "--replicate", "0", "--model", model, "--threads", "1"]
    )


def summary(res: Path) -> None:
    import pandas as pd

    facts = pd.read_parquet(res / "causal/facts.parquet")
    meta = json.loads((res / "causal/meta.json").read_text())
    print(json.dumps(meta["info"]["recipe"], indent=1))
    print("learned", int(facts["learned"].sum()), "of", len(facts))
    cells = facts.groupby(["position", "n_docs"]).agg(
        learned=("learned", "mean"), loss=("final_loss", "mean")
    )
    print(cells.round(2).unstack())


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[3] in ("A", "B"):  # one twin, in a process of its own
        sys.exit(pretrain(Path(sys.argv[1]), sys.argv[3]))
    study, out, over = Path(sys.argv[1]), Path(sys.argv[2]), yaml.safe_load(sys.argv[3])
    cfg = prepare(study, out, over)
    twins = [subprocess.Popen([sys.executable, __file__, str(cfg), "-", m]) for m in "AB"]
    if any(p.wait() for p in twins):
        sys.exit("a twin's pretraining failed")
    plantbench("causal", "-c", str(cfg), "--replicate", "0", "--threads", "2")
    summary(out / "results")


if __name__ == "__main__":
    main()
