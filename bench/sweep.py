"""`make sweep`: each pipeline under seed 004's configuration matrix (dynamic batching on/off x instance
count 1/2 x max batch size x torch/ONNX Runtime where the stage has both), at concurrency 1, 8, 32,
next to the FastAPI peer and the in-process limit measured in the same run, and the shipped configuration
itself. Writes bench-results/<date>/report.md (tables: req/s, p50/p95, served/limit, served/peer, RSS) and
PNG plots; --docs rewrites the generated sweep section of docs/performance.md from the same figures.

This box's speed drifts by up to 2x over minutes, and the matrix measures one configuration after another,
so a slow patch hits one configuration's points together. After the matrix, the shipped configuration and
every configuration that beat it somewhere are measured again head to head, in rounds ordered ABBA
(shipped first, then last) so a steady drift falls on both alike; the in-process limit is measured again
at the end.

    python -m bench.sweep --pipelines text_embedding --window 5
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format

from bench.http_load import run_http_load
from bench.model_repo import parse_config
from bench.perf import run_load, text_inputs_factory
from bench.suite import memory_mib
from launcher.processes import free_port
from launcher.triton_server import TritonServer

ROOT = Path(__file__).resolve().parent.parent

CONCURRENCY = (1, 8, 32)


@dataclass(frozen=True)
class Variant:
    dynamic_batching: bool
    instances: int
    max_batch: int
    runtime: str  # "onnx" | "torch" | "" (the stage has one runtime)

    @property
    def name(self) -> str:
        return (f"{'db' if self.dynamic_batching else 'nodb'}-i{self.instances}-b{self.max_batch}"
                + (f"-{self.runtime}" if self.runtime else ""))


@dataclass
class Pipeline:
    ensemble: str
    stage: str  # the model whose instances and runtime vary
    input_name: str
    items: callable
    peer_path: str
    peer_body: callable
    runtimes: tuple[str, ...] = ("",)
    limit: callable = None  # () -> items/s of the best in-process path


def _text_embedding() -> Pipeline:
    from bench.bench_text_embedding import corpus, limit

    return Pipeline("text_embedding", "text_embedding_encoder", "text", corpus, "/embed",
                    lambda item: {"texts": [item]}, ("onnx", "torch"), lambda: limit(2.0, (1, 32, 64)))


def _ner() -> Pipeline:
    from bench.bench_ner import corpus, limit

    return Pipeline("ner", "ner_tagger", "text", corpus, "/ner", lambda item: {"texts": [item]}, ("onnx", "torch"),
                    lambda: limit(6.0))


def _food() -> Pipeline:
    import base64

    from bench.bench_food_captioning import limit, photos

    # decoding and resizing the JPEGs, in Python, is what the networks wait for (2026-11-24: two preprocess
    # instances 1.55x one at c32; see its config): its instances vary, the runtime of both networks
    return Pipeline("food_captioning", "food_captioning_preprocess", "image", photos, "/caption",
                    lambda item: {"images": [base64.b64encode(item).decode()]}, ("onnx", "torch"),
                    lambda: limit(3.0))


PIPELINES = {"text_embedding": _text_embedding, "ner": _ner, "food_captioning": _food}


def config_dict(model: str) -> dict:
    """model_repository/<model>/config.pbtxt as the JSON Triton's load API takes."""
    return json_format.MessageToDict(parse_config(model), preserving_proto_field_name=True)


def config_json(model: str, variant: Variant, vary_instances: bool) -> str:
    config = config_dict(model)
    config["max_batch_size"] = variant.max_batch
    if config.get("platform") == "ensemble":
        return json.dumps(config)
    if variant.dynamic_batching:
        config["dynamic_batching"] = {**config.get("dynamic_batching", {}), "max_queue_delay_microseconds": 0}
    else:
        config.pop("dynamic_batching", None)
    if vary_instances:
        config["instance_group"] = [{**config["instance_group"][0], "count": variant.instances}]
    if variant.runtime and "runtime" in config.get("parameters", {}):  # every network of the pipeline alike
        config["parameters"]["runtime"] = {"string_value": variant.runtime}
    return json.dumps(config)


