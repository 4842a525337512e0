"""The plantbench command line: every workflow step is one CLI call (the Snakemake rules call
these), and each subcommand's help is plain text (argparse prints it as written)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plantbench import __version__, layout, userpaths
from plantbench import config as config_mod
from plantbench.errors import (
    EXIT_PREEMPTED,
    ConfigError,
    PlantbenchError,
    Preempted,
    describe_os_error,
)
from plantbench.paths import MODELS, Paths

log = logging.getLogger("plantbench")
BENCH_FOLDER = "a run's benchmarks folder"


def _load_cfg(args: argparse.Namespace) -> dict[str, Any]:
    from plantbench.runconfig import check_job_config

    files = args.configfile or ["config.yaml"]
    cfg = config_mod.load(files)
    if len(files) == 1:
        check_job_config(Path(files[0]), cfg)
    if getattr(args, "replicate", None) is not None:
        from plantbench.replicates import select

        cfg = select(cfg, args.replicate)
    _check_lineage(args, cfg)
    return cfg


# steps that judge every artifact themselves (verify) or read none (bench)
_OWN_LINEAGE = ("verify", "bench")


def _check_lineage(args: argparse.Namespace, cfg: dict[str, Any]) -> None:
    """A workflow step: its readers refuse inputs made under other config values than
    ``cfg``'s, and what it writes records ``cfg``'s values."""
    from plantbench import lineage, stages

    rule = stages.rule_of_command(
        args.command,
        queries=bool(getattr(args, "queries", False)),
        checkpoint=getattr(args, "checkpoint", None),
    )
    if rule is None or rule in _OWN_LINEAGE:
        return
    lineage.begin(cfg, rule)


def cmd_config(args: argparse.Namespace) -> None:
    if args.json is not None:
        try:
            raw = json.loads(args.json)
        except json.JSONDecodeError as exc:
            raise PlantbenchError(f"--json is not valid JSON: {exc}") from None
        cfg = config_mod.validate(raw)
    else:
        cfg = _load_cfg(args)
    from plantbench import io

    if args.out:
        out = Path(args.out)
        io.write_json(out, cfg)
    else:
        from plantbench.runconfig import write_run_config

        write_run_config(cfg)
        out = Paths(cfg).config
    print(f"config {config_mod.config_hash(cfg)} -> {out}")


def cmd_facts(args: argparse.Namespace) -> None:
    from plantbench.data import facts

    cfg = _load_cfg(args)
    meta = facts.run(cfg, Paths(cfg).facts)
    print(f"facts {meta['hash']}")


def cmd_corpus(args: argparse.Namespace) -> None:
    from plantbench.data import corpus

    cfg = _load_cfg(args)
    meta = corpus.run(cfg, Paths(cfg).corpus)
    print(f"corpus {meta['hash']}")


def cmd_jsonl_corpus(args: argparse.Namespace) -> None:
    from plantbench.data import corpus

    n = corpus.write_jsonl(args.folder, args.max_bytes)
    print(f"jsonl-corpus {n} documents -> {args.folder}")


def cmd_tokenizer(args: argparse.Namespace) -> None:
    from plantbench.data import tokenizer

    cfg = _load_cfg(args)
    p = Paths(cfg)
    meta = tokenizer.run(cfg, p.corpus, p.tokenizer)
    print(f"tokenizer {meta['hash']}")


def cmd_stream(args: argparse.Namespace) -> None:
    from plantbench.data import stream

    cfg = _load_cfg(args)
    metas = stream.build(cfg, Paths(cfg))
    for m, meta in metas.items():
        print(f"stream {m} {meta['hash']}")


def cmd_batch(args: argparse.Namespace) -> None:
    from plantbench.data import stream, tokenizer

    cfg = _load_cfg(args)
    p = Paths(cfg)
    s = stream.open_stream(p.stream(args.model))  # checked, like every reader
    tok = tokenizer.load(p.tokenizer)
    print(stream.format_batch(s, args.step, tok))


def cmd_pretrain(args: argparse.Namespace) -> None:
    from plantbench.model import pretrain

    cfg = _load_cfg(args)
    meta = pretrain.train(cfg, Paths(cfg), args.model, threads=args.threads)
    print(f"pretrain {args.model} {meta['hash']} final loss {meta['info']['final_loss']:.4f}")


def cmd_prefix(args: argparse.Namespace) -> None:
    from plantbench.model import pretrain

    cfg = _load_cfg(args)
    if not layout.prefix_steps(cfg):
        raise ConfigError(
            "config key 'train.prefix_steps' is 0: there is no shared prefix to train; "
            "pretrain each twin from step 0"
        )
    threads = args.threads or cfg["train"].get("prefix_threads", 2 * cfg["train"]["threads"])
    meta = pretrain.train(cfg, Paths(cfg), pretrain.PREFIX, threads=threads)
    print(
        f"prefix {meta['hash']} {meta['info']['steps']} steps, loss {meta['info']['final_loss']:.4f}"
    )


def cmd_causal(args: argparse.Namespace) -> None:
    from plantbench.truth import causal

    cfg = _load_cfg(args)
    meta = causal.run(cfg, Paths(cfg), threads=args.threads or 1)
    print(f"causal {meta['hash']} learned {meta['info']['learned_rate']:.3f}")


def cmd_random_twin(args: argparse.Namespace) -> None:
    from plantbench.randomtwins import train

    cfg = _load_cfg(args)
    meta = train.train_draw(cfg, Paths(cfg), args.draw, threads=args.threads)
    info = meta["info"]
    print(
        f"random-twin {args.draw} {meta['hash']} ({info['pairs_on_A']} of {info['pairs']} pairs "
        f"on side A) final loss {info['final_loss']:.4f}"
    )


def cmd_random_effect(args: argparse.Namespace) -> None:
    from plantbench.randomtwins import effect

    cfg = _load_cfg(args)
    meta = effect.run(cfg, Paths(cfg), threads=args.threads or 1)
    agree = meta["info"]["agreement"]
    print(
        f"random-effect {meta['hash']} ({meta['info']['draws']} random twins; A/B vs random-twin "
        f"effect Pearson {agree['pearson']:.2f}, {agree['outside']} of {agree['n_facts']} outside)"
    )


def cmd_reading(args: argparse.Namespace) -> None:
    from plantbench.truth import reading

    cfg = _load_cfg(args)
    meta = reading.run(cfg, Paths(cfg), threads=args.threads or 1)
    rates = ", ".join(f"{m} {100 * v:.0f}%" for m, v in meta["info"]["final"].items())
    print(f"reading {meta['hash']} final checkpoints: {rates}")


def cmd_analysis(args: argparse.Namespace) -> None:
    from plantbench.grading import analysis

    cfg = _load_cfg(args)
    meta = analysis.run(cfg, Paths(cfg))
    print(f"analysis {meta['hash']} ({len(meta['info']['methods'])} methods)")


def cmd_replicates(args: argparse.Namespace) -> None:
    from plantbench.grading import replicate_summary

    cfg = _load_cfg(args)
    meta = replicate_summary.run(cfg, Paths(cfg))
    info = meta["info"]
    print(
        f"replicates {meta['hash']} ({info['replicates']} replicates, "
        f"{info['stable_verdicts']} stable verdicts)"
    )


def cmd_report(args: argparse.Namespace) -> None:
    from plantbench.report import build as report

    cfg = _load_cfg(args)
    path = report.run(cfg, Paths(cfg))
    print(f"report -> {path}")


def cmd_pool(args: argparse.Namespace) -> None:
    from plantbench.attribution import pool

    cfg = _load_cfg(args)
    meta = pool.build(cfg, Paths(cfg), args.model)
    print(f"pool {args.model} {meta['hash']} ({meta['info']['n_pool']} windows)")


def cmd_grads(args: argparse.Namespace) -> None:
    from plantbench.attribution import features

    cfg = _load_cfg(args)
    if args.queries == (args.shard is not None):
        raise PlantbenchError("give exactly one of --shard K (pool windows) or --queries")
    if args.queries and args.factors:
        raise PlantbenchError("--factors sums EK-FAC's factors over pool windows: give --shard K")
    if args.queries:
        meta = features.grads_queries(
            cfg, Paths(cfg), args.model, args.checkpoint, threads=args.threads
        )
    else:
        meta = features.grads_pool(
            cfg,
            Paths(cfg),
            args.model,
            args.checkpoint,
            args.shard,
            threads=args.threads,
            factors=args.factors,
        )
    print(f"grads {args.model} {args.checkpoint} {meta['rows']} rows {meta['xxh3']}")


def cmd_curvature(args: argparse.Namespace) -> None:
    from plantbench.attribution import features

    cfg = _load_cfg(args)
    curv = features.curvature(cfg, Paths(cfg), args.model, args.checkpoint)
    blocks = len(curv.eigvals)
    print(f"curvature {args.model} {args.checkpoint} {curv.mode} ({blocks} blocks, {curv.n} rows)")


def cmd_hidden(args: argparse.Namespace) -> None:
    from plantbench.attribution import features

    cfg = _load_cfg(args)
    meta = features.hidden(cfg, Paths(cfg), args.model, threads=args.threads)
    print(f"hidden {args.model} {meta['hash']}")


def cmd_embed(args: argparse.Namespace) -> None:
    from plantbench.attribution import embed

    cfg = _load_cfg(args)
    meta = embed.embed(cfg, Paths(cfg), args.model, threads=args.threads)
    print(f"embed {args.model} {meta['hash']} ({meta['info']['encoded_here']} texts encoded here)")


def cmd_embed_shared(args: argparse.Namespace) -> None:
    from plantbench.attribution import embed

    cfg = _load_cfg(args)
    meta = embed.shared(cfg, Paths(cfg), threads=args.threads)
    print(f"embed-shared {meta['hash']} ({meta['info']['n_texts']} texts)")


def cmd_methods(args: argparse.Namespace) -> None:
    from plantbench.attribution.methods import registry

    if args.configfile or userpaths.problem("config.yaml", userpaths.FILE) != userpaths.MISSING:
        registry.load_plugins(_load_cfg(args))
    for name, desc in registry.describe():
        print(f"{name:<18} {desc}")


def cmd_score(args: argparse.Namespace) -> None:
    from plantbench.attribution import scoring

    cfg = _load_cfg(args)
    meta = scoring.run(cfg, Paths(cfg), args.method, args.model, threads=args.threads)
    print(f"scores {args.method} {args.model} {meta['hash']}")


def cmd_trackstar(args: argparse.Namespace) -> None:
    from plantbench.attribution import trackstar

    cfg = _load_cfg(args)
    meta = trackstar.run(cfg, Paths(cfg), args.model, threads=args.threads)
    info = meta["info"]
    print(f"trackstar {args.model} {info['n_queries']} x {info['n_pool']} {meta['hash']}")


def cmd_ekfac(args: argparse.Namespace) -> None:
    from plantbench.attribution.ekfac import stage as ekfac

    cfg = _load_cfg(args)
    meta = ekfac.run(cfg, Paths(cfg), args.model, checkpoint=args.checkpoint, threads=args.threads)
    info = meta["info"]
    print(
        f"ekfac {args.model} {info['checkpoint']} {info['n_queries']} x {info['n_pool']} "
        f"{meta['hash']}"
    )


def cmd_fidelity(args: argparse.Namespace) -> None:
    from plantbench.attribution import fidelity

    cfg = _load_cfg(args)
    meta = fidelity.run(cfg, Paths(cfg), args.model, threads=args.threads)
    for name, row in meta["info"]["summary"].items():
        mean = "n/a" if row["mean"] is None else f"{row['mean']:.3f}"
        print(f"fidelity {args.model} {name:<18} vs exact {row['reference']}: mean {mean}")
    print(f"fidelity {args.model} {meta['hash']}")


def cmd_context_build(args: argparse.Namespace) -> None:
    from plantbench.suites.context import contexts

    cfg = _load_cfg(args)
    meta = contexts.run(cfg, Paths(cfg))
    info = meta["info"]
    print(f"context-build {meta['hash']} ({info['queries']} queries, {info['segments']} segments)")


def cmd_context_attribute(args: argparse.Namespace) -> None:
    from plantbench.suites.context import attribute

    cfg = _load_cfg(args)
    meta = attribute.run(cfg, Paths(cfg), args.model, threads=args.threads or 1)
    info = meta["info"]
    print(
        f"context-attribute {args.model} {meta['hash']} ({info['forward_passes']} forward passes, "
        f"{info['passes_per_s']:.1f}/s)"
    )


def cmd_context_analysis(args: argparse.Namespace) -> None:
    from plantbench.suites.context import analysis

    cfg = _load_cfg(args)
    meta = analysis.run(cfg, Paths(cfg))
    print(f"context-analysis {meta['hash']} ({meta['info']['facts']} facts)")


def _report_checks(checks: list[Any], out: str | None) -> None:
    """Print the PASS/FAIL table (and write it to ``out``); raise when a check failed."""
    from plantbench.ops import verify

    text = verify.format_checks(checks)
    print(text)
    if out:
        from plantbench import io

        io.write_text(out, text + "\n")
    failed = [c for c in checks if c.status == "FAIL"]
    if failed:
        raise PlantbenchError(
            f"verify: {len(failed)} check(s) failed; first: {failed[0].artifact}: {failed[0].detail}"
        )
    print(f"verify: all {sum(c.status == 'PASS' for c in checks)} checks passed")


def cmd_verify(args: argparse.Namespace) -> None:
    from plantbench.ops import verify

    if args.bundle:
        _report_checks(verify.run_bundle(Path(args.bundle)), args.out)
        return
    cfg = _load_cfg(args)
    paths = Paths(cfg)
    if args.write_reference:
        out = verify.write_reference(cfg, paths, args.write_reference)
        print(f"reference -> {out}")
        return
    _report_checks(verify.run(cfg, paths), args.out)


def cmd_export(args: argparse.Namespace) -> None:
    from plantbench.ops import export

    cfg = _load_cfg(args)
    paths = Paths(cfg)
    out = Path(args.out) if args.out else export.default_out(paths)
    meta = export.run(cfg, paths, out)
    print(f"export {meta['hash']} ({len(meta['info']['tables'])} tables) -> {out}")


def cmd_plan(args: argparse.Namespace) -> None:
    from plantbench.ops import plan

    cfg = _load_cfg(args)
    gpus = args.gpu or ["h100"]
    unknown = [g for g in gpus if g not in plan.GPU_PEAK_BF16]
    if unknown:
        known = ", ".join(plan.GPU_PEAK_BF16)
        raise PlantbenchError(f"--gpu {unknown[0]} is unknown; use one of: {known}")
    print(plan.format_markdown(cfg, plan.plan(cfg), gpus, args.utilisation))
    if args.measured is not None:
        from plantbench.ops import plan_measured

        userpaths.check(args.measured, userpaths.FOLDER, "--measured", BENCH_FOLDER)
        out = plan_measured.write(cfg, args.measured)
        print(f"\n{out.read_text()}plan against measurement -> {out}")


def cmd_bench(args: argparse.Namespace) -> None:
    from plantbench.ops.bench import groups as bench

    cfg = _load_cfg(args)
    skip = tuple(args.skip or ())
    path = bench.run(cfg, Paths(cfg), threads=args.threads, quick=args.quick, skip=skip)
    print(bench.format_csv(path))
    print(f"benchmarks -> {path}")


def cmd_timeline(args: argparse.Namespace) -> None:
    from plantbench.ops import timeline

    cfg = _load_cfg(args)
    folder = Paths(cfg).benchmarks
    if args.before is not None:
        userpaths.check(args.before, userpaths.FOLDER, "--before", BENCH_FOLDER)
    out = timeline.write(folder, before=args.before)
    if out is None:
        raise PlantbenchError(f"no benchmark files in '{folder}'; run the workflow first")
    print(f"timeline -> {out} and {folder / timeline.FIGURE}")


DESCRIPTION = (
    "Pretrain two twin language models that differ only in which invented facts they read, "
    "measure each fact's causal effect, and grade training-data attribution methods against it. "
    "Every workflow step is one subcommand; the Snakemake rules call them."
)
EPILOG = "Run 'plantbench <step> --help' for the options of one step."


def cmd_grounding_build(args: argparse.Namespace) -> None:
    from plantbench.suites.grounding import contexts

    cfg = _load_cfg(args)
    meta = contexts.run(cfg, Paths(cfg))
    info = meta["info"]
    print(
        f"grounding-build {meta['hash']} ({info['contexts']} contexts: {info['facts']} facts x "
        f"{len(info['conditions'])} conditions, {info['segments']} segments)"
    )


def cmd_grounding_respond(args: argparse.Namespace) -> None:
    from plantbench.suites.grounding import respond

    cfg = _load_cfg(args)
    meta = respond.run(cfg, Paths(cfg), args.model, threads=args.threads or 1)
    info = meta["info"]
    print(
        f"grounding-respond {args.model} {meta['hash']} ({info['contexts']} responses, "
        f"{info['atoms']} atomic sentences, {info['empty_responses']} empty; {info['checker']} "
        "checker)"
    )


def cmd_grounding_analysis(args: argparse.Namespace) -> None:
    from plantbench.suites.grounding import analysis

    cfg = _load_cfg(args)
    meta = analysis.run(cfg, Paths(cfg))
    print(f"grounding-analysis {meta['hash']} ({meta['info']['responses']} responses)")


def cmd_membership_samples(args: argparse.Namespace) -> None:
    from plantbench.suites.membership import samples

    cfg = _load_cfg(args)
    meta = samples.run(cfg, Paths(cfg))
    info = meta["info"]
    print(
        f"membership-samples {meta['hash']} ({info['samples_per_twin']} samples per twin, "
        f"{info['n_cal']} to calibrate, {info['distractors_per_twin']} distractors)"
    )


def cmd_membership_detect(args: argparse.Namespace) -> None:
    from plantbench.suites.membership import detect

    cfg = _load_cfg(args)
    meta = detect.run(cfg, Paths(cfg), args.model, threads=args.threads or 1)
    info = meta["info"]
    print(
        f"membership-detect {args.model} {meta['hash']} (CRM-LR AUC {info['crm_lr_auc']:.3f}, "
        f"CRM-XGB {info['crm_xgb_auc']:.3f}; target layers {info['layers']})"
    )


def cmd_membership_analysis(args: argparse.Namespace) -> None:
    from plantbench.suites.membership import analysis

    cfg = _load_cfg(args)
    meta = analysis.run(cfg, Paths(cfg))
    print(f"membership-analysis {meta['hash']}")


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from plantbench.suites.membership import serve

    cfg = _load_cfg(args)
    auditor = serve.load(Paths(cfg), args.model)
    print(f"serve: twin {args.model} on http://{args.host}:{args.port}/ (POST /audit)")
    api = serve.app(auditor, max_bytes=serve.max_request_bytes(cfg))
    uvicorn.run(api, host=args.host, port=args.port, log_level="info")


# the subcommands whose work runs on CPU threads (torch or BLAS): only they take --threads,
# and the Snakemake rules pass --threads {threads} to exactly these
THREADED = (
    "prefix",
    "pretrain",
    "random-twin",
    "random-effect",
    "grads",
    "hidden",
    "embed",
    "embed-shared",
    "score",
    "ekfac",
    "trackstar",
    "fidelity",
    "causal",
    "reading",
    "bench",
    "context-attribute",
    "grounding-respond",
    "membership-detect",
)
# the subcommands that act on one twin
PER_MODEL = (
    "pretrain",
    "batch",
    "pool",
    "grads",
    "curvature",
    "hidden",
    "embed",
    "score",
    "ekfac",
    "trackstar",
    "fidelity",
    "context-attribute",
    "grounding-respond",
    "membership-detect",
    "serve",
)
# the subcommands that act on one replicate's artifacts (plantbench.replicates)
PER_REPLICATE = (*PER_MODEL, "stream", "prefix", "embed-shared", "causal", "reading", "analysis")


def _threads(text: str) -> int:
    """``--threads``: a whole number of at least 1 (argparse prints the refusal as one line)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a whole number; give 1 or more"
        ) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is out of range; give 1 or more")
    return n


