"""The pipelines served by Triton on the CPU and then on a GPU (KIND_GPU), compared (tools/gpu_check.sh runs it).

Each run serves a copy of model_repository/ whose configs are rewritten: the network stages' KIND_AUTO instances
become KIND_CPU (the reference) or KIND_GPU, their `runtime` torch (and the generator's `engine` torch), so that
both runs compute with the same code on the same weights. One request per pipeline (HTTP/JSON, no tritonclient),
its outputs on the GPU against the CPU's, and the load at concurrency 16: requests/s for text_embedding, generated
tokens/s for codegen. No fallback hides a CPU: a KIND_GPU instance whose runtime cannot use the GPU fails to load
(backends/stage_common/gpu_placement.py) and its pipeline is reported as failed, with Triton's reason."""
from __future__ import annotations

import argparse
import http.client
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".gpu-check"
PIPELINES = ("text_embedding", "ner", "food_captioning", "codegen")
# the network stages: their instance kind and runtime are what a run sets
NETWORK_STAGES = {"text_embedding_encoder": {"runtime": "torch"}, "ner_tagger": {"runtime": "torch"},
                  "food_captioning_classifier": {"runtime": "torch"},
                  "food_captioning_captioner": {"runtime": "torch"}, "codegen_generator": {"engine": "torch"}}
STAGE_OF = {"text_embedding": "text_embedding_encoder", "ner": "ner_tagger",
            "food_captioning": "food_captioning_captioner", "codegen": "codegen_generator"}
CODEGEN_TOKENS = 32
FLOAT_TOLERANCE = 1e-3


# ---- model repository copies -------------------------------------------------------------------------------

def rewrite_config(text: str, kind: str | None = None, parameters: dict[str, str] | None = None) -> str:
    """config.pbtxt with its KIND_AUTO instance groups set to `kind`, and each of `parameters` set (its value
    replaced where the config has it, else one `parameters { ... }` entry appended)."""
    if kind is not None:
        text = re.sub(r"\bKIND_AUTO\b", kind, text)
    for key, value in (parameters or {}).items():
        entry = re.compile(r'(key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*")[^"]*(")')
        text, found = entry.subn(lambda m: m.group(1) + value + m.group(2), text)
        if not found:
            text = text.rstrip("\n") + f'\nparameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return text


def prepare_repository(dest: Path, kind: str, runtime: str = "torch", source: Path = ROOT / "model_repository",
                       models: list[str] | None = None) -> Path:
    """A copy of `source` (configs rewritten; the version folders linked, not copied) in `dest`."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for config in sorted(source.glob("*/config.pbtxt")):
        model = config.parent.name
        if models is not None and model not in models:
            continue
        (dest / model).mkdir()
        parameters = {k: (runtime if k == "runtime" else v) for k, v in NETWORK_STAGES.get(model, {}).items()}
        (dest / model / "config.pbtxt").write_text(rewrite_config(config.read_text(), kind, parameters))
        for version in config.parent.iterdir():
            if version.is_dir() and version.name.isdigit():
                (dest / model / version.name).symlink_to(version.resolve(), target_is_directory=True)
    return dest


def models_of(pipelines: list[str], source: Path = ROOT / "model_repository") -> list[str]:
    """The pipelines' ensembles and every model their steps name (codegen's streaming front too)."""
    wanted = set(pipelines)
    for name in pipelines:
        text = (source / name / "config.pbtxt").read_text()
        wanted |= set(re.findall(r'model_name:\s*"([^"]+)"', text))
    if "codegen" in pipelines:
        wanted |= {"codegen_stream", "codegen_generator"}
    return sorted(m for m in wanted if (source / m / "config.pbtxt").is_file())


# ---- KServe v2 over HTTP -----------------------------------------------------------------------------------

@dataclass
class Tensor:
    name: str
    datatype: str  # BYTES, INT32, FP32, ...
    values: list  # one request's rows, [1, n] (bytes for BYTES)


def infer_body(inputs: list[Tensor], outputs: list[str]) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 request: BYTES inputs in Triton's binary extension (length-prefixed, after the JSON), the
    others in the JSON; every output asked for as JSON."""
    header: dict = {"inputs": [], "outputs": [{"name": o, "parameters": {"binary_data": False}} for o in outputs]}
    blobs = []
    for tensor in inputs:
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": [1, len(tensor.values)]}
        if tensor.datatype == "BYTES":
            blob = b"".join(struct.pack("<I", len(v)) + v for v in tensor.values)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = tensor.values
        header["inputs"].append(entry)
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head)),
                                    "Content-Type": "application/octet-stream"}


