# Two entry points: `make study` runs the default study end to end, `make test` runs the tests.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.plantbench-installed
PEERS  := $(VENV)/.plantbench-peers-installed
PEERS_BENCH := $(VENV)/.plantbench-peers-bench-installed
SNAKEMAKE_ARGS ?=

.PHONY: study test install peers-bench lint format clean-results

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
# kronfluence, without its dependencies: it requires torchvision, which would pull a CUDA build;
# and at2, also without them: at2.attribution imports only torch, transformers, datasets,
# huggingface_hub, tqdm, pandas, nltk and spacy, which the extra already brings, while at2
# requires matplotlib, ipywidgets and scikit-learn besides)
KRONFLUENCE := kronfluence einconv einops opt_einsum at2
$(PEERS): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,peers]'
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt $(KRONFLUENCE)
	@touch $(PEERS)

# the peer benchmark (`plantbench bench`, group "peers") and its tests: bergson and dattri, also
# without their dependencies (bergson requires torchvision, torchaudio and bitsandbytes: CUDA
# builds), plus only the modules bergson imports (all pinned in constraints.txt)
PEER_BENCH := bergson dattri simple-parsing docstring_parser jaxtyping ml_dtypes peft petname
peers-bench: $(PEERS_BENCH)

$(PEERS_BENCH): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt $(PEER_BENCH)
	@touch $(PEERS_BENCH)

test: $(PEERS) $(PEERS_BENCH)
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
