# Two commands on a fresh machine: `make triton` (set-up, models, server) and `make test`.
PY := .venv/bin/python
MODEL_PROFILE ?= demo
HOST ?= 127.0.0.1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
TRITON_IMAGE ?= triton-pipelines:latest
export MODEL_PROFILE HOST HTTP_PORT GRPC_PORT METRICS_PORT

.PHONY: setup model train-demo triton test unit bench soak sweep triton-docker clean deploy-check

setup:
	@bash tools/setup.sh

model: setup
	@$(PY) build/build_models.py --profile $(MODEL_PROFILE)

# The demo models again from scratch, even when their training code is unchanged (same bytes: fixed seeds, one thread).
train-demo: setup
	@DEMO_RETRAIN=1 $(PY) build/build_models.py --profile demo

triton: setup model
	@exec $(PY) tools/triton_launcher.py

test: setup model
	@bash deploy/install_tools.sh || echo "test: prometheus/kubectl not installable: tests/test_deploy.py skips those checks"
	@$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	@$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

# Mixed load on every pipeline, bad requests and stub kills under the supervisor; exits non-zero on a missed goal.
SOAK_S ?= 120
soak: setup model
	@$(PY) bench/soak.py --seconds $(SOAK_S) $(SOAK_ARGS)

bench: setup model
	@$(PY) bench/suite.py $(BENCH_ARGS)

# Published ports bind loopback unless told otherwise (DOCKER_BIND=0.0.0.0: then set TRITON_ADMIN_KEY, README "Exposure").
DOCKER_BIND ?= 127.0.0.1
triton-docker: model
	docker build -f Dockerfile.triton --build-arg BAKE_MODELS=0 -t $(TRITON_IMAGE) .
	docker run --rm --gpus all -p $(DOCKER_BIND):$(HTTP_PORT):8000 -p $(DOCKER_BIND):$(GRPC_PORT):8001 -p $(DOCKER_BIND):$(METRICS_PORT):8002 \
		--shm-size=1g -e TRITON_ADMIN_KEY -v $(CURDIR)/model_repository:/opt/triton-pipelines/model_repository $(TRITON_IMAGE)

# deploy/ offline: Kustomize renders vs the Kubernetes schemas, yamllint, compose schema, Dockerfiles
# (static), and every PromQL expression on a real Prometheus + tritonserver under load.
deploy-check: setup model
	@bash deploy/install_tools.sh || echo "deploy-check: could not install prometheus/kubectl: their checks are skipped"
	@$(PY) tools/deploy_check.py $(DEPLOY_CHECK_ARGS)

clean:
	find model_repository -mindepth 3 -maxdepth 3 -path '*/[0-9]*/*' ! -name .gitkeep -exec rm -rf {} +

# The configuration matrix vs the FastAPI peer: bench-results/<date>/report.md + plots, and README's sweep section.
SWEEP_ARGS ?= --readme
sweep: setup model
	@$(PY) bench/sweep.py $(SWEEP_ARGS)
