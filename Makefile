# Two commands on a fresh machine: `make triton` (set-up, models, server) and `make test`.
PY := .venv/bin/python
MODEL_PROFILE ?= demo
HOST ?= 127.0.0.1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# the codegen failure domain's own Triton (docs/operations.md; TRITON_DOMAINS=one: one server on the ports above)
CODEGEN_HTTP_PORT ?= 8010
CODEGEN_GRPC_PORT ?= 8011
CODEGEN_METRICS_PORT ?= 8012
TRITON_IMAGE ?= triton-pipelines:latest
export MODEL_PROFILE HOST HTTP_PORT GRPC_PORT METRICS_PORT CODEGEN_HTTP_PORT CODEGEN_GRPC_PORT CODEGEN_METRICS_PORT CODEGEN_NICE

.PHONY: setup model train-demo triton test unit bench soak sweep triton-docker clean deploy-check docs fuzz cluster cluster-rolling

# GPU=1 (make setup GPU=1): the CUDA builds of torch and ONNX Runtime (requirements-gpu.txt) instead of the CPU ones
setup:
	@bash launcher/setup.sh

model: setup
	@$(PY) build/build_models.py --profile $(MODEL_PROFILE)

# The demo models again from scratch, even when their training code is unchanged (same bytes: fixed seeds, one thread).
train-demo: setup
	@DEMO_RETRAIN=1 $(PY) build/build_models.py --profile demo

# Serves at once what is built (text_embedding is built first if it is not: about a minute) and builds the
# demo pipelines that are not behind the running servers, each joining its server when ready (issue 57;
# launcher/build_behind.py). `make model` is the blocking build of everything.
triton: setup
	@exec $(PY) -m launcher --build-behind

# Redis + REPLICAS complete replicas (Triton, supervisor, gateway on CLUSTER_PORT+1+i) + HAProxy on CLUSTER_PORT,
# in the foreground (Ctrl-C stops everything); CLUSTER_MODELS=a,b: what each replica loads (default: every
# shipped model). `make cluster-rolling` (same CLUSTER_PORT and DATA_DIR) restarts the replicas one at a time.
REPLICAS ?= 2
CLUSTER_PORT ?= 8090
cluster: setup model
	@bash deploy/install_tools.sh || echo "cluster: could not install redis-server/haproxy (deploy/install_tools.sh)"
	@exec $(PY) -m launcher.cluster run --replicas $(REPLICAS) --port $(CLUSTER_PORT) --models "$(CLUSTER_MODELS)" $(if $(DATA_DIR),--data-dir $(DATA_DIR))

cluster-rolling: setup
	@$(PY) -m launcher.cluster rolling --port $(CLUSTER_PORT) $(if $(DATA_DIR),--data-dir $(DATA_DIR))

test: setup model
	@bash deploy/install_tools.sh || echo "test: prometheus/kubectl/chromium not installable: tests/test_deploy.py skips those checks, the browser tests fail"
	@$(PY) -m pytest $(PYTEST_ARGS)

# The docs site (MkDocs + Material) into site/; the same strict build runs in `make test` (tests/test_docs_site.py).
docs: setup
	@NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

unit: setup
	@$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

# Mixed load on every pipeline, bad requests and stub kills under the supervisor; exits non-zero on a missed goal.
SOAK_S ?= 120
soak: setup model
	@$(PY) -m bench.soak --seconds $(SOAK_S) $(SOAK_ARGS)

bench: setup model
	@$(PY) -m bench.suite $(BENCH_ARGS)

# Published ports bind loopback unless told otherwise (DOCKER_BIND=0.0.0.0: then set TRITON_ADMIN_KEY, docs/operations.md "Exposure").
# The gateway (8080) and Triton's metrics are published; Triton's HTTP/gRPC stay inside the container
# (docs/security.md). GATEWAY_API_KEYS_FILE=<keys file> is mounted as a secret; without it the
# container generates an admin key into /data/run/gateway_admin_key (docker exec ... cat it).
DOCKER_BIND ?= 127.0.0.1
GATEWAY_PORT ?= 8080
DOCKER_KEYS := $(if $(GATEWAY_API_KEYS_FILE),-v $(abspath $(GATEWAY_API_KEYS_FILE)):/run/secrets/gateway_api_keys:ro -e GATEWAY_API_KEYS_FILE=/run/secrets/gateway_api_keys)
triton-docker: model
	docker build -f Dockerfile.triton --build-arg BAKE_MODELS=0 -t $(TRITON_IMAGE) .
	docker run --rm --gpus all -p $(DOCKER_BIND):$(GATEWAY_PORT):8080 -p $(DOCKER_BIND):$(METRICS_PORT):8002 $(DOCKER_KEYS) \
		--shm-size=1g -e TRITON_ADMIN_KEY -v $(CURDIR)/model_repository:/opt/triton-pipelines/model_repository $(TRITON_IMAGE)

# schemathesis against a live gateway, with an admin key and with none, FUZZ_EXAMPLES per operation;
# prints the counts (tests/test_security_fuzz.py runs a bounded version in `make test`)
FUZZ_EXAMPLES ?= 200
fuzz: setup model
	@bash tools/fuzz_venv.sh
	@$(PY) tools/fuzz_gateway.py --max-examples $(FUZZ_EXAMPLES)

# deploy/ offline: Kustomize renders vs the Kubernetes schemas, yamllint, compose schema, Dockerfiles
# (static), and every PromQL expression on a real Prometheus + tritonserver under load.
deploy-check: setup model
	@bash deploy/install_tools.sh || echo "deploy-check: could not install prometheus/kubectl: their checks are skipped"
	@$(PY) tools/deploy_check.py $(DEPLOY_CHECK_ARGS)

clean:
	find model_repository -mindepth 3 -maxdepth 3 -path '*/[0-9]*/*' ! -name .gitkeep -exec rm -rf {} +

# The configuration matrix vs the FastAPI peer: bench-results/<date>/report.md + plots, and docs/performance.md's sweep section;
# then the gateway vs direct gRPC vs infinity-emb and fastembed (installed into .peers/, never .venv).
SWEEP_ARGS ?= --docs
sweep: setup model
	@bash bench/peers/setup_peers.sh || echo "sweep: a peer did not install: the comparison skips it"
	@$(PY) -m bench.sweep $(SWEEP_ARGS)
