"""`make deploy-check`: validates deploy/ offline. The same functions back tests/test_deploy*.py.

Checks: Kustomize base and overlays rendered (`kubectl kustomize`) and every manifest validated against
the Kubernetes schemas bundled in kubernetes-validate; yamllint on every YAML file; deploy/compose.yaml
against the compose specification's schema (the one check-jsonschema vendors); Prometheus' config with
promtool; both Dockerfiles statically (they cannot be built without a Docker engine); the Grafana
dashboard parsed; and every PromQL expression of the dashboard and of prometheus-adapter's rule
evaluated by a real Prometheus scraping a real tritonserver (text_embedding) under a short load, with
the HPA's queue-time metric required to be non-empty and to rise with load.
A check whose tool is missing on the machine is skipped with the reason printed, never passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = {"base": K8S / "base", "cpu": K8S / "overlays" / "cpu", "gpu": K8S / "overlays" / "gpu",
                  "replicated": K8S / "overlays" / "replicated"}  # 2+ pods sharing state through Redis
KUBERNETES_VERSION = "1.30.0"  # pinned: the oldest minor still in common managed-cluster support
DASHBOARD = DEPLOY / "grafana" / "triton-pipelines.json"
ADAPTER_RULES = K8S / "base" / "prometheus-adapter-rules.yaml"
DOCKERFILES = [ROOT / "Dockerfile.triton", DEPLOY / "Dockerfile.cpu"]
HPA_METRIC = "triton_queue_time_per_request_us"
YAMLLINT_CONFIG = """
extends: default
rules:
  line-length: {max: 250}  # PromQL in the adapter rule
  document-start: disable
  comments: {min-spaces-from-content: 1}
  braces: {max-spaces-inside: 1}
  truthy: {check-keys: false}
"""


class Missing(Exception):
    """A tool the check needs is not on this machine: the check is skipped with this reason."""


# ---- Kubernetes ---------------------------------------------------------------------------------

def render(kustomization: Path) -> list[dict]:
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")  # e.g. Debian's 1.20 renders these too
    if kubectl is None:
        raise Missing("kubectl is not installed (deploy/install_tools.sh installs Debian's kubernetes-client)")
    out = subprocess.run([kubectl, "kustomize", str(kustomization)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def validate_manifests(docs: list[dict], version: str = KUBERNETES_VERSION) -> list[str]:
    """Every manifest against the bundled (strict) schema: unknown fields are errors too."""
    import kubernetes_validate

    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{doc.get('kind')}/{doc['metadata'].get('name')}: {e.message} at {list(e.path)}")
    return errors


def by_kind(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# ---- YAML, compose, Prometheus config -------------------------------------------------------------

def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def yamllint_problems(files: list[Path] | None = None) -> list[str]:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    conf = YamlLintConfig(YAMLLINT_CONFIG)
    problems = []
    for path in files or yaml_files():
        for p in linter.run(path.read_text(), conf, str(path)):
            name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            problems.append(f"{name}:{p.line}:{p.column}: {p.level} {p.desc} ({p.rule})")
    return problems


def compose_schema() -> dict:
    import check_jsonschema

    path = Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(path.read_text())


def compose_errors(compose: Path = DEPLOY / "compose.yaml") -> list[str]:
    import jsonschema

    data = yaml.safe_load(compose.read_text())
    validator = jsonschema.Draft7Validator(compose_schema())
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(data)]


def promtool_check_config(config: Path = DEPLOY / "prometheus" / "prometheus.yml") -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise Missing("promtool is not installed (deploy/install_tools.sh installs Debian's prometheus)")
    out = subprocess.run([promtool, "check", "config", "--syntax-only", str(config)], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr)
    return out.stdout.strip()


# ---- Dockerfiles (static: no Docker engine here) --------------------------------------------------

@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (Dockerfile syntax)."""
    instructions, buffer, start = [], "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        keyword, _, args = buffer.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        buffer = ""
    return instructions


def dockerignore_patterns() -> list[str]:
    path = ROOT / ".dockerignore"
    return [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")] if path.exists() else []


def ignored(relative: str) -> bool:
    """Whether .dockerignore keeps `relative` out of the build context (last matching pattern wins)."""
    import fnmatch

    result = False
    parts = relative.split("/")
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatchcase(p, pattern) or (pattern.startswith("**/") and fnmatch.fnmatchcase(p.split("/")[-1], pattern[3:]))
               for p in prefixes):
            result = not negate
    return result


