# Config validation (schema in workflow/schemas/) and the helpers every rule uses.
import hashlib
import json
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

try:
    validate(config, "../schemas/config.schema.yaml")
    _schema_error = None
except WorkflowError as _err:
    _schema_error = (
        _err  # re-reported below as one line naming the key and the allowed values
    )

try:
    import plantbench.config as _pbconfig
except ImportError:  # a head node without the package: the plain schema check must do
    _pbconfig = None
    if _schema_error is not None:
        raise _schema_error
if _pbconfig is not None:
    try:
        config = _pbconfig.validate(config)
    except Exception as _exc:
        raise WorkflowError(f"config error: {_exc}") from None

R = config["results"]
MODELS = ["A", "B"]

# The resolved config every step reads (`plantbench <step> -c results/config.json`). It is
# written here, when the workflow is parsed, and only when its content changed; it is not a rule
# input. Each rule instead carries the hash of the config sections it depends on in `params`,
# so changing e.g. `analysis.bootstrap` reruns the analysis and report, not the pretraining.
CONFIG_JSON = f"{R}/config.json"
_config_text = json.dumps(config, indent=2, sort_keys=True) + "\n"
if not os.path.isfile(CONFIG_JSON) or open(CONFIG_JSON).read() != _config_text:
    os.makedirs(R, exist_ok=True)
    _tmp = f"{CONFIG_JSON}.{os.getpid()}.tmp"
    with open(_tmp, "w") as _fh:
        _fh.write(_config_text)
    os.replace(_tmp, CONFIG_JSON)


def sections(*keys):
    """Hash of the named config sections (a rule's params: a change reruns that rule)."""
    return hashlib.sha256(
        json.dumps({k: config[k] for k in keys}, sort_keys=True).encode()
    ).hexdigest()[:16]


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
