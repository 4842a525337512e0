"""plantbench: grade training-data attribution against causal ground truth.

Two small language models are pretrained from scratch on the same token stream, differing only
in which half of a grid of invented facts each reads. See README.md and results/README.md.
"""

__version__ = "0.1.0"

from plantbench import floats as _floats

_floats.pin()  # before torch runs a kernel: the float path does not depend on the machine