def parse_outputs(body: bytes) -> dict[str, list]:
    """A JSON KServe v2 response -> {output name: its values, flat}."""
    return {o["name"]: o["data"] for o in json.loads(body)["outputs"]}


class Client:
    """One keep-alive HTTP connection to Triton."""

    def __init__(self, url: str, timeout: float = 120.0):
        host, port = url.split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=timeout)

    def infer(self, model: str, inputs: list[Tensor], outputs: list[str]) -> dict[str, list]:
        body, headers = infer_body(inputs, outputs)
        self.connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{model}: HTTP {response.status}: {data[:400].decode(errors='replace')}")
        return parse_outputs(data)

    def get(self, path: str, method: str = "GET") -> tuple[int, object]:
        self.connection.request(method, path, b"{}" if method == "POST" else None)
        response = self.connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None

    def close(self) -> None:
        self.connection.close()


def food_image(seed: int = 0) -> bytes:
    """A JPEG made here: a gradient with a disc, like tests/food_images.py's photo."""
    from PIL import Image, ImageDraw

    y, x = np.mgrid[0:120, 0:160]
    pixels = np.stack([x * 255 // 159, y * 255 // 119, np.full_like(x, 60 + 40 * seed)], -1).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    ImageDraw.Draw(image).ellipse((40, 30, 120, 90), fill=(200, 40 + seed, 30))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def request_of(pipeline: str, variant: int = 0) -> tuple[list[Tensor], list[str]]:
    """One request per pipeline (variant picks another text or prompt, for the load)."""
    if pipeline == "text_embedding":
        text = ["The GPU check embeds this sentence.", "A man is eating food.", "Triton on a GPU"][variant % 3]
        return [Tensor("text", "BYTES", [text.encode()])], ["embedding"]
    if pipeline == "ner":
        return [Tensor("text", "BYTES", [b"George Washington met Angela Merkel in Munich."])], ["entities"]
    if pipeline == "food_captioning":
        return [Tensor("image", "BYTES", [food_image()])], ["label", "score", "caption"]
    prompt = ["def fibonacci(n):", "import os\n", "class Stack:", "for i in range(10):"][variant % 4]
    return ([Tensor("text_input", "BYTES", [prompt.encode()]), Tensor("max_tokens", "INT32", [CODEGEN_TOKENS]),
             Tensor("temperature", "FP32", [0.0])], ["text_output", "completion_tokens", "finish_reason"])


# ---- comparing and measuring -------------------------------------------------------------------------------

def compare(cpu: dict[str, list], gpu: dict[str, list]) -> tuple[bool, str]:
    """(equal, how) over every output: numbers within FLOAT_TOLERANCE, text exactly."""
    notes, equal = [], True
    for name in sorted(cpu):
        a, b = cpu[name], gpu.get(name)
        if b is None:
            return False, f"{name} missing on the GPU"
        if all(isinstance(v, (int, float)) for v in a + b):
            if len(a) != len(b):
                return False, f"{name}: {len(a)} values on the CPU, {len(b)} on the GPU"
            diff = float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))
            equal &= diff <= FLOAT_TOLERANCE
            if diff:
                notes.append(f"{name} max |diff| {diff:.1e}")
        elif a != b:
            text_a, text_b = str(a[0] if len(a) == 1 else a), str(b[0] if len(b) == 1 else b)
            at = next((i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y), min(len(text_a), len(text_b)))
            return False, f"{name} differs from char {at}: cpu {text_a[at:at + 40]!r}, gpu {text_b[at:at + 40]!r}"
    return equal, ("equal" + (f" ({', '.join(notes)})" if notes else "")) if equal else "; ".join(notes)


