# Config validation (schema in workflow/schemas/) and the helpers every rule uses.
import json

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

try:
    validate(config, "../schemas/config.schema.yaml")
except WorkflowError:
    pass  # re-reported below as one line naming the key and the allowed values

try:
    import plantbench.config as _pbconfig

    config = _pbconfig.validate(config)
except ImportError:
    pass  # a cluster head node without the package: the schema check above still ran
except Exception as _exc:
    raise WorkflowError(f"config error: {_exc}") from None

R = config["results"]
CONFIG_JSON = f"{R}/config.json"
MODELS = ["A", "B"]


def log_of(name):
    return f"{R}/logs/{name}.log"


def bench_of(name):
    return f"{R}/benchmarks/{name}.tsv"
