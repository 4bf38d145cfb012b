"""Fuzz the gateway's HTTP API with schemathesis (in its own venv, tools/fuzz_venv.sh) from its
/openapi.json, every operation, with an admin key and with none, with every check schemathesis has
(issue 43 item 13): no 5xx, every response conforms to the documented statuses, content types, headers
and schemas, schema-invalid requests are refused and schema-valid ones accepted, undeclared methods are
answered 405 with Allow, protected operations refuse a request without a key, and the gateway is healthy
afterwards. The deliberate deviations are in ACCEPTED_400, each with its reason (docs/gateway-api.md).

`make fuzz` runs this against a Triton + gateway of its own (FUZZ_EXAMPLES per operation) and prints
the counts; tests/test_security_fuzz.py calls `fuzz` with a small bound."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMATHESIS = ROOT / ".fuzz-venv" / "bin" / "schemathesis"
PHASES = "examples,coverage,fuzzing"
# Deliberate deviations (docs/gateway-api.md, "Conformance", lists the same, with the same reasons): a
# schema-valid request these operations answer 400, because what the route checks there is something no
# JSON schema can say. Every other check applies to them as to every operation.
ACCEPTED_400 = {
    "POST /v1/embeddings": "dimensions above the model's own and texts over its maximum sequence length depend "
                           "on the model named",
    "POST /infer": "an image must decode (base64 of an image Pillow reads); texts over the model's maximum "
                   "sequence length depend on the model named",
    "POST /v1/caption": "the image must decode (base64 of an image Pillow reads)",
    "POST /collections/{name}/points": "images must decode; vectors must have the collection's dimension",
    "POST /collections/{name}/search": "an image must decode; a vector must have the collection's dimension",
    "PUT /collections/{name}": "the model must be a loaded CLIP model",
    "POST /load_clip_model": "the model named must be a CLIP model",
    "POST /unload_model": "a model shipped with the server cannot be unloaded",
    "POST /delete_model": "a model shipped with the server cannot be deleted",
}
POSITIVE_STATUSES = ["2XX", "3XX", "401", "403", "404", "409", "429", "5XX"]  # schemathesis' default


def config_text() -> str:
    """schemathesis.toml: the deviations above, one [[operations]] block each."""
    statuses = ", ".join(f'"{s}"' for s in sorted(POSITIVE_STATUSES + ["400"]))
    return "".join(f'[[operations]]\ninclude-name = "{name}"\n'
                   f"checks.positive_data_acceptance.expected-statuses = [{statuses}]\n\n"
                   for name in ACCEPTED_400)


def fuzz(url: str, key: str | None, max_examples: int, report_dir: Path, seed: int = 25,
         phases: str = PHASES) -> dict:
    """One schemathesis run; returns {"operations", "examples", "failures", "exit", "output"}."""
    report_dir.mkdir(parents=True, exist_ok=True)
    ndjson = report_dir / f"events-{'key' if key else 'nokey'}.ndjson"
    config = report_dir / "schemathesis.toml"
    config.write_text(config_text())
    command = [str(SCHEMATHESIS), "--config-file", str(config), "run", f"{url}/openapi.json", "--url", url, "--checks", "all",
               "--max-examples", str(max_examples), "--seed", str(seed), "--request-timeout", "120",
               "--phases", phases, "--continue-on-failure", "--no-color",
               "--report", "ndjson", "--report-ndjson-path", str(ndjson),
               "--suppress-health-check", "all", "--generation-database", "none"]
    if key:
        command += ["-H", f"Authorization: Bearer {key}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=report_dir,  # its cache too
                          env={"PATH": "/usr/bin:/bin", "HOME": str(report_dir), "NO_COLOR": "1"})
    counts = count(ndjson)
    return {**counts, "exit": done.returncode, "output": done.stdout[-20000:] + done.stderr[-4000:]}


def count(ndjson: Path) -> dict:
    """Operations, generated examples (test cases) and unique failures from schemathesis' event stream."""
    operations, examples, failures = set(), 0, set()
    for line in ndjson.read_text().splitlines() if ndjson.exists() else ():
        event = json.loads(line)
        for name, body in event.items():
            if name == "ScenarioFinished" and body.get("status") != "skip":
                recorder = body.get("recorder") or {}
                operations.add(recorder.get("label"))
                examples += len(recorder.get("cases", {}))
                for case_checks in (recorder.get("checks") or {}).values():
                    for check in case_checks:
                        if str(check.get("status")).lower() != "success":
                            failure = check.get("failure_info") or {}
                            failures.add((recorder.get("label"), check.get("name"),
                                          json.dumps(failure.get("failure", failure), sort_keys=True)[:300]))
    return {"operations": len(operations - {None}), "examples": examples, "failures": sorted(failures)}


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=200)
    parser.add_argument("--url", help="fuzz a running gateway (with --key) instead of starting one")
    parser.add_argument("--key", help="an admin key of the running gateway")
    parser.add_argument("--phases", default=PHASES, help=f"schemathesis' phases (default {PHASES})")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from security_helpers import KEYS, keyed_gateway
    from launcher.processes import free_port
    from launcher.triton_server import TritonServer

    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        tmp = Path(tmp)
        if args.url:
            runs = {"admin key": fuzz(args.url, args.key, args.max_examples, tmp, phases=args.phases)}
            ok = healthy(args.url)
        else:
            with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                              explicit_models=["text_embedding"], log_file=tmp / "tritonserver.log",
                              extra_repositories=[tmp / "data" / "triton_models"]) as server:
                class Live:
                    grpc_url = server.grpc_url
                gateway = keyed_gateway(Live, tmp)
                try:
                    runs = {"admin key": fuzz(gateway.url, KEYS["admin"], args.max_examples, tmp, phases=args.phases),
                            "no key": fuzz(gateway.url, None, args.max_examples, tmp, phases=args.phases)}
                    ok = healthy(gateway.url)
                finally:
                    gateway.stop()
    failed = False
    for name, run in runs.items():
        print(f"fuzz ({name}): {run['operations']} operations, {run['examples']} examples, "
              f"{len(run['failures'])} unique failures (schemathesis exit {run['exit']})")
        for failure in run["failures"]:
            print("  ", *failure)
        failed |= bool(run["failures"]) or run["exit"] != 0
    print(f"fuzz: gateway healthy afterwards: {ok}")
    return 1 if failed or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
