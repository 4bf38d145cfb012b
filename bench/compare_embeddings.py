"""The embedding service against the server behind it and against real peers, in one run, same client,
same sentences (bench/bench_text_embedding.corpus), one text per request, at concurrency 1, 8, 32, 64:

- direct gRPC to Triton's `text_embedding` (bench/perf.py's closed loop),
- the gateway's POST /v1/embeddings (bench/http_load.py's closed loop),
- optionally a second gateway from another source tree (`--baseline-tree`: A/B of gateway code),
- infinity-emb 0.0.78, torch engine and ONNX engine (`--engine optimum`), on the same all-MiniLM-L6-v2 folder,
- fastembed behind a small FastAPI app (bench/peers/fastembed_app.py) on the same folder's model.onnx.

Peers run from their own venvs under .peers/ (bench/peers/setup_peers.sh installs them; a peer whose venv
is missing is skipped and said so). Every contender is up for the whole run; each point is measured
`rounds` times, contenders in ABAB order per concurrency (reversed every other round), so the drift of
this shared box falls on all alike. Per point: req/s, p50/p95, and what the load generator itself used
(its CPU share of one core): a figure measured while the client used >= 90% of a core is marked
client-limited (the client's event loop, not the server, may be what stopped it).

    python -m bench.compare_embeddings [--window 10] [--rounds 2] [--levels 1 8 32 64] [--baseline-tree DIR]

Writes bench-results/<date>/embeddings-compare.{md,json} and plots; `make sweep` runs it too.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import stats
from bench.bench_gateway import MODEL_ID, CpuShare
from bench.bench_text_embedding import corpus
from bench.http_load import run_http_load
from bench.paired import interval, verdict
from bench.perf import run_load, text_inputs_factory
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer
from supervisor.processes import process_tree

ROOT = Path(__file__).resolve().parent.parent

LEVELS = (1, 8, 32, 64)
MODEL_DIR = ROOT / "model_repository" / "text_embedding_encoder" / "1"  # the all-MiniLM-L6-v2 folder Triton serves
PEERS = ROOT / ".peers"
PEER_NAME = "all-MiniLM-L6-v2"
CLIENT_LIMITED = 0.9  # client CPU share of one core at which its single event loop is the suspect
GRPC, GATEWAY = "direct gRPC", "gateway"
# nothing a peer starts may reach a hub: a closed local port, offline flags, caches inside .peers/
PEER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
            "HF_HOME": str(PEERS / "hf-home"), "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Contender:
    name: str
    url: str  # gRPC host:port, or the HTTP embeddings URL
    model: str  # the name its API takes
    process: subprocess.Popen | None = None  # peers: the server process (its tree's CPU is its serving cost)
    pids: list[int] = field(default_factory=list)

    @property
    def grpc(self) -> bool:
        return self.name == GRPC

    def serving_pids(self) -> list[int]:
        return self.pids or (process_tree(self.process.pid) if self.process else [])

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def post_json(url: str, body: dict, timeout: float = 60.0) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def wait_serving(contender: Contender, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            post_json(contender.url, {"model": contender.model, "input": ["warm up"]}, timeout=30)
            return
        except OSError:
            if contender.process and contender.process.poll() is not None:
                raise RuntimeError(f"{contender.name} exited with code {contender.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{contender.name} not serving after {timeout:.0f}s")
            time.sleep(1.0)


def start_peer(name: str, command: list[str], cwd: Path, url_path: str, model: str, log: Path) -> Contender:
    port = free_port()
    command = [c.replace("{port}", str(port)) for c in command]
    process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **PEER_ENV}, stdout=open(log, "ab"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    contender = Contender(name, f"http://127.0.0.1:{port}{url_path}", model, process)
    try:
        wait_serving(contender)
    except BaseException:
        contender.stop()
        raise
    return contender


def peer_commands() -> dict[str, tuple[list[str], Path, str]]:
    """name -> (command, working directory, URL path). Infinity's ONNX engine on a local folder: started
    *in* the folder with `--model-id .`. Its ONNX file search then yields the bare name `model.onnx`,
    which optimum's loader matches (given the folder's absolute path it passes the absolute file path as
    `file_name`, optimum compares it with the bare names it finds, and the start fails). Its pooling must be
    named: the optimum engine's "auto" is CLS pooling, not the folder's mean pooling."""
    infinity = str(PEERS / "infinity-venv" / "bin" / "infinity_emb")
    common = ["--served-model-name", PEER_NAME, "--device", "cpu", "--host", "127.0.0.1", "--port", "{port}"]
    return {
        "infinity (torch)": ([infinity, "v2", "--model-id", str(MODEL_DIR), "--engine", "torch", *common], ROOT,
                             "/embeddings"),
        "infinity (onnx)": ([infinity, "v2", "--model-id", ".", "--engine", "optimum", "--pooling-method", "mean",
                             *common], MODEL_DIR, "/embeddings"),
        "fastembed": ([str(PEERS / "fastembed-venv" / "bin" / "python"), str(ROOT / "bench" / "peers" / "fastembed_app.py"),
                       "--model-dir", str(MODEL_DIR), "--port", "{port}"], ROOT, "/v1/embeddings"),
    }


class TreeGateway(GatewayProcess):
    """A gateway run from another source tree (an A/B of gateway code against the same Triton)."""

    def __init__(self, tree: Path, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tree = tree
        self.env["PYTHONPATH"] = str(tree)

    def start(self, timeout: float = 300.0) -> "TreeGateway":
        out = open(self.log_file, "ab") if self.log_file else None
        self.process = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=self.tree, env=self.env,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready(timeout)
        return self


def measure(contender: Contender, texts: list[str], concurrency: int, window: float, warmup: float,
            server_pids: list[int]) -> dict:
    """One closed-loop point. CPU is counted per request (CPU ms / request): on a box this busy, wall-clock
    figures drift with the neighbours' load, CPU per request much less, so gateway A/Bs read it first."""
    client, own = CpuShare([os.getpid()]), CpuShare(contender.serving_pids())
    triton = CpuShare(server_pids) if contender.name == GRPC or contender.name.startswith(GATEWAY) else None
    if contender.grpc:
        result = run_load(contender.url, "text_embedding", text_inputs_factory(texts), concurrency, window, warmup)
    else:
        items = itertools.cycle(texts)
        result = run_http_load(contender.url, lambda: {"model": contender.model, "input": next(items)},
                               concurrency, window, warmup, label=contender.name)
    client_share, own_share = client.share(), own.share()
    triton_share = triton.share() if triton else 0.0
    per_request = 1e3 / max(result.throughput, 1e-9)  # share of a core x this = CPU ms per request
    return {"contender": contender.name, "concurrency": concurrency, "rps": result.throughput,
            "p50_ms": result.percentile(50) * 1e3, "p95_ms": result.percentile(95) * 1e3, "errors": result.errors,
            "first_error": result.first_error[:200], "client_cpu": client_share,
            "client_ms": client_share * per_request, "own_ms": own_share * per_request,
            "triton_ms": triton_share * per_request, "serving_cpu": own_share + triton_share,
            "client_limited": client_share >= CLIENT_LIMITED}


