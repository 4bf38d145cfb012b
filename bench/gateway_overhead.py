"""The gateway's own cost, A/B: gateways in front of bench/fake_triton.py (answers at once), so nothing but
the gateway works. Per point: req/s (its ceiling on this box, with the client beside it), p50, and the
gateway process's CPU ms per request, the figure that decides how much of the 2 cores it takes from Triton
under real load. Contenders alternate ABAB per concurrency.

    python -m bench.gateway_overhead [--baseline-tree DIR ...] [--env NAME=K=V ...] [--levels 1 32] [--rounds 3]

--baseline-tree: a gateway from another source tree (e.g. `git archive <rev>` unpacked, with model_repository
linked); --env: a gateway of this tree with extra environment (e.g. to compare settings); --delay-ms: the
fake answers after that long, so the gateway idles between requests at c1 as it does in front of a model.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import stats
from bench.bench_gateway import MODEL_ID
from bench.bench_text_embedding import corpus
from bench.compare_embeddings import Contender, TreeGateway, measure
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, nargs="*", default=[])
    parser.add_argument("--env", nargs="*", default=[], help="NAME=KEY=VALUE[,KEY=VALUE]: this tree with that env")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "bench.fake_triton", "--port", str(port),
                             "--delay-ms", str(args.delay_ms)], cwd=ROOT)
    gateways, contenders = [], []
    texts = corpus()
    try:
        time.sleep(1.0)
        with tempfile.TemporaryDirectory() as data:
            specs = [("gateway", None, {})] + [(f"tree {t.name}", t, {}) for t in args.baseline_tree]
            for item in args.env:
                name, _, pairs = item.partition("=")
                specs.append((name, None, dict(p.split("=", 1) for p in pairs.split(","))))
            for i, (name, tree, env) in enumerate(specs):
                kwargs = dict(port=free_port(), data_dir=Path(data) / str(i), env={"PRELOAD_MODELS": "", **env},
                              log_file=Path(data) / f"gateway{i}.log")
                g = (TreeGateway(tree, f"127.0.0.1:{port}", **kwargs) if tree else
                     GatewayProcess(f"127.0.0.1:{port}", **kwargs)).start(timeout=180)
                gateways.append(g)
                contenders.append(Contender(name, f"{g.url}/v1/embeddings", MODEL_ID, pids=[g.process.pid]))
            points = []
            for c in args.levels:
                for r in range(args.rounds):
                    for contender in (contenders if r % 2 == 0 else contenders[::-1]):
                        p = measure(contender, texts, c, args.window, args.warmup, [])
                        points.append(p)
                        print(f"  {contender.name:24s} c{c:<3d} round {r + 1}: {p['rps']:7.1f}/s p50 {p['p50_ms']:6.2f} ms "
                              f"gateway CPU {p['own_ms']:.3f} ms/req, client {p['client_ms']:.3f} ms/req "
                              f"({p['client_cpu']:.0%}{' CLIENT-LIMITED' if p['client_limited'] else ''})", flush=True)
    finally:
        for g in gateways:
            g.stop()
        fake.terminate()
        fake.wait(10)
    print("\n| gateway | c | req/s (mean) | p50 ms (mean) | gateway CPU ms/req (mean; per round) | client share of a core |")
    print("|---|---|---|---|---|---|")
    for c in args.levels:
        for contender in contenders:
            ps = [p for p in points if p["contender"] == contender.name and p["concurrency"] == c]
            print(f"| {contender.name} | {c} | {stats.mean(p['rps'] for p in ps):.1f} | "
                  f"{stats.mean(p['p50_ms'] for p in ps):.2f} | {stats.mean(p['own_ms'] for p in ps):.3f}; "
                  + " / ".join(f"{p['own_ms']:.3f}" for p in ps)
                  + f" | {stats.mean(p['client_cpu'] for p in ps):.0%}"
                  + (" (client-limited)" if any(p["client_limited"] for p in ps) else "") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
