"""``plantbench plan --measured DIR``: the plan beside a run's ``benchmark:`` files.

For every stage of :func:`plantbench.ops.plan.plan`, the jobs of that stage in the run (their
benchmark files, grouped by rule as :mod:`plantbench.ops.timeline` groups them), their CPU
seconds and the largest peak resident memory (each job's exact peak from its log, else the
benchmark's sampled ``max_rss``) next to the plan's FLOPs and
per-job memory. The plan's FLOPs become seconds at a CPU FLOP rate calibrated on the run
itself (:func:`rates`): the pretrain stage's FLOPs over its CPU seconds (pure matrix multiplies
at the run's shapes and training precision) for the training stages, and for the others, which
run in float32, the same rate when training is float32 but the pool gradients' rate when it is
bf16 (bf16 autocast on a CPU runs oneDNN's bf16 kernels, AMX where the CPU has it: measured
83-110 GFLOP/s there against 66-67 for float32 on one Intel Xeon); stages without FLOPs (facts, corpus, tokenizer, stream, pool, the suites'
table steps, analysis) get no time prediction; each job of a stage with FLOPs adds
``JOB_CPU_S`` of fixed cost (imports, inputs, meta), and a job that loads the text encoder
``ENCODER_LOAD_CPU_S`` more; they dominate only at tiny counts. Ratios
are measured / planned; the table flags any outside [1/2, 2]. Written as
``plan_vs_measured.md`` into the benchmarks folder (also by the Snakefile's ``onsuccess``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plantbench import io
from plantbench.ops import plan as plan_mod
from plantbench.ops.timeline import Job, read_jobs
from plantbench.paths import Paths
from plantbench.stages import STAGES

TABLE = "plan_vs_measured.md"
TOLERANCE = 2.0  # measured within [plan / 2, plan x 2]
DISK_MIN_MB = 10.0  # disk ratios only for stages planned at least this large (the rest: metas)
# Snakemake's benchmark samples a job's memory at its start and every 0.5 s after (every 30 s
# after 15 s): a job shorter than this may be sampled only while its shell starts the CLI (a CI
# run measured the corpus job, 0.6 s, at 3 MB of a 143 MB peak). A job whose log reports its
# exact peak (plantbench.ops.process.report_peak) is judged on that; one without, shorter than this,
# is shown but not judged.
MEM_MIN_S = 2.0
TRAIN_STAGES = ("pretrain_prefix", "pretrain")  # planned at the training precision's rate
FP32_ANCHOR = "grads"  # float32 stages' rate when training is bf16: the pool gradients' pass
# a torch job's fixed CPU seconds (interpreter, torch and transformers imports, reading its
# inputs, writing its meta) beside its FLOPs: measured on the rehearsal's curvature and score jobs
JOB_CPU_S = 2.5
# ... and loading the text encoder (sentence-transformers and MiniLM's weights) beside that:
# 6.7-6.9 CPU s to encode one text against 2.7-2.8 for the imports alone (the default's encoder)
ENCODER_LOAD_CPU_S = 4.2
LOADS_ENCODER = ("embed", "membership_detect")
# rules -> the plan's stage their jobs count in (the stage catalogue's plan_stage; a rule not
# listed has no row in the plan: see UNPLANNED)
STAGE_OF_RULE: dict[str, str] = {s.rule: s.plan_stage for s in STAGES if s.plan_stage is not None}
# the workflow's rules without a plan row, by design, with the catalogue's reason
# (tests/test_plan.py checks that every rule of the workflow is here or in STAGE_OF_RULE);
# ``all``, the Snakefile's default target, is no stage
UNPLANNED: dict[str, str] = {
    "all": "the default target, no job",
    **{s.rule: s.unplanned for s in STAGES if s.plan_stage is None},
}


@dataclass(frozen=True)
class Row:
    stage: str
    jobs_planned: int
    jobs_measured: int
    flops: float
    cpu_s: float  # measured CPU seconds, all jobs
    wall_s: float  # measured job seconds, all jobs
    mem_planned_mb: float  # per job
    mem_measured_mb: float  # largest job's max_rss
    mem_sampled: bool = True  # a job logged its peak or ran MEM_MIN_S (judged only then)
    disk_planned_mb: float = 0.0  # the stage's artifacts, all jobs
    disk_measured_mb: float = 0.0  # their folders' size on disk (0: not measured)

    def seconds_planned(self, rate: float) -> float:
        """The FLOPs at ``rate`` plus each planned job's fixed :data:`JOB_CPU_S` (and
        :data:`ENCODER_LOAD_CPU_S` where the job loads the text encoder)."""
        if rate <= 0 or self.flops <= 0:
            return 0.0
        fixed = JOB_CPU_S + (ENCODER_LOAD_CPU_S if self.stage in LOADS_ENCODER else 0.0)
        return self.flops / rate + self.jobs_planned * fixed

    def work_ratio(self, rate: float) -> float | None:
        planned = self.seconds_planned(rate)
        return self.cpu_s / planned if planned > 0 and self.cpu_s > 0 else None

    def mem_ratio(self) -> float | None:
        """Measured / planned memory per job; ``None`` when no job of the stage ran long enough
        (:data:`MEM_MIN_S`) for its ``max_rss`` to be more than a sample of its start."""
        if self.mem_planned_mb <= 0 or self.mem_measured_mb <= 0 or not self.mem_sampled:
            return None
        return self.mem_measured_mb / self.mem_planned_mb

    def disk_ratio(self) -> float | None:
        """Measured / planned disk, for stages the plan gives at least :data:`DISK_MIN_MB`
        (below that a stage's meta and table headers outweigh its data)."""
        if self.disk_planned_mb < DISK_MIN_MB or self.disk_measured_mb <= 0:
            return None
        return self.disk_measured_mb / self.disk_planned_mb


def _peak_mb(jobs: list[Job]) -> tuple[float, bool]:
    """The largest peak of the jobs whose peak is known (logged, or long enough to be sampled;
    all jobs' when none is), and whether any was."""
    long = [j for j in jobs if j.rss_logged or j.wall >= MEM_MIN_S]
    return max(j.rss_mb for j in long or jobs), bool(long)


def rows(cfg: dict[str, Any], jobs: list[Job], disk: dict[str, float] | None = None) -> list[Row]:
    """One row per planned stage that has jobs in the run; ``disk``: MB on disk per stage
    (:func:`disk_mb`; none measured when absent)."""
    out = []
    for st in plan_mod.plan(cfg):
        mine = [j for j in jobs if STAGE_OF_RULE.get(j.stage) == st.stage]
        if not mine:
            continue
        peak, sampled = _peak_mb(mine)
        out.append(
            Row(
                st.stage,
                st.jobs,
                len(mine),
                st.flops,
                sum(j.cpu for j in mine),
                sum(j.wall for j in mine),
                st.mem_bytes / 1e6,
                peak,
                sampled,
                st.disk_bytes / 1e6,
                (disk or {}).get(st.stage, 0.0),
            )
        )
    return out


def artifact_folders(cfg: dict[str, Any]) -> dict[str, list[Path]]:
    """Per plan stage, the folders its jobs have left in the results folder: those its rules'
    artifact folders (the stage catalogue's ``folders``) match."""
    p = Paths(cfg)
    out: dict[str, list[Path]] = {st: [] for st in STAGE_OF_RULE.values()}
    for s in STAGES:
        base = p.root if s.per_replicate else p.shared
        if s.plan_stage is not None:
            out[s.plan_stage] += [f for g in s.folders for f in sorted(base.glob(g))]
    return out


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def disk_mb(cfg: dict[str, Any]) -> dict[str, float]:
    """MB each plan stage's artifacts take in this config's results folder."""
    return {st: sum(_size(f) for f in fs) / 1e6 for st, fs in artifact_folders(cfg).items()}


def _rate_of(table: list[Row], stage: str) -> float:
    row = next((r for r in table if r.stage == stage), None)
    return row.flops / row.cpu_s if row is not None and row.cpu_s > 0 else 0.0


def cpu_rate(table: list[Row]) -> float:
    """FLOP/s of one CPU second, from the pretrain stage (0 when it did not run)."""
    return _rate_of(table, "pretrain")


def rates(cfg: dict[str, Any], table: list[Row]) -> dict[str, float]:
    """The CPU FLOP rate each stage is planned at: :func:`cpu_rate` for the training stages
    (:data:`TRAIN_STAGES`); for the float32 rest the same when training is float32, else the
    :data:`FP32_ANCHOR` stage's own rate (its work ratio then near 1 by construction)."""
    train = cpu_rate(table)
    bf16 = str(cfg.get("train", {}).get("precision", "auto")) == "bf16"
    fp32 = (_rate_of(table, FP32_ANCHOR) or train) if bf16 else train
    return {r.stage: train if r.stage in TRAIN_STAGES else fp32 for r in table}


def unmeasured(jobs: list[Job]) -> list[str]:
    """The run's rules the plan has no stage for."""
    return sorted({j.stage for j in jobs if j.stage not in STAGE_OF_RULE})


def off(table: list[Row], stage_rates: dict[str, float]) -> list[str]:
    """Stages whose work (at :func:`rates`) or memory is off the plan by more than
    :data:`TOLERANCE`."""
    bad = []
    for r in table:
        work = r.work_ratio(stage_rates.get(r.stage, 0.0))
        for what, ratio in (("work", work), ("memory", r.mem_ratio())):
            if ratio is not None and not 1 / TOLERANCE <= ratio <= TOLERANCE:
                bad.append(f"{r.stage} {what} x{ratio:.2f}")
    return bad


def _fmt(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    flag = "" if 1 / TOLERANCE <= ratio <= TOLERANCE else " **off**"
    return f"{ratio:.2f}{flag}"


def markdown(cfg: dict[str, Any], bench_dir: Path) -> str:
    jobs = read_jobs(Path(bench_dir))
    # the artifacts beside the benchmarks folder (the run's results folder)
    table = rows(cfg, jobs, disk_mb({**cfg, "results": str(Path(bench_dir).resolve().parent)}))
    stage_rates = rates(cfg, table)
    head = (
        "| stage | jobs (plan / run) | FLOPs (plan) | CPU s (plan) | CPU s (run) | job s (run) "
        "| work run/plan | mem/job MB (plan) | peak MB (run) | mem run/plan "
        "| disk MB (plan) | disk MB (run) | disk run/plan |"
    )
    lines = [
        "# The plan against the measurement",
        "",
        f"Plan: `plantbench plan` for this run's config; run: the {len(jobs)} benchmark files "
        f"here. {_rate_text(table, stage_rates)} Peak MB: the largest job's peak memory (the exact peak its "
        "log reports, else its benchmark's sampled `max_rss`; sampled jobs under "
        f"{MEM_MIN_S:g} s count only when the stage has no other, and are then not judged). Disk: the stage's artifact folders, all jobs (ratios where the plan gives "
        f"at least {DISK_MIN_MB:g} MB). Work and memory ratios outside [1/{TOLERANCE:g}, "
        f"{TOLERANCE:g}] are marked **off**.",
        "",
        head,
        "|" + "---|" * 13,
    ]
    lines += [_line(r, stage_rates.get(r.stage, 0.0)) for r in table]
    for rule in unmeasured(jobs):  # measured, not planned: a row each, the plan's columns empty
        mine = [j for j in jobs if j.stage == rule]
        lines.append(
            f"| {rule} (no plan) | - / {len(mine)} | - | - | {sum(j.cpu for j in mine):.1f} | "
            f"{sum(j.wall for j in mine):.1f} | - | - | {max(j.rss_mb for j in mine):.0f} | - "
            "| - | - | - |"
        )
    bad = off(table, stage_rates)
    lines += ["", "Off by more than 2x: " + (", ".join(bad) if bad else "none") + "."]
    return "\n".join(lines) + "\n"


def _rate_text(table: list[Row], stage_rates: dict[str, float]) -> str:
    train = cpu_rate(table)
    text = f"CPU FLOP rate {train / 1e9:.1f} GFLOP/s per CPU second (the pretrain stage's FLOPs "
    fp32 = next((v for k, v in stage_rates.items() if k not in TRAIN_STAGES), train)
    if fp32 == train:
        return text + "over its CPU seconds)."
    return text + (
        f"over its CPU seconds, bf16) for the training stages and {fp32 / 1e9:.1f} for the "
        f"float32 rest (the {FP32_ANCHOR} stage's)."
    )


def _line(r: Row, rate: float) -> str:
    sp = r.seconds_planned(rate)
    disk = r.disk_ratio()
    return (
        f"| {r.stage} | {r.jobs_planned} / {r.jobs_measured} | "
        f"{plan_mod._si(r.flops) if r.flops else '-'} | {f'{sp:.1f}' if sp else '-'} | "
        f"{r.cpu_s:.1f} | {r.wall_s:.1f} | {_fmt(r.work_ratio(rate))} | "
        f"{r.mem_planned_mb:.0f} | {r.mem_measured_mb:.0f} | {_fmt(r.mem_ratio())} | "
        f"{r.disk_planned_mb:.3g} | {r.disk_measured_mb:.3g} | "
        f"{'-' if disk is None else f'{disk:.2f}'} |"
    )


def write(cfg: dict[str, Any], bench_dir: Path) -> Path:
    """``plan_vs_measured.md`` into ``bench_dir``."""
    out = Path(bench_dir) / TABLE
    io.write_text(out, markdown(cfg, bench_dir))
    return out