def dockerfile_problems(path: Path) -> list[str]:
    """What a `docker build` from the repository root would trip on, found without building."""
    steps = parse_dockerfile(path)
    keywords = [s.keyword for s in steps]
    problems = []
    if not keywords or keywords[0] not in ("ARG", "FROM"):
        problems.append("must start with FROM (or ARG)")
    for required in ("FROM", "USER", "HEALTHCHECK", "CMD", "EXPOSE"):
        if required not in keywords:
            problems.append(f"no {required}")
    users = [s.args for s in steps if s.keyword == "USER"]
    if users and users[-1].split(":")[0] in ("root", "0"):
        problems.append("runs as root")
    copied: set[str] = set()
    for step in steps:
        if step.keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(step.args) if not w.startswith("--")]
            if any(w.startswith("--from") for w in shlex.split(step.args)):
                continue
            for source in words[:-1]:
                source = source.rstrip("/") or "."
                if source != "." and ignored(source):
                    problems.append(f"line {step.line}: COPY source {source} is excluded by .dockerignore")
                elif source != "." and not (ROOT / source).exists():
                    problems.append(f"line {step.line}: COPY source {source} does not exist")
                copied.add(source)
    # Files the image runs must exist in the repository and be in the build context.
    runs = " ".join(s.args for s in steps if s.keyword in ("RUN", "CMD", "ENTRYPOINT", "HEALTHCHECK"))
    scripts = re.findall(r"\b((?:tools|build|gateway|deploy|launcher)/[\w./-]+\.(?:py|sh))\b", runs)
    started = " ".join(s.args for s in steps if s.keyword in ("CMD", "ENTRYPOINT"))  # `python -m <package>`
    modules = [name.replace(".", "/") + "/__main__.py" for name in re.findall(r'(?:"-m",\s*"|-m\s+)([\w.]+)', started)]
    for referenced in sorted(set(scripts + modules)):
        if not (ROOT / referenced).is_file():
            problems.append(f"references {referenced}, which does not exist")
        elif ignored(referenced):
            problems.append(f"references {referenced}, excluded by .dockerignore")
        elif "." not in copied and not any(referenced.startswith(c.rstrip("/") + "/") or referenced == c for c in copied):
            problems.append(f"references {referenced}, never copied into the image")
    for needed in ("requirements.txt", "constraints.txt", "model_repository/text_embedding/config.pbtxt",
                   "backends/text_tokenizer/model.py"):
        if ignored(needed):
            problems.append(f"{needed} is excluded by .dockerignore")
    if not ignored(".venv") or not ignored("model_repository/text_embedding/1/model.safetensors"):
        problems.append(".dockerignore must keep .venv and built model artifacts out of the context")
    return problems


# ---- PromQL: dashboard and adapter rule -----------------------------------------------------------

GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$model": ".*"}


def dashboard_expressions(path: Path = DASHBOARD) -> dict[str, str]:
    dashboard = json.loads(path.read_text())
    exprs = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs[f"{panel['title']} [{target['refId']}]"] = target["expr"]
    return exprs


