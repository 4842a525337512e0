# The config (src/plantbench/config.py): validated once at parse time (schema in workflow/schemas/),
# the run config every job reads (written by onstart), how a job calls the package, the config
# sections every job depends on, and the data steps' resources (where artifacts live is in
# workflow/rules/layout.smk).
import os
import shlex
import sys

from snakemake.logging import logger
from snakemake.settings.types import DeploymentMethod

import plantbench.config as _pbconfig
import plantbench.errors as _pberrors
import plantbench.ops.plan as _pbplan
import plantbench.replicates as _pbrep
import plantbench.runconfig as _pbrun

try:
    # read as the CLI reads it (plantbench.config.from_snakemake): duplicate keys refused,
    # --config values typed as YAML
    config = _pbconfig.from_snakemake(
        config, workflow.configfiles, workflow.config_settings.config
    )
except _pberrors.ConfigError as _exc:
    # one line, no traceback: SystemExit passes through Snakemake's error printing; nothing has
    # been written yet (the run config is written by onstart, after the lock)
    print(f"plantbench: config error: {_exc}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None

R = config["results"]

try:
    # each rule's config values as a file it reads (plantbench.runconfig.write_sections): a
    # change reaches Snakemake through the file's time, with or without .snakemake/ metadata.
    # A call that only looks (a dry run, --lint, --report, a summary) writes nothing.
    _LOOK_ONLY = _pbrun.looks_only(sys.argv[1:])
    _changed = _pbrun.write_sections(config, write=not _LOOK_ONLY)
except _pberrors.PlantbenchError as _exc:  # a full or read-only results disk: one line
    print(f"plantbench: error: {_exc}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None
if _changed and len(_changed) < len(_pbrun.RULE_SECTIONS):
    logger.info(f"plantbench: config changed for: {', '.join(_changed)}")

# The checkout this workflow runs from (also when another workflow uses it as a module):
# envs/plantbench.post-deploy.sh installs the package from it into the `--sdm conda` env.
_HERE = workflow.current_basedir.get_path_or_uri(secret_free=True)  # .../workflow/rules
if os.path.isdir(_HERE):  # a local checkout, not a remote (github) source
    # set for the post-deploy script (Snakemake runs it in a copy under .snakemake/conda/)
    os.environ.update(PLANTBENCH_SOURCE=os.path.dirname(os.path.dirname(_HERE)))

# How a job calls the package (each rule's params.plantbench): the interpreter Snakemake runs
# under, so no activated venv is needed; with --sdm conda the python of envs/plantbench.yaml's
# environment, which is first on the job's PATH there. Being a param, a different interpreter
# (another venv, conda on or off) reruns the jobs, like any other change of the software.
_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
PYTHON = "python" if _CONDA else shlex.quote(sys.executable)
PLANTBENCH = f"{PYTHON} -m plantbench"
# train.devices > 1: one data-parallel process per GPU (torchrun's module, which picks a free port,
# so both twins' jobs can share a node; `accelerate launch --multi_gpu` works the same way). On
# Slurm also set `gpu: <devices>` under set-resources.pretrain in profiles/slurm.
PLANTBENCH_PRETRAIN = (
    f"{PYTHON} -m torch.distributed.run --standalone "
    f"--nproc_per_node {config['train']['devices']} -m plantbench.cli"
    if config["train"]["devices"] > 1
    else PLANTBENCH
)
MODELS = ["A", "B"]
# the shared prefix's job takes the cores both twins would use (they wait for it)
PREFIX_THREADS = config["train"].get("prefix_threads", 2 * config["train"]["threads"])

# The config every job of this run reads: written once when the run starts (onstart: after the
# lock, never in a dry run, lint or report call), named by its hash, so no other invocation can
# change it under a running job. Rules get its path as the resource `run_config`, not as a param:
# a param reruns a job when it changes, and this path changes with every key. Each rule carries
# instead the hash of the config keys it depends on (plantbench.runconfig.RULE_SECTIONS) in its
# params, so changing `analysis.bootstrap` reruns the analysis and report, not the pretraining.
RUN_CONFIG = str(_pbrun.job_config_path(config))


onstart:
    _write_run_config()


def _write_run_config() -> None:
    try:
        _pbrun.write_run_config(config)
    except (
        _pberrors.PlantbenchError
    ) as exc:  # a full results disk: one line, no traceback
        print(f"plantbench: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


# A failed run ends with the failing rules, their logs and the logs' last lines (the cause).
# Workflows that use this one as a module call both hooks: `onstart: plantbench.onstart()`.
onerror:
    _report_failures()


# A finished run draws its jobs on a time axis and sums job seconds per stage
# (benchmarks/timeline.png and benchmarks/stages.md; plantbench.ops.timeline), and puts the plan
# beside the measurement (benchmarks/plan_vs_measured.md; plantbench.ops.plan_measured).
onsuccess:
    _write_timeline()


def _write_timeline() -> None:
    import plantbench.ops.timeline as _pbtimeline

    try:
        out = _pbtimeline.write(os.path.join(R, "benchmarks"))
    except (
        Exception
    ) as exc:  # a drawing problem must not turn a finished run into a failed one
        logger.warning(f"plantbench: no timeline ({type(exc).__name__}: {exc})")
        return
    if out is not None:
        logger.info(f"plantbench: job seconds per stage -> {out}")
    import plantbench.ops.plan_measured as _pbplanvs

    try:
        out = _pbplanvs.write(config, os.path.join(R, "benchmarks"))
    except Exception as exc:  # as above: a finished run stays finished
        logger.warning(f"plantbench: no plan_vs_measured ({type(exc).__name__}: {exc})")
        return
    logger.info(f"plantbench: the plan against the measurement -> {out}")


def _log_tail(path: str, n: int = 5) -> list[str]:
    """The last ``n`` non-empty lines of a job's log (the CLI's one-line error is the last)."""
    try:
        with open(path, errors="replace") as fh:
            lines = [line.rstrip() for line in fh if line.strip()]
    except OSError:
        return ["(no log written)"]
    return lines[-n:] or ["(log is empty)"]


def _report_failures() -> None:
    """One block per failed job: rule, wildcards, log file and its last lines."""
    scheduler = getattr(workflow, "scheduler", None)
    failed = sorted(getattr(scheduler, "failed", ()), key=lambda job: job.rule.name)
    lines = []
    for job in failed:
        wc = ", ".join(f"{k}={v}" for k, v in job.wildcards.items())
        lines.append(
            f"plantbench: rule {job.rule.name}{f' ({wc})' if wc else ''} failed"
        )
        for log in job.log:
            lines.append(f"  log: {log}")
            lines += [f"  | {line}" for line in _log_tail(log)]
    if lines:
        logger.error("\n".join(lines))


def sections(rule):
    """Hash of the config keys ``rule`` depends on (its params: a change reruns it)."""
    return _pbrun.rule_sections(config, rule)


def config_input(rule):
    """The file holding the config values ``rule`` depends on (an input: written at parse time
    when they change, so the rule reruns without Snakemake's metadata too)."""
    path = _pbrun.sections_path(config, rule)
    if _LOOK_ONLY and not path.is_file():  # a dry run of a fresh folder writes nothing
        return []
    return str(path)


# Data steps stream the text (src/plantbench/data/corpus.py, tokenizer.py, stream.py); their memory
# comes from the plan like every other step's (below). Runtimes in minutes, from rates measured on
# the 2-core test machine (400 MB of jsonl: corpus 15 s, tokenizer 64 s, stream 95 s).
def _text_mb():
    return config["corpus"]["max_bytes"] / 10**6


def corpus_runtime(wc, attempt):
    return attempt * max(30, int(0.002 * _text_mb()))


def _tokenizer_mb():
    """Text the tokenizer trains on: the corpus, or the sample tokenizer.max_train_bytes."""
    cap = config["tokenizer"].get("max_train_bytes", 0) / 10**6
    return min(_text_mb(), cap) if cap else _text_mb()


def tokenizer_runtime(wc, attempt):
    # training on the sample, plus reading the whole corpus file to draw it
    return attempt * max(30, int(0.004 * _tokenizer_mb() + 0.0005 * _text_mb()))


def stream_runtime(wc, attempt):
    return attempt * max(60, int(0.006 * _text_mb()))


# Every step's memory: each rule's mem_mb is `plantbench plan`'s per-job peak memory for its
# stage (src/plantbench/ops/plan.py, rule_mem_mb; checked within 2x of the benchmark files by the
# rehearsal, tests/test_rehearsal.py) plus a quarter, never below the rule's floor (MB), times the
# attempt. A stage the plan leaves out for this config (no EK-FAC, no prefix) gets the floor. At
# the paper preset this asks, e.g., 31 GB for a grads job, 41 GB for EK-FAC, 82 GB for fidelity.
_PLAN = _pbplan.plan(config)


def plan_mem_mb(stage, floor):
    mb = _pbplan.rule_mem_mb(_PLAN, stage, floor)
    return lambda wc, attempt: mb * attempt