def _add_common(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument(
        "-c",
        "--configfile",
        action="append",
        metavar="FILE",
        help="config file(s), later ones merged over earlier (default: config.yaml)",
    )
    if name in THREADED:
        p.add_argument(
            "--threads",
            type=_threads,
            default=None,
            metavar="N",
            help="CPU threads for this step (1 or more)",
        )
    if name in PER_MODEL:
        p.add_argument("--model", required=True, choices=MODELS, help="which twin: A or B")
    if name in PER_REPLICATE:
        p.add_argument(
            "--replicate",
            type=int,
            default=0,
            metavar="R",
            help="which replicate (0 to replicates - 1; default 0, the study as configured)",
        )


def _opts_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="the config as a JSON string (used by the Snakefile)")
    p.add_argument(
        "--out", help="where to write the resolved config (default: <results>/config.json)"
    )


def _opts_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint name, e.g. step_0001200")


def _opts_random_twin(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--draw",
        type=int,
        required=True,
        metavar="K",
        help="which random twin (0 to random_twins.m - 1)",
    )


def _opts_ekfac(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        default=None,
        help="a TracIn checkpoint (tracin_ekfac); default: the final one (ekfac)",
    )


def _opts_grads(p: argparse.ArgumentParser) -> None:
    _opts_checkpoint(p)
    p.add_argument("--shard", type=int, default=None, metavar="K", help="pool shard K")
    p.add_argument("--queries", action="store_true", help="all queries, not a shard")
    p.add_argument(
        "--factors",
        action="store_true",
        help="also sum EK-FAC's Kronecker factors in the same pass (the ekfac job then skips its "
        "own first pass; the workflow sets it where an EK-FAC fit follows)",
    )


