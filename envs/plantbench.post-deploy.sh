#!/usr/bin/env bash
# Snakemake runs this once, inside the freshly created envs/plantbench.yaml environment (`--sdm
# conda`), from a copy under .snakemake/conda/. It installs the plantbench package itself,
# editable, from the workflow's own source tree (the checkout whose Snakefile Snakemake runs,
# whatever the working directory or module setup), without touching the pinned dependencies the
# environment file already installed. That tree is PLANTBENCH_SOURCE, which
# workflow/rules/common.smk sets; run by hand (bash envs/plantbench.post-deploy.sh inside an
# activated env), it is the checkout that holds this script.
set -euo pipefail
src="${PLANTBENCH_SOURCE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
if ! grep -qs '^name = "plantbench"' "$src/pyproject.toml" || [ ! -d "$src/src/plantbench" ]; then
    echo "plantbench post-deploy: '$src' is not a plantbench source tree (no pyproject.toml" \
         "naming plantbench, or no src/plantbench/); run the workflow from a local clone of" \
         "the repository, or install plantbench into this environment by hand" >&2
    exit 1
fi
python -m pip install --no-deps -e "$src"
