# Helpers of workflow/rules/attribution.smk (functions live apart from rules: snakemake --lint).
# Shard counts and checkpoint names are pure functions of the config
# (plantbench.pool.pool_size, plantbench.features.tracin_checkpoints), so no checkpoint rule.
import plantbench.features as _pbfeat
import plantbench.methods.registry as _pbmethods

FEAT = f"{RR}features"  # a replicate's features (RR: common.smk)
TRACIN = _pbfeat.tracin_checkpoints(config)
N_SHARDS = _pbfeat.n_shards(config)
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
    return expand(
        "{R}/{rep}scores/{method}/{model}/meta.json",
        R=R,
        rep=rep,
        method=METHODS,
        model=MODELS,
    )


def pool_shards(wildcards):
    folder = f"{R}/{wildcards.rep}features/{wildcards.model}/grads/{wildcards.checkpoint}/pool"
    return [f"{folder}/shard_{k}/shard.json" for k in SHARDS]


def method_inputs(wildcards):
    """The feature files a method reads (its registered `needs`) in the job's replicate."""
    cfg = _pbrep.select(config, _pbrep.from_wildcard(wildcards.rep))
    return _pbmethods.required_files(cfg, wildcards.method, wildcards.model)


def method_code(wildcards):
    """A plug-in's file (so editing it reruns its scores; built-ins are the package's code)."""
    path = _pbmethods.code_file(wildcards.method)
    return [str(path)] if wildcards.method in PLUGINS else []


def fidelity_inputs(wildcards):
    """Every feature file a gradient method reads: the fidelity step scores with each of them."""
    cfg = _pbrep.select(config, _pbrep.from_wildcard(wildcards.rep))
    files = []
    for method in FIDELITY_METHODS:
        files += _pbmethods.required_files(cfg, method, wildcards.model)
    return sorted(set(files))