@dataclass
class Load:
    seconds: float
    requests: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def measure(url: str, pipeline: str, concurrency: int = 16, seconds: float = 10.0) -> Load:
    """`concurrency` clients, each sending the pipeline's requests one after another for `seconds`."""
    load, lock = Load(seconds), threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(index: int) -> None:
        connection, n = Client(url), 0
        try:
            while time.monotonic() < stop_at:
                inputs, outputs = request_of(pipeline, index + n)
                try:
                    answer = connection.infer(pipeline, inputs, outputs)
                except Exception as exc:  # noqa: BLE001 - counted and shown, the load goes on
                    with lock:
                        load.errors.append(str(exc))
                    connection.close()
                    connection = Client(url)
                    continue
                n += 1
                with lock:
                    load.requests += 1
                    load.tokens += int(answer.get("completion_tokens", [0])[0])
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return load


# ---- a server run ------------------------------------------------------------------------------------------

@dataclass
class Run:
    kind: str  # KIND_CPU or KIND_GPU
    outputs: dict[str, dict] = field(default_factory=dict)  # pipeline -> outputs
    failures: dict[str, str] = field(default_factory=dict)  # pipeline -> why
    devices: dict[str, str] = field(default_factory=dict)  # pipeline -> what its network stage ran on
    loads: dict[str, Load] = field(default_factory=dict)
    seconds: float = 0.0


def gpu_memory_by_pid() -> dict[int, int]:
    """MiB of GPU memory per process, from nvidia-smi ({} where it shows none, e.g. in a container)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    usage = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            usage[int(parts[0])] = int(parts[1])
    return usage


def gpu_placement_problem(config: object) -> str | None:
    """What keeps a model off the GPU in Triton's own view, its config as the server serves it
    (GET /v2/models/<model>/config: every instance group KIND_GPU with its GPUs), or None when all are on one."""
    groups = config.get("instance_group") if isinstance(config, dict) else None
    if not groups:
        return f"Triton's config shows no instance group: {str(config)[:200]}"
    wrong = [f"{g.get('kind')} gpus {g.get('gpus', [])}" for g in groups if g.get("kind") != "KIND_GPU" or
             not g.get("gpus")]
    return f"Triton placed instance group(s) on {', '.join(wrong)}, not KIND_GPU" if wrong else None


def stage_devices(server_pid: int, kind: str, pipelines: list[str], client: "Client | None" = None
                  ) -> tuple[dict[str, str], dict[str, str]]:
    """({pipeline: what its network stage runs on}, {pipeline: why it is not on the GPU}): on a KIND_GPU run,
    the instance groups Triton's served config gives the stage (its GPUs; any other kind is a failure) and, where
    nvidia-smi shows them, its stubs' GPU memory (a GPU instance that loaded passed the stage's device check)."""
    from supervisor.stubs import model_of, scan_stub_pids

    memory = gpu_memory_by_pid()
    stubs = scan_stub_pids(server_pid)
    out, problems = {}, {}
    for pipeline in pipelines:
        stage = STAGE_OF[pipeline]
        if kind != "KIND_GPU":
            out[pipeline] = f"CPU ({stage})"
            continue
        gpus = "GPU 0"
        if client is not None:
            try:
                status, config = client.get(f"/v2/models/{stage}/config")
            except (OSError, http.client.HTTPException, ValueError) as exc:
                client.connection.close()
                status, config = type(exc).__name__, None
            problem = gpu_placement_problem(config) if status == 200 else f"config not served: {status}"
            if problem is not None:
                problems[pipeline] = f"{stage}: {problem}"
            else:
                gpus = "GPU " + ",".join(str(g) for group in config["instance_group"] for g in group["gpus"])
        used = [memory[pid] for pid, instance in stubs.items() if model_of(instance) == stage and pid in memory]
        out[pipeline] = f"{gpus} ({stage}" + (f": {sum(used)} MiB in {len(used)} stub(s))" if used else ")")
    return out, problems


def wait_loaded(client: Client, process, timeout: float) -> dict[str, dict]:
    """Until the server answers (it serves once every model has loaded or failed): the repository index."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {process.returncode}")
        try:
            status, index = client.get("/v2/repository/index", "POST")
            if status == 200:
                return {entry["name"]: entry for entry in index}
        except (OSError, http.client.HTTPException):
            client.connection.close()
        time.sleep(1.0)
    raise TimeoutError(f"tritonserver not serving after {timeout:.0f}s")


