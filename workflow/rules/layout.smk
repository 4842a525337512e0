# Where the workflow's artifacts, logs and benchmarks live, and which files each job reads: the
# rules files' helpers (functions live apart from rules: snakemake --lint). Every artifact path
# comes from the stage catalogue (src/plantbench/stages.py: each rule's `places`, the one
# definition of the results layout, which the CLI's plantbench.paths.Paths reads too) through
# artifact() below; no rules file spells an artifact folder. Shard counts, checkpoint names and
# every method's feature files are pure functions of the config (src/plantbench/layout.py, no
# torch: parsing the job graph imports no stage), so there is no checkpoint rule.
import plantbench.attribution.methods.registry as _pbmethods
import plantbench.layout as _pblayout
import plantbench.stages as _pbstages


def log_of(name):
    return f"{R}/logs/{name}.log"


def bench_of(name):
    return f"{R}/benchmarks/{name}.tsv"


# Replicates (plantbench.replicates): every rule from the streams on runs once per replicate.
# The `rep` wildcard is the replicate's folder under the results folder: empty for replicate 0
# (the study as configured), `replicates/<r>/` for the others; RR is a replicate's root. Each
# replicate's jobs are jobs of their own (on Slurm: separate submissions).
REPS = [_pbrep.wildcard(r) for r in range(_pbrep.count(config))]
RR = f"{R}/{{rep}}"


wildcard_constraints:
    rep=_pbrep.WILDCARD,


def artifact(rule, file=_pblayout.META, index=0, **values):
    """``file`` in ``rule``'s artifact folder (its place number ``index`` in the stage catalogue,
    plantbench.stages.place) with the wildcards in ``values`` filled in and the others left as
    wildcards: under the replicate's root RR (``rep=`` fills the `rep` wildcard) for a
    per-replicate rule, else under the results folder."""
    rep = values.pop("rep", "{rep}")
    root = f"{R}/{rep}" if _pbstages.per_replicate(rule) else f"{R}/"
    return f"{root}{_pbstages.place(rule, index, **values)}/{file}"


def twins(rule, file=_pblayout.META, **values):
    """``file`` in each twin's folder of ``rule``, A then B: its `model` wildcard filled, or for
    the stream (one job, one place per twin) each of its places."""
    if "model" in _pbstages.BY_RULE[rule].wildcards:
        return [artifact(rule, file, model=m, **values) for m in MODELS]
    return [artifact(rule, file, i, **values) for i in range(len(MODELS))]


def stream_of(wildcards):
    """A job's twin's stream (the stream's one job makes both, one place each, A then B)."""
    return artifact("stream", index=MODELS.index(wildcards.model), rep=wildcards.rep)


def rlog_of(name):
    """A per-replicate job's log (in its replicate's logs/)."""
    return f"{RR}logs/{name}.log"


def rbench_of(name):
    return f"{RR}benchmarks/{name}.tsv"


def replicate_summary():
    """The summary over replicates the report includes: none for a single replicate."""
    return [artifact("replicates")] if len(REPS) > 1 else []


# the gradient methods the fidelity step grades; none: no fidelity step
FIDELITY_METHODS = _pbmethods.gradient_methods(config)


def fidelity_outputs():
    """Replicate 0's fidelity folders the report reads (none without a gradient method)."""
    if not FIDELITY_METHODS:
        return []
    return twins("fidelity", rep="")


def prefix_input(wildcards):
    """The shared prefix a twin starts from (none without train.prefix_steps)."""
    if not _pblayout.prefix_steps(config):
        return []
    return artifact("pretrain_prefix", rep=wildcards.rep)


def replicate_of(wildcards):
    """The --replicate argument of a per-replicate job."""
    return _pbrep.from_wildcard(wildcards.rep)


TRACIN = _pblayout.tracin_checkpoints(config)
N_SHARDS = _pblayout.n_shards(config)
SHARDS = [f"{k:04d}" for k in range(N_SHARDS)]
METHODS = _pbmethods.enabled(config)
PLUGINS = {p["name"] for p in config["methods"]["plugins"]}


wildcard_constraints:
    model="A|B",
    checkpoint="step_[0-9]+",
    shard="[0-9]{4}",
    method="[a-z][a-z0-9_]*",


def all_scores(rep="{rep}"):
    """Every per-method, per-model score artifact the analysis of replicate folder ``rep``
    grades (by default the `rep` wildcard of the job asking)."""
    return [twin for m in METHODS for twin in twins("score", rep=rep, method=m)]


def _shards(wildcards, checkpoint):
    """A job's twin's pool shards at ``checkpoint`` (their shard.json records)."""
    values = dict(rep=wildcards.rep, model=wildcards.model, checkpoint=checkpoint)
    return [
        artifact("grads_pool", _pblayout.SHARD_JSON, shard=k, **values) for k in SHARDS
    ]


def pool_shards(wildcards):
    return _shards(wildcards, wildcards.checkpoint)


# ASTRA's settings where ekfac_astra is enabled (the final checkpoint's ekfac job then also refines
# its queries, plantbench.attribution.ekfac.astra): part of that job's sections param, so enabling
# the method or changing methods.astra reruns it; "" otherwise
ASTRA = (
    _pbconfig.canonical_json(_pblayout.astra_settings(config))
    if _pblayout.astra_enabled(config)
    else ""
)
EKFAC_CHECKPOINTS = _pbmethods.ekfac_checkpoints(config)
FINAL_CHECKPOINT = _pblayout.final_checkpoint(config)


def factors_flag(wildcards):
    """`--factors` where an EK-FAC fit follows at this checkpoint: its grads_pool jobs then
    also sum EK-FAC's Kronecker factors, and the ekfac job runs two passes instead of three.
    """
    return "--factors" if wildcards.checkpoint in EKFAC_CHECKPOINTS else ""


def grads_pool_priority(wildcards):
    """Shards an EK-FAC fit waits on run before the others (the ekfac jobs are the longest)."""
    return 42 if wildcards.checkpoint in EKFAC_CHECKPOINTS else 25


def ekfac_shards(wildcards):
    """The pool shards of the checkpoint an ekfac job fits at (they carry its factor sums)."""
    return _shards(wildcards, getattr(wildcards, "checkpoint", FINAL_CHECKPOINT))


def method_inputs(wildcards):
    """The feature files a method reads (its registered `needs`) in the job's replicate."""
    cfg = _pbrep.select(config, _pbrep.from_wildcard(wildcards.rep))
    return _pbmethods.method_inputs(cfg, wildcards.method, wildcards.model)


def method_code(wildcards):
    """A plug-in's file (so editing it reruns its scores; built-ins are the package's code)."""
    path = _pbmethods.code_file(wildcards.method)
    return [str(path)] if wildcards.method in PLUGINS else []


def fidelity_inputs(wildcards):
    """Every feature file a gradient method reads: the fidelity step scores with each of them."""
    cfg = _pbrep.select(config, _pbrep.from_wildcard(wildcards.rep))
    files = []
    for method in FIDELITY_METHODS:
        files += _pbmethods.method_inputs(cfg, method, wildcards.model)
    return sorted(set(files))


# the random twins (workflow/rules/randomtwins.smk): none unless random_twins.m > 0
RANDOM_DRAWS = [f"{k:03d}" for k in range(_pblayout.random_draws(config))]


def random_twins_all():
    """Every random twin's folder (none when random_twins.m is 0)."""
    return [artifact("random_twin", draw=k) for k in RANDOM_DRAWS]


def random_effect_input():
    """The random twins' step, which the report shows (none when random_twins.m is 0)."""
    return [artifact("random_effect")] if RANDOM_DRAWS else []