def _opts_score(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", required=True, help="the method's name (see 'plantbench methods')")


def _opts_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write-reference", metavar="NAME", help="write results/reference/NAME.json")
    p.add_argument("--out", metavar="FILE", help="also write the check table to this file")
    p.add_argument(
        "--bundle",
        metavar="DIR",
        help="check a release bundle made by 'plantbench export' instead of the run",
    )


def _opts_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", help="the bundle's folder (default: <results>/export)")


def _opts_batch(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step", type=int, required=True, help="the optimizer step (0-based)")


def _opts_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu", action="append", help="h200 | h100 | a100 | a4500 (repeatable; default h100)"
    )
    p.add_argument(
        "--utilisation", type=float, default=0.4, help="share of the bf16 peak (default 0.4)"
    )
    p.add_argument(
        "--measured",
        type=Path,
        metavar="DIR",
        help="a run's benchmarks folder: write plan_vs_measured.md there (the plan beside the "
        "jobs' seconds and peak memory)",
    )


def _opts_jsonl_corpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, help="the folder to write part-NNNN.jsonl files into")
    p.add_argument(
        "--max-bytes", type=int, default=2_000_000, help="bytes of text (default 2,000,000)"
    )


def _opts_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")


def _opts_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer repeats, smaller sizes")
    p.add_argument(
        "--skip",
        action="append",
        choices=["pretrain", "features", "peers", "scoring", "server"],
        help="leave out one group of measurements (repeatable)",
    )


