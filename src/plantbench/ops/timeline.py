"""``plantbench timeline``: the run's jobs on a time axis, and job seconds per stage.

Reads the ``benchmark:`` files of a run (``{results}/benchmarks/*.tsv``, one per job, written
by Snakemake when the job ends): the job's wall seconds ``s``, CPU seconds ``cpu_time`` and peak
memory ``max_rss`` (sampled: where the job's log ends with its exact peak,
:func:`plantbench.ops.process.logged_peak_mb`, the larger of the two); the file's modification time
is the job's end, ``end - s`` its start. Writes
into the same folder, after every run (the Snakefile's ``onsuccess``) or on demand:

- ``timeline.png``: one bar per job from its start to its end, coloured by stage, so the
  critical path and any idle core are visible;
- ``stages.md``: per stage the jobs, job seconds (wall), CPU seconds, the share of all job
  seconds and the peak memory; the run's wall time (first start to last end) and the sum; with
  ``--before DIR`` (another run's benchmark folder) the same columns side by side.

A benchmark file copied elsewhere loses its modification time: the table stays right, the
timeline does not (it is drawn from the run's own folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from plantbench import io
from plantbench.markdown import markdown_table, plt, save_figure
from plantbench.ops.process import logged_peak_mb
from plantbench.stages import rule_of_job

TABLE = "stages.md"
FIGURE = "timeline.png"


@dataclass(frozen=True)
class Job:
    name: str  # the benchmark file's stem, e.g. grads_pool_A_step_0006080_0000
    stage: str  # the rule, e.g. grads_pool
    start: float  # seconds since the epoch
    wall: float
    cpu: float
    rss_mb: float  # the benchmark's sampled max_rss, or the step's logged exact peak if larger
    rss_logged: bool = False  # the step's log reports its exact peak (plantbench.ops.process)

    @property
    def end(self) -> float:
        return self.start + self.wall


def stage_of(name: str) -> str:
    """The rule a benchmark file belongs to: the stage catalogue's row whose job name its stem
    is (:func:`plantbench.stages.rule_of_job`); a stem no rule's job has is its own stage."""
    return rule_of_job(name) or name


def _number(frame: pd.DataFrame, column: str) -> float:
    if column not in frame:
        return 0.0
    value = pd.to_numeric(frame[column], errors="coerce").fillna(0.0)
    return float(value.sum())


def read_jobs(bench_dir: Path, logs_dir: Path | None = None) -> list[Job]:
    """Every job of the run whose benchmark file reads (others are skipped), by start time;
    each job's peak memory from its log in ``logs_dir`` (default: ``logs`` beside
    ``bench_dir``, the results folder's) where the log reports one."""
    logs = Path(bench_dir).parent / "logs" if logs_dir is None else Path(logs_dir)
    jobs = []
    for f in sorted(Path(bench_dir).glob("*.tsv")):
        try:
            frame = pd.read_csv(f, sep="\t")
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        if "s" not in frame or frame.empty:
            continue
        wall = _number(frame, "s")
        end = f.stat().st_mtime
        sampled = float(pd.to_numeric(frame.get("max_rss", 0), errors="coerce").max() or 0.0)
        logged = logged_peak_mb(logs / f"{f.stem}.log")
        jobs.append(
            Job(
                f.stem,
                stage_of(f.stem),
                end - wall,
                wall,
                _number(frame, "cpu_time"),
                max(sampled, logged or 0.0),
                logged is not None,
            )
        )
    return sorted(jobs, key=lambda j: (j.start, j.name))


def stage_table(jobs: list[Job]) -> pd.DataFrame:
    """Per stage: jobs, job seconds, CPU seconds, share of all job seconds, peak MB; sorted by
    job seconds, then a total row."""
    if not jobs:
        return pd.DataFrame(columns=["stage", "jobs", "job s", "cpu s", "share", "peak MB"])
    df = pd.DataFrame([j.__dict__ for j in jobs])
    g = df.groupby("stage").agg(
        jobs=("name", "size"), wall=("wall", "sum"), cpu=("cpu", "sum"), rss=("rss_mb", "max")
    )
    g = g.sort_values("wall", ascending=False)
    total = g["wall"].sum()
    out = pd.DataFrame(
        {
            "stage": g.index,
            "jobs": g["jobs"].to_numpy(),
            "job s": g["wall"].round(1).to_numpy(),
            "cpu s": g["cpu"].round(1).to_numpy(),
            "share": (100 * g["wall"] / total).round(1).to_numpy(),
            "peak MB": g["rss"].round(0).to_numpy(),
        }
    )
    tot = {
        "stage": "total",
        "jobs": int(g["jobs"].sum()),
        "job s": round(total, 1),
        "cpu s": round(float(g["cpu"].sum()), 1),
        "share": 100.0,
        "peak MB": float(g["rss"].max()),
    }
    return pd.concat([out, pd.DataFrame([tot])], ignore_index=True)


def run_wall(jobs: list[Job]) -> float:
    """Seconds from the first job's start to the last job's end."""
    return max(j.end for j in jobs) - min(j.start for j in jobs) if jobs else 0.0


def compare(after: pd.DataFrame, before: pd.DataFrame) -> pd.DataFrame:
    """Job and CPU seconds per stage, before and after, outer-joined on the stage."""
    cols = ["stage", "job s", "cpu s"]
    m = before[cols].merge(after[cols], on="stage", how="outer", suffixes=(" before", " after"))
    m = m.fillna(0.0)
    order = m["stage"] == "total"
    return pd.concat([m[~order].sort_values("job s after", ascending=False), m[order]])


def figure(jobs: list[Job], out: Path) -> None:
    """Jobs as bars on the time axis (minutes from the first start), one row per job."""
    t0 = min(j.start for j in jobs)
    stages = list(dict.fromkeys(j.stage for j in jobs))
    cmap = plt.get_cmap("tab20")
    colour = {s: cmap(i % 20) for i, s in enumerate(stages)}
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.16 * len(jobs) + 1)))
    for row, j in enumerate(jobs):
        ax.barh(row, j.wall / 60, left=(j.start - t0) / 60, color=colour[j.stage], height=0.8)
    ax.set_yticks(range(len(jobs)), [j.name for j in jobs], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("minutes since the first job started")
    ax.set_title(f"{len(jobs)} jobs, {run_wall(jobs) / 60:.1f} min wall")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[s]) for s in stages]
    ax.legend(handles, stages, fontsize=6, loc="upper right", ncol=2)
    save_figure(fig, out)


def write(bench_dir: Path, before: Path | None = None) -> Path | None:
    """``stages.md`` and ``timeline.png`` into ``bench_dir``; None when it holds no job."""
    bench_dir = Path(bench_dir)
    jobs = read_jobs(bench_dir)
    if not jobs:
        return None
    table = stage_table(jobs)
    lines = [
        "# Job seconds per stage",
        "",
        f"{len(jobs)} jobs; wall {run_wall(jobs) / 60:.1f} min from the first job's start to the "
        f"last one's end; {table['job s'].iloc[-1] / 60:.1f} min of job seconds, "
        f"{table['cpu s'].iloc[-1] / 60:.1f} min of CPU. Timeline: `{FIGURE}`.",
        "",
        markdown_table(table),
    ]
    if before is not None:
        old = stage_table(read_jobs(Path(before)))
        lines += [
            "",
            f"Before (`{Path(before).name}`) and after:",
            "",
            markdown_table(compare(table, old)),
        ]
    io.write_text(bench_dir / TABLE, "\n".join(lines) + "\n")
    figure(jobs, bench_dir / FIGURE)
    return bench_dir / TABLE