def fidelity(contenders: list[Contender], texts: list[str]) -> dict[str, float]:
    """Each HTTP contender's vectors for a few sentences against the gateway's: the lowest cosine."""
    def vectors(c: Contender) -> np.ndarray:
        body = post_json(c.url, {"model": c.model, "input": texts})
        return np.array([d["embedding"] for d in sorted(body["data"], key=lambda d: d.get("index", 0))], dtype=np.float32)

    gateway = next((c for c in contenders if c.name == GATEWAY), None)
    if gateway is None:
        return {}
    reference = vectors(gateway)
    out = {}
    for c in contenders:
        if not c.grpc and c is not gateway:
            got = vectors(c)
            cos = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
            out[c.name] = float(cos.min())
    return out


def means(points: list[dict]) -> dict[tuple[str, int], dict]:
    """(contender, concurrency) -> the mean of its rounds (and whether any round was client-limited)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for p in points:
        groups.setdefault((p["contender"], p["concurrency"]), []).append(p)
    return {key: {"rps": stats.mean(p["rps"] for p in ps), "p50_ms": stats.mean(p["p50_ms"] for p in ps),
                  "p95_ms": stats.mean(p["p95_ms"] for p in ps), "errors": sum(p["errors"] for p in ps),
                  "client_cpu": stats.mean(p["client_cpu"] for p in ps),
                  "serving_cpu": stats.mean(p["serving_cpu"] for p in ps),
                  **{k: stats.mean(p[k] for p in ps) for k in ("client_ms", "own_ms", "triton_ms")},
                  "client_limited": any(p["client_limited"] for p in ps), "rounds": [p["rps"] for p in ps],
                  "p50_rounds": [p["p50_ms"] for p in ps]}
            for key, ps in groups.items()}


def decided(deltas: list[float], goal: float, higher_is_better: bool) -> str:
    """The rounds' paired mean with its 95% interval, and what it decides (bench/paired.py)."""
    mean, half = interval(deltas)
    return f"rounds' mean {mean:.3f} ± {half:.3f}: {verdict(deltas, goal, higher_is_better)}"


