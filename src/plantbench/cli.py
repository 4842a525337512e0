"""``plantbench <step>``: every workflow step is one CLI call (the Snakemake rules call these)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import __version__
from . import config as config_mod
from .errors import EXIT_PREEMPTED, PlantbenchError, Preempted
from .paths import MODELS, Paths

log = logging.getLogger("plantbench")


def _load_cfg(args: argparse.Namespace) -> dict[str, Any]:
    files = args.configfile or ["config.yaml"]
    return config_mod.load(files)


def cmd_config(args: argparse.Namespace) -> None:
    if args.json is not None:
        try:
            raw = json.loads(args.json)
        except json.JSONDecodeError as exc:
            raise PlantbenchError(f"--json is not valid JSON: {exc}") from None
        cfg = config_mod.validate(raw)
    else:
        cfg = _load_cfg(args)
    from . import io

    out = Path(args.out) if args.out else Paths(cfg).config
    io.write_json(out, cfg)
    print(f"config {config_mod.config_hash(cfg)} -> {out}")


def cmd_facts(args: argparse.Namespace) -> None:
    from . import facts

    cfg = _load_cfg(args)
    meta = facts.run(cfg, Paths(cfg).facts)
    print(f"facts {meta['hash']}")


def cmd_corpus(args: argparse.Namespace) -> None:
    from . import corpus

    cfg = _load_cfg(args)
    meta = corpus.run(cfg, Paths(cfg).corpus)
    print(f"corpus {meta['hash']}")


def cmd_tokenizer(args: argparse.Namespace) -> None:
    from . import tokenizer

    cfg = _load_cfg(args)
    p = Paths(cfg)
    meta = tokenizer.run(cfg, p.corpus, p.tokenizer)
    print(f"tokenizer {meta['hash']}")


def cmd_stream(args: argparse.Namespace) -> None:
    from . import stream

    cfg = _load_cfg(args)
    metas = stream.build(cfg, Paths(cfg))
    for m, meta in metas.items():
        print(f"stream {m} {meta['hash']}")


def cmd_batch(args: argparse.Namespace) -> None:
    from . import stream, tokenizer

    cfg = _load_cfg(args)
    p = Paths(cfg)
    s = stream.open_stream(p.stream(args.model), verify=False)
    tok = tokenizer.load(p.tokenizer)
    print(stream.format_batch(s, args.step, tok))


def cmd_pretrain(args: argparse.Namespace) -> None:
    from . import pretrain

    cfg = _load_cfg(args)
    meta = pretrain.train(cfg, Paths(cfg), args.model, threads=args.threads)
    print(f"pretrain {args.model} {meta['hash']} final loss {meta['info']['final_loss']:.4f}")


def cmd_causal(args: argparse.Namespace) -> None:
    from . import causal

    cfg = _load_cfg(args)
    meta = causal.run(cfg, Paths(cfg), threads=args.threads or 1)
    print(f"causal {meta['hash']} learned {meta['info']['learned_rate']:.3f}")


def cmd_report(args: argparse.Namespace) -> None:
    from . import report

    cfg = _load_cfg(args)
    path = report.run(cfg, Paths(cfg))
    print(f"report -> {path}")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c", "--configfile", action="append",
        help="config file(s), later ones merged over earlier (default: config.yaml)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for this step")


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
    "config": (cmd_config, "validate the config and write the resolved copy every step reads"),
    "facts": (cmd_facts, "invent the facts, documents, distractors, queries and candidates"),
    "corpus": (cmd_corpus, "collect background text and split off held-out padding text"),
    "tokenizer": (cmd_tokenizer, "train the byte-level BPE tokenizer"),
    "stream": (cmd_stream, "build both twins' token streams and manifests"),
    "batch": (cmd_batch, "print the windows of one optimizer step with their hashes"),
    "pretrain": (cmd_pretrain, "pretrain one twin (resumable)"),
    "causal": (cmd_causal, "measure each fact's causal effect, learned flag and difficulty"),
    "report": (cmd_report, "write results/report/report.md and figures"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plantbench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"plantbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True, metavar="<step>")
    for name, (fn, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common(p)
        p.set_defaults(func=fn)
        if name == "config":
            p.add_argument("--json", help="the config as a JSON string (used by the Snakefile)")
            p.add_argument("--out", help="where to write the resolved config (default: <results>/config.json)")
        if name in ("pretrain", "batch"):
            p.add_argument("--model", required=True, choices=MODELS)
        if name == "batch":
            p.add_argument("--step", type=int, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
