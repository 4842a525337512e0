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


def text_mem_mb(wc, attempt):
    """Corpus and tokenizer hold the background text in memory (~3 bytes a byte of text)."""
    return attempt * max(4000, 3 * config["corpus"]["max_bytes"] // 10**6)


def stream_mem_mb(wc, attempt):
    """The stream step holds the background tokens (2-4 bytes a token) plus the text."""
    t = config["train"]
    tokens = t["steps"] * t["batch_windows"] * config["stream"]["window"]
    return attempt * max(8000, 4 * tokens // 10**6 + text_mem_mb(wc, 1))
