"""Fuzz the gateway's HTTP API with schemathesis (in its own venv, tools/fuzz_venv.sh) from its
/openapi.json, every operation, with an admin key and with none, with every check schemathesis has
(issue 43 item 13): no 5xx, every response conforms to the documented statuses, content types, headers
and schemas, schema-invalid requests are refused and schema-valid ones accepted, undeclared methods are
answered 405 with Allow, protected operations refuse a request without a key, and the gateway is healthy
afterwards. No check is relaxed and no operation is excepted: the document says what the gateway enforces
(static bounds in the request schemas, state-dependent refusals as 404/409 in each operation's responses:
docs/gateway-api.md "Conformance"). Images are the gateway's string format `image`: tools/fuzz_hooks.py
tells schemathesis how to make one.

`make fuzz` runs this against a Triton + gateway of its own (FUZZ_EXAMPLES per operation) and prints
the counts; tests/test_security_fuzz.py calls `fuzz` with a small bound."""
from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from gateway.keys import key_line
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

ROOT = Path(__file__).resolve().parent.parent
SCHEMATHESIS = ROOT / ".fuzz-venv" / "bin" / "schemathesis"
HOOKS = ROOT / "tools" / "fuzz_hooks.py"  # loaded by schemathesis in its venv, by module name
PHASES = "examples,coverage,fuzzing"

def fuzz(url: str, key: str | None, max_examples: int, report_dir: Path, seed: int = 25,
         phases: str = PHASES) -> dict:
    """One schemathesis run; returns {"operations", "examples", "failures", "exit", "output"}."""
    report_dir.mkdir(parents=True, exist_ok=True)
    ndjson = report_dir / f"events-{'key' if key else 'nokey'}.ndjson"
    command = [str(SCHEMATHESIS), "run", f"{url}/openapi.json", "--url", url, "--checks", "all",
               "--max-examples", str(max_examples), "--seed", str(seed), "--request-timeout", "120",
               "--phases", phases, "--continue-on-failure", "--no-color",
               "--report", "ndjson", "--report-ndjson-path", str(ndjson),
               "--suppress-health-check", "all", "--generation-database", "none"]
    if key:
        command += ["-H", f"Authorization: Bearer {key}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=report_dir,  # its cache too
                          env={"PATH": "/usr/bin:/bin", "HOME": str(report_dir), "NO_COLOR": "1",
                               "PYTHONPATH": str(HOOKS.parent), "SCHEMATHESIS_HOOKS": HOOKS.stem})
    counts = count(ndjson)
    return {**counts, "exit": done.returncode, "output": done.stdout[-20000:] + done.stderr[-4000:]}


def count(ndjson: Path) -> dict:
    """Operations, generated examples (test cases), the checks that ran and the unique failures, from
    schemathesis' event stream."""
    operations, examples, checks, failures = set(), 0, set(), set()
    for line in ndjson.read_text().splitlines() if ndjson.exists() else ():
        event = json.loads(line)
        for name, body in event.items():
            if name == "ScenarioFinished" and body.get("status") != "skip":
                recorder = body.get("recorder") or {}
                operations.add(recorder.get("label"))
                examples += len(recorder.get("cases", {}))
                for case_checks in (recorder.get("checks") or {}).values():
                    for check in case_checks:
                        checks.add(check.get("name"))
                        if str(check.get("status")).lower() != "success":
                            failure = check.get("failure_info") or {}
                            failures.add((recorder.get("label"), check.get("name"),
                                          json.dumps(failure.get("failure", failure), sort_keys=True)[:300]))
    return {"operations": len(operations - {None}), "examples": examples, "checks": sorted(checks - {None}),
            "failures": sorted(failures)}


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
            return response.status == 200
    except OSError:
        return False


def both(url: str, admin_key: str | None, max_examples: int, report_dir: Path, phases: str = PHASES) -> dict:
    """A run with the admin key (when there is one) and a run without a key."""
    runs = {"admin key": fuzz(url, admin_key, max_examples, report_dir, phases=phases)} if admin_key else {}
    return {**runs, "no key": fuzz(url, None, max_examples, report_dir, phases=phases)}


def admin_gateway(triton_grpc_url: str, admin_key: str, tmp: Path) -> GatewayProcess:
    """A gateway on a free port with one admin key and its own DATA_DIR; HF_ENDPOINT points nowhere, so no
    name schemathesis makes up can start a download."""
    keys = tmp / "gateway_api_keys"
    keys.write_text(key_line(admin_key, "fuzz-admin", "admin"))
    (tmp / "data").mkdir(exist_ok=True)
    return GatewayProcess(triton_grpc_url, port=free_port(), data_dir=tmp / "data", log_file=tmp / "gateway.log",
                          env={"GATEWAY_API_KEYS_FILE": str(keys), "HF_ENDPOINT": "http://127.0.0.1:9"}
                          ).start(timeout=180)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=200)
    parser.add_argument("--url", help="fuzz a running gateway (with --key) instead of starting one")
    parser.add_argument("--key", help="an admin key of the running gateway (a run with it, then one without)")
    parser.add_argument("--phases", default=PHASES, help=f"schemathesis' phases (default {PHASES})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        tmp = Path(tmp)
        if args.url:
            runs = both(args.url, args.key, args.max_examples, tmp, args.phases)
            ok = healthy(args.url)
        else:
            with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                              explicit_models=["text_embedding"], log_file=tmp / "tritonserver.log",
                              extra_repositories=[tmp / "data" / "triton_models"]) as server:
                admin_key = f"gk-fuzz-{secrets.token_hex(16)}"
                gateway = admin_gateway(server.grpc_url, admin_key, tmp)
                try:
                    runs = both(gateway.url, admin_key, args.max_examples, tmp, args.phases)
                    ok = healthy(gateway.url)
                finally:
                    gateway.stop()
    failed = False
    for name, run in runs.items():
        print(f"fuzz ({name}): {run['operations']} operations, {run['examples']} examples, "
              f"{len(run['checks'])} checks ran, {len(run['failures'])} unique failures "
              f"(schemathesis exit {run['exit']})")
        for failure in run["failures"]:
            print("  ", *failure)
        failed |= bool(run["failures"]) or run["exit"] != 0
    print(f"fuzz: gateway healthy afterwards: {ok}")
    return 1 if failed or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
