#!/usr/bin/env bash
# Snakemake runs this once, inside the freshly created envs/plantbench.yaml environment, with the
# Snakemake working directory as the current directory (the repository root when you run
# `snakemake --profile profiles/slurm --sdm conda` there). It installs the plantbench package
# itself, editable (the rules then run the checked-out code), without touching the pinned
# dependencies that the environment file already installed.
set -euo pipefail
if ! grep -qs '^name = "plantbench"' pyproject.toml; then
    echo "plantbench post-deploy: '$PWD' is not the plantbench repository root;" \
         "run snakemake from the repository root (or pass --directory <repo root>)" >&2
    exit 1
fi
python -m pip install --no-deps -e .