def serve_and_check(kind: str, pipelines: list[str], runtime: str, load_s: float, work: Path,
                    start_timeout: float = 300.0) -> Run:
    from launcher.processes import free_port
    from launcher.triton_server import TritonServer

    run, started = Run(kind), time.monotonic()
    repository = prepare_repository(work / f"repository-{kind.lower()}", kind, runtime, models=models_of(pipelines))
    server = TritonServer(model_repository=repository, http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port(), log_file=work / f"triton-{kind.lower()}.log",
                          extra_args=["--exit-on-error=false", "--model-load-thread-count=8"])
    server.launch()
    client = Client(server.http_url)
    try:
        try:
            index = wait_loaded(client, server.process, start_timeout)
        except (RuntimeError, TimeoutError) as exc:  # every pipeline fails with it; the log's end says why
            tail = server.log_file.read_text(errors="replace").splitlines()[-15:] if server.log_file.exists() else []
            print(f"gpu_check: {kind}: {exc}\n" + "\n".join(tail), flush=True)
            run.failures = {pipeline: f"tritonserver: {exc}" for pipeline in pipelines}
            return run
        print(f"gpu_check: {kind}: {sum(e.get('state') == 'READY' for e in index.values())}/{len(index)} models "
              f"ready after {time.monotonic() - started:.0f}s", flush=True)
        for pipeline in pipelines:
            broken = [f"{m}: {index[m].get('reason', index[m].get('state'))}" for m in models_of([pipeline])
                      if m in index and index[m].get("state") != "READY"]
            if broken:
                run.failures[pipeline] = "; ".join(broken)[:300]
                continue
            try:
                run.outputs[pipeline] = client.infer(pipeline, *request_of(pipeline))
            except Exception as exc:  # noqa: BLE001 - reported in the table
                run.failures[pipeline] = str(exc)[:300]
        run.devices, off_gpu = stage_devices(server.process.pid, kind, pipelines, client)
        for pipeline, problem in off_gpu.items():  # answered, but not where it should have been computed
            run.failures.setdefault(pipeline, problem)
        for pipeline in ("text_embedding", "codegen"):
            if pipeline in run.outputs and load_s > 0:
                run.loads[pipeline] = measure(server.http_url, pipeline, 16, load_s)
    finally:
        client.close()
        server.stop()
    run.seconds = time.monotonic() - started
    return run


# ---- the table ---------------------------------------------------------------------------------------------

def throughput(pipeline: str, load: Load | None) -> str:
    if load is None:
        return "-"
    errors = f", {len(load.errors)} errors" if load.errors else ""
    if pipeline == "codegen":
        return f"{load.tokens_per_s:.0f} tokens/s{errors}"
    return f"{load.requests_per_s:.1f} req/s{errors}"


