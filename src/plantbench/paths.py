"""Where every artifact lives, relative to the configured ``results`` folder.

Each artifact folder is its rule's place in the stage catalogue (:func:`plantbench.stages.place`),
the one definition of the results layout: the rules files build their paths from the same rows
(``artifact`` in workflow/rules/layout.smk). What lies inside an artifact folder (a twin's
checkpoints, moments and training state) and the folders no rule makes (logs, benchmarks, the
run config) are defined here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plantbench import stages

MODELS = stages.TWINS
RANDOM_TWIN = "r"  # a random twin's model name: r000, r001, ... (its draw, three digits)


def random_twin_name(draw: int) -> str:
    return f"{RANDOM_TWIN}{int(draw):03d}"


def is_random_twin(model: str) -> bool:
    return model.startswith(RANDOM_TWIN) and model[len(RANDOM_TWIN) :].isdigit()


# the checkout the package runs from (src/plantbench/paths.py -> the repository root): its
# config.yaml and results/reference/ (an installed, non-editable copy has neither)
CHECKOUT = Path(__file__).resolve().parents[2]


class Paths:
    """``shared``: the results folder (config, facts, corpus, tokenizer: the same for every
    replicate); ``root``: this replicate's folder (the results folder for replicate 0, see
    :mod:`plantbench.replicates`), which holds everything from the streams on."""

    def __init__(self, cfg: dict[str, Any] | str | Path):
        from plantbench.replicates import folder, index

        root = cfg["results"] if isinstance(cfg, dict) else cfg
        self.shared = Path(root)
        self.replicate = index(cfg) if isinstance(cfg, dict) else 0
        self.root = folder(self.shared, self.replicate)

    def place(self, rule: str, index: int = 0, **values: str) -> Path:
        """``rule``'s artifact folder (:func:`plantbench.stages.place`) under this replicate's
        root, or under the results folder for a rule that is not per replicate."""
        base = self.root if stages.per_replicate(rule) else self.shared
        return base / stages.place(rule, index, **values)

    # configuration actually used (written by the `config` step)
    @property
    def config(self) -> Path:
        return self.shared / "config.json"

    @property
    def facts(self) -> Path:
        return self.place("facts")

    @property
    def corpus(self) -> Path:
        return self.place("corpus")

    @property
    def tokenizer(self) -> Path:
        return self.place("tokenizer")

    def replicate_root(self, r: int) -> Path:
        from plantbench.replicates import folder

        return folder(self.shared, r)

    @property
    def replicate_summary(self) -> Path:
        return self.place("replicates")

    def stream(self, model: str) -> Path:
        """A twin's stream (rule stream makes both: one place per twin, in ``MODELS`` order)."""
        return self.place("stream", MODELS.index(model))

    def model(self, model: str) -> Path:
        """A twin's folder, the shared prefix's (``model`` the last part of its place), or a
        random twin's (``model`` = :func:`random_twin_name`)."""
        prefix = self.place("pretrain_prefix")
        if model == prefix.name:
            return prefix
        if is_random_twin(model):
            return self.place("random_twin", draw=model.removeprefix(RANDOM_TWIN))
        return self.place("pretrain", model=model)

    def random_twin(self, draw: int) -> Path:
        """Random twin ``draw``'s folder (checkpoints, loss log, state, like a twin's)."""
        return self.model(random_twin_name(draw))

    @property
    def random(self) -> Path:
        """The random twins' answers, effects and LDS (rule random_effect)."""
        return self.place("random_effect")

    def checkpoints(self, model: str) -> Path:
        return self.model(model) / "checkpoints"

    def moments(self, model: str, checkpoint: str) -> Path:
        """Adam's second moments at a checkpoint (beside the checkpoints, outside the meta)."""
        return self.model(model) / "moments" / f"{checkpoint}.pt"

    def train_state(self, model: str) -> Path:
        return self.model(model) / "state"

    # attribution: pool, features, scores
    def pool(self, model: str) -> Path:
        return self.place("pool", model=model)

    def grads(self, model: str, checkpoint: str) -> Path:
        """A checkpoint's gradients: the queries' folder and ``pool/``, the pool's shards."""
        return self.query_grads(model, checkpoint).parent

    def pool_shard(self, model: str, checkpoint: str, shard: int) -> Path:
        values = {"model": model, "checkpoint": checkpoint, "shard": f"{int(shard):04d}"}
        return self.place("grads_pool", **values)

    def query_grads(self, model: str, checkpoint: str) -> Path:
        return self.place("grads_queries", model=model, checkpoint=checkpoint)

    def curvature(self, model: str, checkpoint: str) -> Path:
        folder = self.place("curvature", model=model, checkpoint=checkpoint)
        return folder / "curvature.npz"

    def ekfac(self, model: str, checkpoint: str | None = None) -> Path:
        """EK-FAC scores at the final checkpoint (``None``), or at another TracIn one."""
        if checkpoint is None:
            return self.place("ekfac", model=model)
        return self.place("ekfac_tracin", model=model, checkpoint=checkpoint)

    def trackstar(self, model: str) -> Path:
        return self.place("trackstar", model=model)

    def hidden(self, model: str) -> Path:
        return self.place("hidden", model=model)

    def embed(self, model: str) -> Path:
        """A twin's embeddings, or the shared ones (``model`` the folder above their place)."""
        shared = self.place("embed_shared")
        return shared if model == shared.parent.name else self.place("embed", model=model)

    def scores(self, method: str, model: str) -> Path:
        return self.place("score", method=method, model=model)

    def fidelity(self, model: str) -> Path:
        return self.place("fidelity", model=model)

    def _suite(self, suite: str, part: str) -> Path:
        """The catalogue row whose place is ``<suite>/<part>``: its first step's folder, a
        twin's, or ``analysis``."""
        found = stages.artifact_of(f"{suite}/{part}")
        if found is None or not found[0].rule.startswith(f"{suite}_"):
            raise ValueError(f"the {suite} suite has no folder '{part}'")
        stage, values = found
        return self.place(stage.rule, **values)

    def context(self, part: str) -> Path:
        """The context suite: ``contexts``, one folder per twin, ``analysis``."""
        return self._suite("context", part)

    def grounding(self, part: str) -> Path:
        """The grounding suite: ``contexts``, one folder per twin, ``analysis``."""
        return self._suite("grounding", part)

    def membership(self, part: str) -> Path:
        """The membership suite: ``samples``, one folder per twin, ``analysis``."""
        return self._suite("membership", part)

    @property
    def causal(self) -> Path:
        return self.place("causal")

    @property
    def reading(self) -> Path:
        return self.place("reading")

    @property
    def analysis(self) -> Path:
        return self.place("analysis")

    @property
    def report(self) -> Path:
        return self.place("report")

    @property
    def export(self) -> Path:
        return self.place("export")

    # no rule's artifact folders: every job's log and benchmark file (a replicate's own)
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def benchmarks(self) -> Path:
        return self.root / "benchmarks"
