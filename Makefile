# Two entry points: `make study` runs the default study end to end, `make test` runs the tests.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.plantbench-installed
PEERS  := $(VENV)/.plantbench-peers-installed
SNAKEMAKE_ARGS ?=

.PHONY: study test install lint format clean-results

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# plain `snakemake`: the default workflow profile (profiles/default) runs it on this machine
study: $(STAMP)
	$(BIN)/snakemake $(SNAKEMAKE_ARGS)

# the tests also compare against peer implementations (the `peers` extra: context-cite; and
# kronfluence, without its dependencies: it requires torchvision, which would pull a CUDA build)
KRONFLUENCE := kronfluence einconv einops opt_einsum
$(PEERS): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,peers]'
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt $(KRONFLUENCE)
	@touch $(PEERS)

test: $(PEERS)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/snakefmt --check Snakefile workflow/rules
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --lint

format: $(STAMP)
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests
	$(BIN)/snakefmt Snakefile workflow/rules

# everything the runs wrote under results/; the committed README.md and reference/ stay
clean-results:
	[ ! -d results ] || find results -mindepth 1 -maxdepth 1 ! -name README.md ! -name reference -exec rm -rf {} +
	rm -rf .snakemake/incomplete