def table(cpu: Run, gpu: Run | None, pipelines: list[str]) -> tuple[str, bool]:
    """The report (a Markdown table, as docs/deployment.md keeps it) and whether every pipeline passed."""
    rows = ["| pipeline | device | output vs CPU | c=16 on the GPU | c=16 on the CPU |", "|---|---|---|---|---|"]
    ok = True
    for pipeline in pipelines:
        cpu_load = throughput(pipeline, cpu.loads.get(pipeline))
        if pipeline in cpu.failures:
            ok = False
            if gpu is not None and pipeline in gpu.outputs:  # the GPU's numbers stand, with nothing to compare
                rows.append(f"| {pipeline} | {gpu.devices.get(pipeline, '?')} | no CPU reference: CPU run failed: "
                            f"{cpu.failures[pipeline]} | {throughput(pipeline, gpu.loads.get(pipeline))} | - |")
            else:
                rows.append(f"| {pipeline} | - | CPU run failed: {cpu.failures[pipeline]} | - | - |")
            continue
        if gpu is None:
            rows.append(f"| {pipeline} | {cpu.devices.get(pipeline, 'CPU')} | (no GPU run) | - | {cpu_load} |")
            continue
        if pipeline in gpu.failures:
            rows.append(f"| {pipeline} | - | GPU run failed: {gpu.failures[pipeline]} | - | {cpu_load} |")
            ok = False
            continue
        equal, how = compare(cpu.outputs[pipeline], gpu.outputs[pipeline])
        ok &= equal
        rows.append(f"| {pipeline} | {gpu.devices.get(pipeline, '?')} | {how} | "
                    f"{throughput(pipeline, gpu.loads.get(pipeline))} | {cpu_load} |")
    return "\n".join(rows), ok


def gpu_tests_verdict(junit: Path, gpu_visible: bool) -> tuple[bool, str]:
    """(passed, summary) of the gpu tests' pytest run from its --junitxml report. A run in which nothing ran is
    no pass (pytest's exit status 5 says so only when nothing was collected; all skipped exits 0), and where a
    GPU is visible every test must run: a skip there means a part of the GPU path went unchecked."""
    import xml.etree.ElementTree as ElementTree

    if not junit.is_file():
        return False, f"no report {junit}: pytest did not finish"
    cases = list(ElementTree.parse(junit).getroot().iter("testcase"))
    skipped = [c for c in cases if c.find("skipped") is not None]
    failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    summary = f"{len(cases) - len(skipped) - len(failed)} passed, {len(failed)} failed, {len(skipped)} skipped"
    reasons = "".join(f"\n  skipped {c.get('classname')}::{c.get('name')}: {c.find('skipped').get('message')}"
                      for c in skipped)
    if not cases or len(skipped) == len(cases):
        return False, f"no gpu test ran ({summary}){reasons}"
    if failed:
        return False, summary + reasons
    if gpu_visible and skipped:
        return False, f"{summary}: a GPU is visible, so none may skip{reasons}"
    return True, summary + reasons


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-only", action="store_true", help="the CPU run alone (no GPU visible, or a dry run)")
    parser.add_argument("--gpu-tests-report", type=Path, metavar="JUNIT_XML",
                        help="only judge the gpu tests' pytest --junitxml report (with --cpu-only: skips allowed)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help="comma-separated, default all four")
    parser.add_argument("--runtime", default="torch", choices=["torch", "onnx"], help="of the network stages")
    parser.add_argument("--load-seconds", type=float, default=10.0, help="each c=16 measurement (0: none)")
    parser.add_argument("--work", type=Path, default=WORK)
    args = parser.parse_args()
    if args.gpu_tests_report is not None:
        passed, summary = gpu_tests_verdict(args.gpu_tests_report, gpu_visible=not args.cpu_only)
        print(f"gpu tests: {'passed' if passed else 'FAILED'}: {summary}")
        return 0 if passed else 1
    pipelines = [p for p in args.pipelines.split(",") if p]
    unknown = set(pipelines) - set(PIPELINES)
    if unknown:
        parser.error(f"unknown pipelines {sorted(unknown)}; choose from {PIPELINES}")
    args.work.mkdir(parents=True, exist_ok=True)
    cpu = serve_and_check("KIND_CPU", pipelines, args.runtime, args.load_seconds, args.work)
    gpu = None if args.cpu_only else serve_and_check("KIND_GPU", pipelines, args.runtime, args.load_seconds,
                                                       args.work)
    report, ok = table(cpu, gpu, pipelines)
    print(report)
    results = {"cpu": {"outputs": cpu.outputs, "failures": cpu.failures, "seconds": cpu.seconds},
               "gpu": None if gpu is None else {"outputs": gpu.outputs, "failures": gpu.failures,
                                                "devices": gpu.devices, "seconds": gpu.seconds},
               "table": report}
    (args.work / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
