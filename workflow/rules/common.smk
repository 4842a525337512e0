# Config validation (schema in workflow/schemas/) and the helpers every rule uses.
from snakemake.exceptions import WorkflowError

import plantbench.config as _pbconfig
import plantbench.runconfig as _pbrun

try:
    config = _pbconfig.validate(config)
except Exception as _exc:
    raise WorkflowError(f"config error: {_exc}") from None

R = config["results"]
MODELS = ["A", "B"]

# The config every job of this run reads: written once when the run starts (onstart: after the
# lock, never in a dry run, lint or report call), named by its hash, so no other invocation can
# change it under a running job. Rules get its path as the resource `run_config`, not as a param:
# a param reruns a job when it changes, and this path changes with every key. Each rule carries
# instead the hash of the config keys it depends on (plantbench.runconfig.RULE_SECTIONS) in its
# params, so changing `analysis.bootstrap` reruns the analysis and report, not the pretraining.
RUN_CONFIG = str(_pbrun.job_config_path(config))


onstart:
    _pbrun.write_run_config(config)


def sections(rule):
    """Hash of the config keys ``rule`` depends on (its params: a change reruns it)."""
    return _pbrun.rule_sections(config, rule)


def log_of(name):
    return f"{R}/logs/{name}.log"


def bench_of(name):
    return f"{R}/benchmarks/{name}.tsv"


# Data steps stream the text (src/plantbench/corpus.py, tokenizer.py, stream.py): their memory
# does not grow with the corpus except for the counts below. Rates measured on the 2-core test
# machine (400 MB of jsonl: corpus 15 s, tokenizer 64 s, stream 95 s); runtimes in minutes.
def _text_mb():
    return config["corpus"]["max_bytes"] / 10**6


def corpus_mem_mb(wc, attempt):
    """Row groups of 128M characters (~0.7 GB peak measured) + ~150 bytes of duplicate
    filter per document (counted at 1 kB a document)."""
    return attempt * max(4000, int(2000 + 0.15 * _text_mb()))


def corpus_runtime(wc, attempt):
    return attempt * max(30, int(0.002 * _text_mb()))


def _tokenizer_mb():
    """Text the tokenizer trains on: the corpus, or the sample tokenizer.max_train_bytes."""
    cap = config["tokenizer"].get("max_train_bytes", 0) / 10**6
    return min(_text_mb(), cap) if cap else _text_mb()


def tokenizer_mem_mb(wc, attempt):
    """The BPE trainer's word and pair counts (0.23 GB at 100 MB, 0.34 GB at 400 MB of
    synthetic text; real text has more distinct words): a byte per byte of text, at least 4 GB.
    """
    return attempt * max(4000, int(_tokenizer_mb()))


def tokenizer_runtime(wc, attempt):
    # training on the sample, plus reading the whole corpus file to draw it
    return attempt * max(30, int(0.004 * _tokenizer_mb() + 0.0005 * _text_mb()))


def stream_mem_mb(wc, attempt):
    """The manifest (~300 bytes a window) and the document offsets; the background tokens are
    a memory-mapped scratch file and the windows are written through a memmap."""
    t = config["train"]
    windows = t["steps"] * t["batch_windows"]
    return attempt * max(4000, int(2000 + 300 * windows / 10**6))


def stream_runtime(wc, attempt):
    return attempt * max(60, int(0.006 * _text_mb()))