SHIPPED = "shipped"  # the configs in model_repository/, measured as they are


def load_variant(client, pipeline: Pipeline, variant: Variant | None) -> None:
    """A configuration of the matrix, or (None) the shipped one. The shipped config is passed too: a load
    without one after an override keeps the override (Triton 2.51)."""
    steps = [s.model_name for s in parse_config(pipeline.ensemble).ensemble_scheduling.step]
    for step in steps:
        client.load_model(step, config=json.dumps(config_dict(step)) if variant is None else config_json(step, variant, step == pipeline.stage))
    client.load_model(pipeline.ensemble, config=json.dumps(config_dict(pipeline.ensemble)) if variant is None
                      else config_json(pipeline.ensemble, variant, False))


def unload(client, pipeline: Pipeline) -> None:
    client.unload_model(pipeline.ensemble, unload_dependents=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(client.is_model_ready(s.model_name) for s in
                                              parse_config(pipeline.ensemble).ensemble_scheduling.step):
        time.sleep(0.3)


def run_peer(pipeline_name: str, pipeline: Pipeline, items: list, window: float, warmup: float) -> dict[int, object]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.peer_fastapi", "--port", str(port),
                                "--pipeline", pipeline_name], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        import httpx

        deadline = time.monotonic() + 180
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the FastAPI peer did not start")
                time.sleep(0.5)
        cycle = itertools.cycle(items)
        for _ in range(3):  # first calls load kernels and caches: not part of any measurement
            httpx.post(f"http://127.0.0.1:{port}{pipeline.peer_path}", json=pipeline.peer_body(next(cycle)), timeout=300)
        results = {}
        for c in CONCURRENCY:
            results[c] = run_http_load(f"http://127.0.0.1:{port}{pipeline.peer_path}", lambda: pipeline.peer_body(next(cycle)),
                                       c, window, warmup, label="peer")
            print(f"  peer c{c}: {results[c].throughput:.1f}/s p50 {results[c].percentile(50) * 1e3:.1f} ms", flush=True)
        return results
    finally:
        process.terminate()
        process.wait(30)