def goals(m: dict, names: list[str], levels) -> list[str]:
    """The issue's goals, met or missed, from the means of this run; then what the paired rounds (the
    gateway against direct gRPC in the same round) decide, given their spread."""
    lines = []
    for c in (32, 64):
        if (GRPC, c) in m and (GATEWAY, c) in m:
            ratio = m[(GATEWAY, c)]["rps"] / max(m[(GRPC, c)]["rps"], 1e-9)
            ratios = [g / max(d, 1e-9) for g, d in zip(m[(GATEWAY, c)]["rounds"], m[(GRPC, c)]["rounds"])]
            lines.append(f"- gateway/direct gRPC throughput at c{c}: {ratio:.2f} (goal >= 0.90: "
                         f"{'met' if ratio >= 0.9 else 'missed'}; {decided(ratios, 0.9, True)})")
    if (GRPC, 1) in m and (GATEWAY, 1) in m:
        added = m[(GATEWAY, 1)]["p50_ms"] - m[(GRPC, 1)]["p50_ms"]
        deltas = [g - d for g, d in zip(m[(GATEWAY, 1)]["p50_rounds"], m[(GRPC, 1)]["p50_rounds"])]
        lines.append(f"- added p50 at c1: {added:+.2f} ms (goal <= 1.5 ms: {'met' if added <= 1.5 else 'missed'}; "
                     f"{decided(deltas, 1.5, False)})")
    peers = [n for n in names if n not in (GRPC, GATEWAY) and not n.startswith(GATEWAY)]
    for c in levels:
        if (GATEWAY, c) not in m:
            continue
        behind = [f"{n} ({m[(n, c)]['rps']:.1f}/s, p50 {m[(n, c)]['p50_ms']:.1f} ms)" for n in peers if (n, c) in m
                  and (m[(n, c)]["rps"] >= m[(GATEWAY, c)]["rps"] or m[(n, c)]["p50_ms"] <= m[(GATEWAY, c)]["p50_ms"])]
        lines.append(f"- c{c}: gateway {m[(GATEWAY, c)]['rps']:.1f}/s, p50 {m[(GATEWAY, c)]['p50_ms']:.1f} ms: "
                     + ("ahead of every peer in throughput and p50" if not behind else "NOT ahead of " + ", ".join(behind)))
    return lines


def plot(m: dict, names: list[str], levels, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the fourth panel, CPU per request, is the figure that drifts least on a shared box (see docs/performance-gateway.md)
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    for name in names:
        cs = [c for c in levels if (name, c) in m]
        style = {"linestyle": "--"} if name not in (GRPC, GATEWAY) and not name.startswith(GATEWAY) else {}
        for ax, key in zip(axes, ("rps", "p50_ms", "p95_ms")):
            ax.plot(cs, [m[(name, c)][key] for c in cs], marker="o", label=name, **style)
        axes[3].plot(cs, [m[(name, c)]["own_ms"] + m[(name, c)]["triton_ms"] for c in cs], marker="o", label=name, **style)
        limited = [c for c in cs if m[(name, c)]["client_limited"]]
        axes[0].plot(limited, [m[(name, c)]["rps"] for c in limited], "kx", markersize=10)
    for ax, label in zip(axes, ("requests/s", "p50 latency (ms)", "p95 latency (ms)", "server CPU ms per request")):
        ax.set(xlabel="concurrency", ylabel=label, xscale="log")
        ax.set_xticks(list(levels), [str(c) for c in levels])
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].set_title("throughput (x: client-limited)")
    axes[1].set_title("p50")
    axes[2].set_title("p95")
    axes[3].set_title("serving CPU per request (lower is cheaper)")
    axes[0].legend(fontsize=8)
    fig.suptitle("all-MiniLM-L6-v2, one text per request: direct gRPC, the gateway and peers (same run)")
    name = "embeddings_compare.png"
    fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [name]