def _opts_timeline(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="another run's benchmarks folder: its stage table beside this run's",
    )


OPTIONS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "timeline": _opts_timeline,
    "config": _opts_config,
    "batch": _opts_batch,
    "grads": _opts_grads,
    "curvature": _opts_checkpoint,
    "ekfac": _opts_ekfac,
    "random-twin": _opts_random_twin,
    "score": _opts_score,
    "verify": _opts_verify,
    "export": _opts_export,
    "plan": _opts_plan,
    "jsonl-corpus": _opts_jsonl_corpus,
    "bench": _opts_bench,
    "serve": _opts_serve,
}

COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
    "config": (cmd_config, "validate the config and write the resolved copy every step reads"),
    "facts": (cmd_facts, "invent the facts, documents, distractors, queries and candidates"),
    "corpus": (cmd_corpus, "collect background text and split off held-out padding text"),
    "jsonl-corpus": (
        cmd_jsonl_corpus,
        "write the standard library's text as a local jsonl corpus (the rehearsal's source)",
    ),
    "tokenizer": (cmd_tokenizer, "train the byte-level BPE tokenizer"),
    "stream": (cmd_stream, "build both twins' token streams and manifests"),
    "batch": (cmd_batch, "print the windows of one optimizer step with their hashes"),
    "prefix": (cmd_prefix, "pretrain the shared prefix both twins start from (resumable)"),
    "pretrain": (cmd_pretrain, "pretrain one twin from the shared prefix (resumable)"),
    "pool": (cmd_pool, "list the windows the methods rank (planted + distractor + random)"),
    "grads": (cmd_grads, "projected per-example gradients: one pool shard or all queries"),
    "curvature": (cmd_curvature, "fit the damped projected Fisher of one checkpoint"),
    "hidden": (cmd_hidden, "final-checkpoint hidden states of pool windows and queries"),
    "embed-shared": (cmd_embed_shared, "text-encoder embeddings of the texts both twins need"),
    "embed": (cmd_embed, "text-encoder embeddings of pool windows and queries (from the cache)"),
    "methods": (cmd_methods, "list the registered attribution methods"),
    "score": (cmd_score, "score every query against a model's pool with one method"),
    "ekfac": (cmd_ekfac, "fit EK-FAC on the pool at one checkpoint; score every query"),
    "trackstar": (
        cmd_trackstar,
        "TrackStar features: optimizer-corrected, projected, whitened gradients (final checkpoint)",
    ),
    "fidelity": (
        cmd_fidelity,
        "grade each gradient method against exact, unprojected gradient products on a subset",
    ),
    "causal": (cmd_causal, "measure each fact's causal effect, learned flag and difficulty"),
    "reading": (cmd_reading, "each twin's reading rate at the fork and at every checkpoint"),
    "random-twin": (
        cmd_random_twin,
        "train one random twin from the shared prefix: a seeded half of the fact pairs (resumable)",
    ),
    "random-effect": (
        cmd_random_effect,
        "the random twins' answers: each fact's effect with its error, every method's LDS",
    ),
    "context-build": (
        cmd_context_build,
        "context suite: k-segment contexts with each segment's provenance under each twin",
    ),
    "context-attribute": (
        cmd_context_attribute,
        "context suite: every context-attribution method on every context under one twin",
    ),
    "context-analysis": (
        cmd_context_analysis,
        "context suite: BCS, CAC, APS, SSP, Drop@k and LDS with intervals over facts",
    ),
    "grounding-build": (
        cmd_grounding_build,
        "grounding suite: contexts of atomic sentences in k segments, four conditions",
    ),
    "grounding-respond": (
        cmd_grounding_respond,
        "grounding suite: one twin's greedy responses, atomized and judged for entailment",
    ),
    "grounding-analysis": (
        cmd_grounding_analysis,
        "grounding suite: CK, PK (trained / unsupported) and context recall by segment",
    ),
    "membership-samples": (
        cmd_membership_samples,
        "membership suite: per twin, documents it read and documents only the other twin read",
    ),
    "membership-detect": (
        cmd_membership_detect,
        "membership suite: CRM's reality-monitoring probe, baselines and controls on one twin",
    ),
    "membership-analysis": (
        cmd_membership_analysis,
        "membership suite: the seed's Tables 1 and 2 and AUC per layer",
    ),
    "serve": (
        cmd_serve,
        "audit server: a twin and its membership probe behind POST /audit, with a dashboard",
    ),
    "analysis": (cmd_analysis, "grade every method: AP, Recall@10, within-cell correlations"),
    "replicates": (
        cmd_replicates,
        "summarize the analysis over replicates: mean, range, stability",
    ),
    "verify": (cmd_verify, "check every artifact's hashes, lineage, streams and reference hashes"),
    "report": (cmd_report, "write results/report/report.md and figures"),
    "export": (
        cmd_export,
        "write the release bundle: a datasets folder, parquet tables, card and both final models",
    ),
    "plan": (cmd_plan, "per stage: work, FLOPs, disk and GPU-hours on a named GPU"),
    "bench": (cmd_bench, "measure training, featurization and scoring speed on this machine"),
    "timeline": (cmd_timeline, "the run's jobs on a time axis and job seconds per stage"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plantbench", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument(
        "--version", action="version", version=f"plantbench {__version__}", help="print the version"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="<step>", title="steps", help="the step to run"
    )
    for name, (fn, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=f"plantbench {name}: {help_text}.")
        _add_common(p, name)
        if name in OPTIONS:
            OPTIONS[name](p)
        p.set_defaults(func=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # a process of its own (not a call from Python): it dies with its job
        from plantbench.ops.process import die_with_parent

        die_with_parent()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        args.func(args)
    except Preempted as exc:
        print(f"plantbench: preempted: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    except PlantbenchError as exc:
        print(f"plantbench: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, permission denied, ...: no traceback, no partial file
        print(f"plantbench: error: {describe_os_error(exc, args.command)}", file=sys.stderr)
        return 2
    finally:
        from plantbench import lineage

        lineage.end()  # a call from Python: the next step declares itself
    if argv is None and not sys.stderr.isatty():  # a step's log: its exact peak memory, last
        from plantbench.ops.process import report_peak

        report_peak(sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