def plot(rows: list[dict], peer: dict, pipeline: str, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["variant"] for r in rows})
    files = []
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        mine = sorted((r for r in rows if r["variant"] == name), key=lambda r: r["concurrency"])
        ax.plot([r["concurrency"] for r in mine], [r["rps"] for r in mine], marker="o", label=name)
    ax.plot(list(peer), [p.throughput for p in peer.values()], marker="s", linestyle="--", color="black", label="FastAPI peer")
    ax.set(xlabel="concurrency", ylabel="requests/s", title=f"{pipeline}: throughput vs concurrency", xscale="log")
    ax.legend(fontsize=7)
    files.append(f"{pipeline}_throughput.png")
    fig.savefig(out_dir / files[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        mine = sorted((r for r in rows if r["variant"] == name), key=lambda r: r["concurrency"])
        ax.plot([r["rps"] for r in mine], [r["p95_ms"] for r in mine], marker="o", label=name)
    ax.plot([p.throughput for p in peer.values()], [p.percentile(95) * 1e3 for p in peer.values()], marker="s",
            linestyle="--", color="black", label="FastAPI peer")
    ax.set(xlabel="requests/s", ylabel="p95 latency (ms)", title=f"{pipeline}: latency vs throughput", yscale="log")
    ax.legend(fontsize=7)
    files.append(f"{pipeline}_latency.png")
    fig.savefig(out_dir / files[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return files


def contenders(rows: list[dict], top: int = 2) -> dict[str, list[int]]:
    """Configuration -> the concurrencies at which the matrix measured it among the `top` best and above
    the shipped one (the matrix's winner, and the runner-up a slow patch may have cost the win)."""
    shipped = {r["concurrency"]: r["rps"] for r in rows if r["variant"] == SHIPPED}
    out: dict[str, list[int]] = {}
    for c in sorted(shipped):
        ahead = sorted((r for r in rows if r["concurrency"] == c and r["variant"] != SHIPPED and r["rps"] > shipped[c]),
                       key=lambda r: -r["rps"])
        for r in ahead[:top]:
            out.setdefault(r["variant"], []).append(c)
    return out


def head_to_head_plan(contending: dict[str, list[int]], rounds: int) -> list[tuple[str, list[int]]]:
    """(configuration, concurrencies) in the order to measure them: shipped at every contested concurrency,
    then the contenders; every other round reversed (ABBA), so a steady drift of the box falls on each
    configuration alike."""
    if not contending:
        return []
    contested = sorted({c for cs in contending.values() for c in cs})
    one_round = [(SHIPPED, contested)] + sorted(contending.items())
    return [step for r in range(rounds) for step in (one_round if r % 2 == 0 else one_round[::-1])]


def head_to_head_means(runs: list[dict]) -> dict[tuple[str, int], float]:
    """(configuration, concurrency) -> mean req/s over its head-to-head rounds."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        groups.setdefault((r["variant"], r["concurrency"]), []).append(r["rps"])
    return {key: sum(v) / len(v) for key, v in groups.items()}


def sweep_pipeline(name: str, args, out_dir: Path) -> tuple[str, list[dict]]:
    import tritonclient.grpc as grpcclient

    pipeline = PIPELINES[name]()
    items = pipeline.items()
    print(f"=== {name}: in-process limit", flush=True)
    limit = pipeline.limit()
    print(f"=== {name}: FastAPI peer", flush=True)
    peer = run_peer(name, pipeline, items, args.window, args.warmup)
    variants = [Variant(db, inst, mb, rt) for db, inst, mb, rt in
                itertools.product((True, False), (1, 2), (8, 64), pipeline.runtimes)]
    if args.quick:
        variants = variants[:2]
    rows = []
    log = out_dir / f"{name}_tritonserver.log"
    with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), explicit_models=[],
                      log_file=log) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        by_name = {v.name: v for v in variants}

        def measure(label: str, levels, into: list[dict]) -> None:
            load_variant(client, pipeline, None if label == SHIPPED else by_name[label])
            for c in levels:
                result = run_load(server.grpc_url, pipeline.ensemble, text_inputs_factory(items, pipeline.input_name),
                                  c, args.window, args.warmup)
                rss, _, _ = memory_mib(server.process.pid)
                into.append({"variant": label, "concurrency": c, "rps": result.throughput,
                             "p50_ms": result.percentile(50) * 1e3, "p95_ms": result.percentile(95) * 1e3,
                             "errors": result.errors, "rss_mib": rss})
                print(f"  {label} c{c}: {result.throughput:.1f}/s p50 {into[-1]['p50_ms']:.1f} ms "
                      f"p95 {into[-1]['p95_ms']:.1f} ms", flush=True)
            unload(client, pipeline)

        for label in [SHIPPED] + list(by_name):
            measure(label, CONCURRENCY, rows)
        plan = head_to_head_plan(contenders(rows), args.rounds)
        print(f"=== {name}: head to head, {args.rounds} rounds: {[label for label, _ in plan]}", flush=True)
        h2h: list[dict] = []
        for label, levels in plan:
            measure(label, levels, h2h)
    print(f"=== {name}: in-process limit again", flush=True)
    limit_end = pipeline.limit()
    plots = plot(rows, peer, name, out_dir)
    best = {c: max((r for r in rows if r["concurrency"] == c), key=lambda r: r["rps"]) for c in CONCURRENCY}
    lines = [f"## {name}", "", f"In-process limit (best path): {limit:.1f} items/s before the matrix, "
             f"{limit_end:.1f} after the head-to-head rounds. FastAPI peer: "
             + ", ".join(f"c{c} {p.throughput:.1f}/s p50 {p.percentile(50) * 1e3:.1f} ms" for c, p in peer.items()), "",
             "| configuration | concurrency | req/s | p50 ms | p95 ms | served/limit | served/peer | RSS MiB | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['concurrency']} | {r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
                     f"{r['rps'] / limit:.2f} | {r['rps'] / max(peer[r['concurrency']].throughput, 1e-9):.2f} | "
                     f"{r['rss_mib']:.0f} | {r['errors']} |")
    lines += ["", "Best configuration per concurrency: " + ", ".join(
        f"c{c}: {b['variant']} ({b['rps']:.1f}/s)" for c, b in best.items()), ""]
    means = head_to_head_means(h2h)
    lines += head_to_head_lines(h2h, means, args.rounds)
    lines += [f"![{p}]({p})" for p in plots] + [""]
    shipped = {r["concurrency"]: r for r in rows if r["variant"] == SHIPPED}
    summary = [{"pipeline": name, "concurrency": c, "shipped_rps": shipped[c]["rps"], "shipped_p50_ms": shipped[c]["p50_ms"],
                "best": best[c]["variant"], "best_rps": best[c]["rps"], "peer_rps": peer[c].throughput,
                "peer_p50_ms": peer[c].percentile(50) * 1e3, "limit": limit, "limit_end": limit_end,
                "h2h_shipped_rps": means.get((SHIPPED, c)), "h2h_best_rps": means.get((best[c]["variant"], c))}
               for c in CONCURRENCY]
    return "\n".join(lines), summary


def head_to_head_lines(runs: list[dict], means: dict[tuple[str, int], float], rounds: int) -> list[str]:
    """The report's head-to-head table: each round's req/s and the mean, per configuration and concurrency."""
    if not runs:
        return ["Head to head: no configuration beat the shipped one in the matrix.", ""]
    lines = [f"Head to head ({rounds} rounds, ABBA order):", "", "| configuration | concurrency | req/s per round | mean |",
             "|---|---|---|---|"]
    for (label, c), mean in sorted(means.items(), key=lambda kv: (kv[0][1], kv[0][0] != SHIPPED, kv[0][0])):
        per_round = " / ".join(f"{r['rps']:.1f}" for r in runs if (r["variant"], r["concurrency"]) == (label, c))
        lines.append(f"| {label} | {c} | {per_round} | {mean:.1f} |")
    return lines + [""]


def summary_table(summary: list[dict]) -> list[str]:
    """The README's table: the shipped configuration against the sweep's best one, the peer and the limit."""
    lines = ["| pipeline | concurrency | shipped req/s, p50 | best configuration (req/s) | shipped/best | shipped/best "
             "head to head | FastAPI peer req/s, p50 | shipped/peer | p50 shipped/peer | served/limit (limit before / after) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        h2h = (f"{r['h2h_shipped_rps']:.1f} / {r['h2h_best_rps']:.1f} = {r['h2h_shipped_rps'] / max(r['h2h_best_rps'], 1e-9):.2f}"
               if r.get("h2h_best_rps") and r["best"] != SHIPPED else "-")
        lines.append(f"| {r['pipeline']} | {r['concurrency']} | {r['shipped_rps']:.1f}, {r['shipped_p50_ms']:.1f} ms | "
                     f"{r['best']} ({r['best_rps']:.1f}) | {r['shipped_rps'] / max(r['best_rps'], 1e-9):.2f} | {h2h} | "
                     f"{r['peer_rps']:.1f}, {r['peer_p50_ms']:.1f} ms | {r['shipped_rps'] / max(r['peer_rps'], 1e-9):.2f}x | "
                     f"{r['shipped_p50_ms'] / max(r['peer_p50_ms'], 1e-9):.2f} | {r['shipped_rps'] / max(r['limit'], 1e-9):.2f} / "
                     f"{r['shipped_rps'] / max(r['limit_end'], 1e-9):.2f} |")
    return lines


README_BEGIN, README_END = "<!-- sweep:begin (bench/sweep.py --docs writes this) -->", "<!-- sweep:end -->"
README_INTRO = ("Each line names the run its pipelines' rows come from (a run of some pipelines, `--pipelines`, "
                "replaces their rows and keeps the others'); full tables and plots are in that run's report (not "
                "committed: `bench-results/` is ignored; rerun `make sweep`).")
_NOTE = re.compile(r"^- ((?:`\w+`(?:, )?)+): (.*)$")  # "- `ner`, `food_captioning`: <the run's header>"


def _earlier_parts(section: str, swept: set[str]) -> tuple[list[str], list[str]]:
    """The run notes and table rows of the README's section for the pipelines this run did not sweep."""
    notes, rows = [], []
    for line in section.splitlines():
        note = _NOTE.match(line)
        if note:
            names = [n for n in re.findall(r"`(\w+)`", note.group(1)) if n not in swept]
            if names:
                notes.append(f"- {', '.join(f'`{n}`' for n in names)}: {note.group(2)}")
        elif line.startswith("| ") and not line.startswith("| pipeline |") and line.split("|")[1].strip() not in swept:
            rows.append(line)
    return notes, rows


PERFORMANCE_PAGE = ROOT / "docs" / "performance.md"  # the docs page that holds the generated section


def write_readme(readme: Path, report: Path, summary: list[dict], header: str) -> None:
    """Rewrite the README's generated sweep section (between the markers) with this run's rows, keeping the
    rows of pipelines it did not sweep."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{readme} has no {README_BEGIN} ... {README_END} section")
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    swept = list(dict.fromkeys(r["pipeline"] for r in summary))
    notes, rows = _earlier_parts(text[start:end], set(swept))
    notes.append(f"- {', '.join(f'`{n}`' for n in swept)}: {header} Report: `{report.relative_to(ROOT)}`.")
    table = summary_table(summary)
    order = {name: i for i, name in enumerate(PIPELINES)}
    rows = sorted(rows + table[2:], key=lambda row: order.get(row.split("|")[1].strip(), len(order)))  # stable
    body = [README_BEGIN, "", README_INTRO, ""] + notes + [""] + table[:2] + rows + ["", README_END]
    readme.write_text(text[:start] + "\n".join(body) + text[end:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", nargs="*", default=list(PIPELINES), choices=list(PIPELINES))
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=2, help="head-to-head rounds of shipped vs the configurations that beat it")
    parser.add_argument("--quick", action="store_true", help="two configurations only (smoke run)")
    parser.add_argument("--docs", "--readme", dest="docs", action="store_true",
                        help="rewrite the generated sweep section of docs/performance.md (--readme: its old name)")
    # issue 29: the gateway against direct gRPC and the peers (bench/compare_embeddings.py), same report
    parser.add_argument("--no-compare", action="store_true", help="skip the gateway/gRPC/peers comparison")
    parser.add_argument("--compare-window", type=float, default=10.0, help="seconds per comparison point")
    args = parser.parse_args()
    out_dir = ROOT / "bench-results" / datetime.date.today().isoformat()
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [sweep_pipeline(name, args, out_dir) for name in args.pipelines]
    summary = [row for _, rows in results for row in rows]
    # a run of some pipelines keeps the same day's full report
    report = out_dir / ("report.md" if set(args.pipelines) == set(PIPELINES) else f"report-{'-'.join(args.pipelines) or 'compare'}.md")
    header = (f"`make sweep`, {datetime.datetime.now():%Y-%m-%d %H:%M}: window {args.window:g} s per point (warm-up "
              f"{args.warmup:g} s), one run on this machine. Configurations: `{SHIPPED}` (model_repository/ as it is), "
              "then dynamic batching (db: on, queue delay 0; nodb: off) x instances of the main stage ("
              + ", ".join(f"`{PIPELINES[n]().stage}`" for n in args.pipelines) + ") x max batch size x runtime "
              f"(of every network); then shipped against every configuration that beat it, head to head in {args.rounds} "
              "rounds (ABBA order).")
    compare = ""
    if not args.no_compare:
        from bench.compare_embeddings import compare as compare_embeddings

        print("=== gateway vs direct gRPC vs peers (bench/compare_embeddings.py)", flush=True)
        compare = compare_embeddings(out_dir, args.compare_window, 2.0, args.rounds) + "\n"
    report.write_text(f"# make sweep\n\n{header}\n\n" + "\n".join(summary_table(summary)) + "\n\n"
                      + "\n".join(section for section, _ in results) + "\n" + compare)
    print(f"sweep: wrote {report}")
    if args.docs and summary:
        write_readme(PERFORMANCE_PAGE, report, summary, header)
        print(f"sweep: {PERFORMANCE_PAGE.relative_to(ROOT)}'s sweep section rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