def substitute_grafana(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    return expr


def adapter_rules(path: Path = ADAPTER_RULES) -> list[dict]:
    return yaml.safe_load(path.read_text())["rules"]


def adapter_query(rule: dict, label_matchers: str = 'job="triton"', group_by: str = "instance") -> str:
    """The adapter's metricsQuery as it sends it, with a local server's labels in place of the pod's."""
    return rule["metricsQuery"].replace("<<.LabelMatchers>>", label_matchers).replace("<<.GroupBy>>", group_by)


class Prometheus:
    """A Prometheus server on a free port scraping the given targets every second."""

    def __init__(self, targets: dict[str, tuple[str, str]], workdir: Path):
        from launcher.processes import free_port

        self.binary = shutil.which("prometheus")
        if self.binary is None:
            raise Missing("prometheus is not installed (deploy/install_tools.sh installs Debian's prometheus)")
        self.port = free_port()
        self.workdir = workdir
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": job, "metrics_path": path, "static_configs": [{"targets": [address]}]}
                                     for job, (address, path) in targets.items()]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "Prometheus":
        log = open(self.workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={self.workdir / 'prometheus.yml'}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError("prometheus not ready")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query; raises on a PromQL error (bad syntax, bad function, ...)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at else {})
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError(f"{body.get('errorType')}: {body.get('error')} in {expr}")
        return body["data"]["result"]

    def stop(self) -> None:
        if self.process is not None:
            from launcher.processes import terminate

            terminate(self.process, 30)
            self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def drive_load(grpc_url: str, concurrency: int, seconds: float) -> int:
    """Closed-loop load on text_embedding from `concurrency` threads; returns the requests answered."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    done, stop_at = [0] * concurrency, time.monotonic() + seconds
    text = ("A man is eating a piece of bread while the band plays on the old town square. " * 3).encode()

    def worker(i: int) -> None:
        client = grpcclient.InferenceServerClient(grpc_url)
        inputs = grpcclient.InferInput("text", [1, 1], "BYTES")
        inputs.set_data_from_numpy(np.array([[text]], dtype=object))
        while time.monotonic() < stop_at:
            client.infer("text_embedding", [inputs])
            done[i] += 1
        client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


@dataclass
class LiveResult:
    values: dict[str, list[dict]]      # every expression's result at the end of the load
    low: float                         # HPA metric (µs queued per request) over the light phase
    high: float                        # ... over the heavy phase
    requests: tuple[int, int]


def scalar(result: list[dict]) -> float:
    assert result, "empty result"
    return max(float(r["value"][1]) for r in result)


def gateway_requests(url: str, count: int) -> int:
    """/v1/embeddings calls through the gateway, so its request counter and histogram have samples."""
    import httpx

    ok = 0
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(count):
            r = client.post("/v1/embeddings", json={"model": "sentence-transformers/all-MiniLM-L6-v2",
                                                    "input": [f"deploy check {i}"]})
            ok += r.status_code == 200
        client.post("/v1/embeddings", json={"model": "no-such-model", "input": ["x"]})  # one 404: errors_total
    return ok


def live_promql_check(workdir: Path, low_concurrency: int = 1, high_concurrency: int = 32,
                      phase_seconds: float = 15.0) -> LiveResult:
    """tritonserver (text_embedding) + the gateway + Prometheus scraping both; light then heavy load on
    text_embedding and a few gateway calls; then every expression is evaluated."""
    from launcher.gateway_process import GatewayProcess
    from launcher.processes import free_port
    from launcher.triton_server import TritonServer

    data_dir = workdir / "data"
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          explicit_models=["text_embedding"], log_file=workdir / "triton.log",
                          extra_args=["--metrics-interval-ms=500"], extra_repositories=[data_dir / "triton_models"])
    gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=data_dir, log_file=workdir / "gateway.log",
                             env={"PRELOAD_MODELS": ""})
    targets = {"triton": (f"127.0.0.1:{server.metrics_port}", "/metrics"),
               "gateway": (gateway.url.removeprefix("http://"), "/metrics/prometheus")}
    with server, gateway:
        with Prometheus(targets, workdir) as prom:
            time.sleep(3)  # a first scrape before any load: rates start from zero
            gateway_ok = gateway_requests(gateway.url, 20)
            low_requests = drive_load(server.grpc_url, low_concurrency, phase_seconds)
            time.sleep(2)
            low_end = time.time()
            high_requests = drive_load(server.grpc_url, high_concurrency, phase_seconds)
            gateway_ok += gateway_requests(gateway.url, 10)
            time.sleep(2)
            high_end = time.time()
            window = f"[{int(phase_seconds)}s]"
            rule = adapter_rules()[0]
            phase_query = adapter_query(rule).replace("[1m]", window)
            low = scalar(prom.query(phase_query, at=low_end))
            high = scalar(prom.query(phase_query, at=high_end))
            values = {"adapter: " + rule["name"]["as"]: prom.query(adapter_query(rule))}
            for title, expr in dashboard_expressions().items():
                values[title] = prom.query(substitute_grafana(expr))
    if gateway_ok != 30:
        raise AssertionError(f"only {gateway_ok} of 30 gateway requests answered 200 (log: {workdir / 'gateway.log'})")
    return LiveResult(values, low, high, (low_requests, high_requests))


# ---- command line ---------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-live", action="store_true", help="skip the live Prometheus + tritonserver check")
    args = parser.parse_args()
    failures, skips = [], []

    def check(name, fn):
        try:
            detail = fn()
            print(f"ok    {name}" + (f": {detail}" if detail else ""), flush=True)
        except Missing as e:
            skips.append(name)
            print(f"SKIP  {name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - every check reports, then the exit code says
            failures.append(name)
            print(f"FAIL  {name}: {e}", flush=True)

    def expect_none(problems):
        if problems:
            raise AssertionError("\n      " + "\n      ".join(problems))
        return ""

    for name, path in KUSTOMIZATIONS.items():
        check(f"kustomize {name} renders and validates (Kubernetes {KUBERNETES_VERSION}, strict)",
              lambda path=path: (lambda docs: expect_none(validate_manifests(docs)) or
                                 f"{len(docs)} manifests: " + ", ".join(sorted(d['kind'] for d in docs)))(render(path)))
    check(f"yamllint ({len(yaml_files())} files)", lambda: expect_none(yamllint_problems()))
    check("compose.yaml against the compose specification schema", lambda: expect_none(compose_errors()))
    check("prometheus.yml (promtool check config)", promtool_check_config)
    for dockerfile in DOCKERFILES:
        check(f"{dockerfile.relative_to(ROOT)} (static; not built: no Docker engine here)",
              lambda d=dockerfile: expect_none(dockerfile_problems(d)))
    check("dashboard JSON", lambda: f"{len(dashboard_expressions())} PromQL expressions")
    if not args.no_live:
        def live():
            with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
                result = live_promql_check(Path(tmp))
            problems = []
            for title, value in result.values.items():
                if not value:
                    problems.append(f"{title}: empty")
            if not result.high > result.low:
                problems.append(f"queue time per request did not rise with load: {result.low:.0f} -> {result.high:.0f} µs")
            expect_none(problems)
            return (f"{len(result.values)} expressions evaluated, none empty; queue time per request {result.low:.0f} µs at c=1 ({result.requests[0]} requests) -> "
                    f"{result.high:.0f} µs at c=32 ({result.requests[1]} requests)")
        check("PromQL of dashboard + adapter rule on a live tritonserver under load", live)
    print(f"deploy-check: {len(failures)} failed, {len(skips)} skipped" + (f" ({', '.join(skips)})" if skips else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
