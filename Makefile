# Quick start: `make demo` and `make test` set up .venv themselves on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
DEMO_DIR ?= demo-out

.PHONY: setup test test-fast lint demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all,test]'
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check ptconvert tests fixtures benchmarks
	$(BIN)/ruff format --check ptconvert tests fixtures benchmarks
	$(BIN)/mypy

demo: setup
	$(BIN)/python -m fixtures.build $(DEMO_DIR)
	@for f in $(DEMO_DIR)/*; do echo "== $$f"; $(BIN)/ptconvert info "$$f" || exit 1; done

bench: setup
	$(BIN)/python benchmarks/startup.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache *.egg-info
