# Two commands on a fresh machine: `make triton` (set-up, models, server) and `make test`.
PY := .venv/bin/python
MODEL_PROFILE ?= demo
HOST ?= 127.0.0.1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
TRITON_IMAGE ?= triton-pipelines:latest
export MODEL_PROFILE HOST HTTP_PORT GRPC_PORT METRICS_PORT

.PHONY: setup model triton test unit bench sweep triton-docker clean

setup:
	@bash tools/setup.sh

model: setup
	@$(PY) build/build_models.py --profile $(MODEL_PROFILE)

triton: setup model
	@exec $(PY) tools/triton_launcher.py

test: setup model
	@$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	@$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

bench: setup model
	@$(PY) client/bench.py $(BENCH_ARGS)

triton-docker: model
	docker build -f Dockerfile.triton -t $(TRITON_IMAGE) .
	docker run --rm --gpus all -p $(HTTP_PORT):8000 -p $(GRPC_PORT):8001 -p $(METRICS_PORT):8002 \
		-v $(CURDIR)/model_repository:/models $(TRITON_IMAGE)

clean:
	find model_repository -mindepth 3 -maxdepth 3 -path '*/[0-9]*/*' ! -name .gitkeep -exec rm -rf {} +

sweep: setup model
	@$(PY) bench/sweep.py $(SWEEP_ARGS)