def report(points: list[dict], names: list[str], levels, header: str, cosines: dict, skipped: dict,
           out_dir: Path) -> str:
    m = means(points)
    lines = ["## Gateway against direct gRPC and peers (text_embedding)", "", header, "",
             "| contender | c | req/s (per round) | p50 ms | p95 ms | errors | client CPU: share of a core, ms/req | "
             "serving CPU ms/req (own + Triton) | vs gateway req/s |", "|---|---|---|---|---|---|---|---|---|"]
    for c in levels:
        for name in names:
            if (name, c) not in m:
                continue
            r = m[(name, c)]
            mark = " (client-limited)" if r["client_limited"] else ""
            vs = r["rps"] / max(m.get((GATEWAY, c), {"rps": float("nan")})["rps"], 1e-9)
            lines.append(f"| {name} | {c} | {r['rps']:.1f}{mark} ({' / '.join(f'{x:.1f}' for x in r['rounds'])}) | "
                         f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['errors']} | {r['client_cpu']:.0%}, {r['client_ms']:.2f} | "
                         f"{r['own_ms'] + r['triton_ms']:.2f} ({r['own_ms']:.2f} + {r['triton_ms']:.2f}) | {vs:.2f} |")
    lines += ["", "Goals (issue 29), from the means above:", ""] + goals(m, names, levels) + [""]
    if cosines:
        lines += ["Same vectors? Lowest cosine to the gateway's over 4 sentences: "
                  + ", ".join(f"{k} {v:.6f}" for k, v in cosines.items()), ""]
    for name, why in skipped.items():
        lines.append(f"- {name}: not measured ({why})")
    lines += [""] + [f"![{p}]({p})" for p in plot(m, names, levels, out_dir)] + [""]
    return "\n".join(lines)


def start_receiver(out_dir: Path) -> tuple[subprocess.Popen, str]:
    """bench/otlp_receiver.py in a process of its own (its decoding is not the load generator's CPU)."""
    url_file = out_dir / "otlp_receiver.url"
    url_file.unlink(missing_ok=True)
    process = subprocess.Popen([sys.executable, "-m", "bench.otlp_receiver", "--port-file", str(url_file)],
                               cwd=ROOT)
    deadline = time.monotonic() + 30
    while not url_file.exists() or not url_file.read_text():
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the OTLP receiver did not start")
        time.sleep(0.1)
    return process, url_file.read_text()


def compare(out_dir: Path, window: float, warmup: float, rounds: int, levels=LEVELS, peers: bool = True,
            baseline_tree: Path | None = None, only: list[str] | None = None, traced: bool = False) -> str:
    """Runs the whole comparison (own tritonserver, gateways, peers); returns the report's markdown section.
    `traced`: also a gateway tracing every request (OTEL_TRACES_SAMPLER=always_on) to an OTLP receiver, with
    Triton tracing what it sends (the cost a user pays with tracing on; the other gateways send no context)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = corpus()
    contenders: list[Contender] = []
    skipped: dict[str, str] = {}
    receiver, traces_url = start_receiver(out_dir) if traced else (None, None)
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          explicit_models=["text_embedding"], log_file=out_dir / "compare_tritonserver.log",
                          traces_url=traces_url)
    gateways = []
    try:
        server.start(timeout=600)
        server_pids = process_tree(server.process.pid)
        contenders.append(Contender(GRPC, server.grpc_url, "text_embedding"))
        data = out_dir / "compare_gateway_data"
        gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=data, env={"PRELOAD_MODELS": ""},
                                 log_file=out_dir / "compare_gateway.log").start(timeout=180)
        gateways.append(gateway)
        contenders.append(Contender(GATEWAY, f"{gateway.url}/v1/embeddings", MODEL_ID, pids=[gateway.process.pid]))
        if baseline_tree:
            base = TreeGateway(baseline_tree, server.grpc_url, port=free_port(), data_dir=out_dir / "compare_base_data",
                               env={"PRELOAD_MODELS": ""}, log_file=out_dir / "compare_gateway_base.log").start(timeout=180)
            gateways.append(base)
            contenders.append(Contender(f"{GATEWAY} (baseline)", f"{base.url}/v1/embeddings", MODEL_ID,
                                        pids=[base.process.pid]))
        if traced:
            env = {"PRELOAD_MODELS": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url,
                   "OTEL_TRACES_SAMPLER": "always_on"}
            on = GatewayProcess(server.grpc_url, port=free_port(), data_dir=out_dir / "compare_traced_data", env=env,
                                log_file=out_dir / "compare_gateway_traced.log").start(timeout=180)
            gateways.append(on)
            contenders.append(Contender(f"{GATEWAY} (traced 100%)", f"{on.url}/v1/embeddings", MODEL_ID,
                                        pids=[on.process.pid]))
        for name, (command, cwd, path) in (peer_commands().items() if peers else ()):
            if only and name not in only:
                continue
            if not Path(command[0]).exists():
                skipped[name] = f"{command[0]} missing: run bash bench/peers/setup_peers.sh"
                continue
            print(f"compare: starting {name}", flush=True)
            try:
                contenders.append(start_peer(name, command, cwd, path, PEER_NAME, out_dir / f"compare_{name.split()[0]}"
                                             f"{'_onnx' if 'onnx' in name else ''}.log"))
            except (RuntimeError, TimeoutError) as exc:
                skipped[name] = str(exc)
        for c in contenders:  # warm every contender before any measurement
            if not c.grpc:
                wait_serving(c)
        cosines = fidelity(contenders, texts[:4])
        print(f"compare: cosine to the gateway's vectors: {cosines}", flush=True)
        points = []
        for concurrency in levels:
            for r in range(rounds):
                for c in (contenders if r % 2 == 0 else contenders[::-1]):
                    p = measure(c, texts, concurrency, window, warmup, server_pids)
                    points.append(p)
                    print(f"  {c.name:20s} c{concurrency:<3d} round {r + 1}: {p['rps']:7.1f}/s p50 {p['p50_ms']:7.1f} ms "
                          f"p95 {p['p95_ms']:7.1f} ms err {p['errors']} client CPU {p['client_cpu']:.0%}"
                          f"{' CLIENT-LIMITED' if p['client_limited'] else ''} CPU ms/req own {p['own_ms']:.2f} "
                          f"Triton {p['triton_ms']:.2f}",
                          flush=True)
    finally:
        for c in contenders:
            c.stop()
        for g in gateways:
            g.stop()
        server.stop()
        if receiver is not None:
            receiver.kill()
            receiver.wait()
    header = (f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} cores shared with other work: window "
              f"{window:g} s per point (warm-up {warmup:g} s), {rounds} rounds per point in ABAB order (contenders "
              "reversed every other round), means shown with each round's req/s. One text per request, the same "
              "512 sentences (6-40 words) for every contender, the same closed-loop client (aiohttp for HTTP, "
              "tritonclient aio for gRPC). Serving CPU per request: own = the gateway process (gateway rows) or the "
              "peer's process tree; Triton = tritonserver and its stubs (direct gRPC and gateway rows).")
    names = [c.name for c in contenders]
    (out_dir / "embeddings-compare.json").write_text(json.dumps({"points": points, "cosines": cosines,
                                                                  "skipped": skipped}, indent=1))
    return report(points, names, levels, header, cosines, skipped, out_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--peers", nargs="*", help="only these peers (names as in the report)")
    parser.add_argument("--baseline-tree", type=Path, help="also a gateway run from this source tree (A/B)")
    parser.add_argument("--traced", action="store_true", help="also a gateway tracing every request (OTLP)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / datetime.date.today().isoformat())
    args = parser.parse_args()
    section = compare(args.out, args.window, args.warmup, args.rounds, tuple(args.levels), not args.no_peers,
                      args.baseline_tree, args.peers, args.traced)
    path = args.out / "embeddings-compare.md"
    path.write_text(section + "\n")
    print(section)
    print(f"compare: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
