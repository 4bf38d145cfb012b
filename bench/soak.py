"""Soak: mixed load on every pipeline at concurrency 32, a bad request in every 50, a stub kill every
5 minutes (scaled down for short runs) and whole-server kills (kill -9 tritonserver: 2 in a run of 10
minutes or more, else 1), supervised by supervisor/ and kept running by launcher/server_keeper.py; checks
the goals and exits non-zero when one fails.

    make soak SOAK_S=1800        (.venv/bin/python -m bench.soak --seconds 1800)

The servers are `make triton`'s: one per failure domain (launcher/domains.py; `--domains one`, or
TRITON_DOMAINS=one, for a single server), each kept and supervised on its own, each domain's pipelines
loaded by clients of its own. The server kills go to `--server-kill` in turn (encoders, then codegen). A
request fails "around a kill" only when the kill or death was its own server's: a codegen crash that fails an
embeddings request is an unexpected error.

Goals: 0 unexpected errors (a bad request refused with INVALID_ARGUMENT is expected; failures of
requests in flight at a kill or sent before its heal are counted apart and reported; around a server
kill each must be UNAVAILABLE), every stub kill healed within 5 s (the generator's: healed, or the
server it aborted restarted), every server kill serving again within 30 s, RSS of server + stubs at the end < 5% above the after-warm-up figure, and no
/dev/shm region or process left after stop."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import psutil

from bench.generator_heal import GENERATOR, serving_again
from bench.workload import Load
from gateway.triton.domains import domain_of
from launcher.domains import ONE, codegen_nice, plan
from launcher.keeper import RestartPolicy
from launcher.processes import free_port
from launcher.server_keeper import SupervisedServer
from launcher.triton_server import TritonServer, shipped_models
from supervisor.canaries import default_canaries
from supervisor.faults import kill_stub
from supervisor.monitor import Supervisor
from supervisor.processes import alive, process_group, process_tree, shm_regions_mapped
from supervisor.state import STATE_FILE_VARIABLE

ROOT = Path(__file__).resolve().parent.parent

PIPELINES = ["text_embedding", "ner", "food_captioning", "codegen", "codegen_stream"]
# networks (ONNX Runtime) and numpy/tokenizer stages in turn, the decoupled generator among them (its kill
# may abort tritonserver: Triton 2.51's message-queue mutex; the keeper then restarts it); a 30-minute soak
# (5 stub kills) kills the three networks and two of the others; a 120 s soak kills only the first
KILL_TARGETS = ["text_embedding_encoder", "codegen_generator", "ner_decoder", "food_captioning_captioner",
                "text_embedding_tokenizer", "ner_tagger", "food_captioning_preprocess", "codegen_postprocess"]
SERVER = "tritonserver"  # a whole-server kill in the plan
SERVER_HEAL_LIMIT_S = 30.0
HEAL_LIMIT_S = 5.0
ABORT_S = 5.0  # how long before its exit an aborting tritonserver may already refuse connections


def rss_mib(pid: int) -> float:
    total = 0
    for p in process_tree(pid):
        try:
            total += psutil.Process(p).memory_info().rss
        except psutil.Error:
            pass
    return total / 2 ** 20


def alive_after(pids: set[int], grace_s: float) -> list[int]:
    """Processes still running (zombies aside) after a grace period: SIGKILLed stubs take a moment to go."""
    deadline = time.monotonic() + grace_s
    while (left := sorted(p for p in pids if alive(p))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_times(seconds: float, warmup: float, every: float) -> list[float]:
    """Offsets of the kills: every `every` s (at most half the measured time, so a 120 s run has one)."""
    interval = min(every, (seconds - warmup) / 2)
    times, t = [], warmup + interval
    while t < seconds - 10:
        times.append(t)
        t += interval
    return times


def kill_plan(seconds: float, warmup: float, every: float, stubs: list[str], server_kills: int) -> list[tuple[float, str]]:
    """(offset, target): the stub kills of `kill_times` with the server kills spread among them."""
    total = len(kill_times(seconds, warmup, every)) + server_kills
    interval = (seconds - 10 - warmup) / total
    # a short run (one stub kill, one server kill): the server first, the stub kill in the time left
    server_at = {round((j + 1) * total / (server_kills + 1)) - 1 for j in range(server_kills)}
    plan, n = [], 0
    for i in range(total):
        if i in server_at:
            plan.append((warmup + interval * (i + 0.5), SERVER))
        else:
            plan.append((warmup + interval * (i + 0.5), stubs[n % len(stubs)]))
            n += 1
    return plan


class Servers:
    """The soak's tritonservers, one per domain (`home` says which serves a model), with their loads."""

    def __init__(self, spec: str, log_dir: Path, state_file: Path):
        self.domains = plan(spec, shipped_models(), (free_port(), free_port(), free_port()),
                            (free_port(), free_port(), free_port()), codegen_nice())
        self.one = self.domains[0].name == ONE
        self.kept: dict[str, SupervisedServer] = {}
        self.loads: dict[str, Load] = {}
        for domain in self.domains:
            own_state = domain.file(state_file)  # as `make triton`: the codegen fronts read it too
            server = TritonServer(http_port=domain.http_port, grpc_port=domain.grpc_port,
                                  metrics_port=domain.metrics_port, explicit_models=domain.models,
                                  log_file=domain.file(log_dir / "tritonserver.log"),
                                  env={STATE_FILE_VARIABLE: str(own_state)}, nice=domain.nice)
            # as `make triton` runs it: the hung-stub canary too (a false alarm under this load would fail
            # requests), a new supervisor per server life, the server restarted when it dies
            self.kept[domain.name] = SupervisedServer(
                server, lambda s, own_state=own_state: Supervisor(
                    lambda: s.process and s.process.pid, s.grpc_url, own_state, canaries=default_canaries(s.grpc_url),
                    canary_period_s=10.0, metrics_url=s.metrics_url),
                RestartPolicy(max_restarts=5, window_s=120))
            self.kept[domain.name].keeper.name = f"tritonserver{domain.label}"  # its lines say whose server died

    def home(self, model: str) -> str:
        return ONE if self.one else domain_of(model)

    def server(self, domain: str) -> TritonServer:
        return self.kept[domain].server

    def start(self, concurrency: int, bad_every: int) -> None:
        for name, kept in self.kept.items():
            print(f"soak: starting Triton ({name}) with {len(kept.server.explicit_models)} models "
                  f"(log {kept.server.log_file})", flush=True)
            kept.start(timeout=600)
        for name, kept in self.kept.items():  # the clients shared by pipeline: each domain loads its own server
            own = [p for p in PIPELINES if self.home(p) == name]
            if own:
                self.loads[name] = Load(kept.server.grpc_url, own, bad_every=bad_every,
                                        concurrency=max(1, round(concurrency * len(own) / len(PIPELINES))))
        for load in self.loads.values():
            load.start()

    @property
    def outcomes(self) -> list:
        return [o for load in self.loads.values() for o in load.outcomes]

    def unexpected(self) -> list:
        return [o for load in self.loads.values() for o in load.unexpected()]

    def rss_mib(self) -> float:
        return sum(rss_mib(kept.server.process.pid) for kept in self.kept.values() if kept.server.process)

    def trees(self) -> set[int]:
        return {p for kept in self.kept.values() if kept.server.process for p in process_tree(kept.server.process.pid)}

    def stop(self) -> None:
        for load in self.loads.values():
            load.stop()
        for kept in self.kept.values():
            kept.stop()


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # the summary reaches a log file even if the exit hangs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_S", 120)))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--bad-every", type=int, default=50)
    parser.add_argument("--kill-every", type=float, default=300.0)
    parser.add_argument("--kill", type=lambda v: v.split(","), default=KILL_TARGETS, metavar="STUB,...",
                        help=f"the stubs to kill, in turn (default: {','.join(KILL_TARGETS)})")
    parser.add_argument("--server-kills", type=int, default=None,
                        help="kill -9 tritonserver this many times (default: 2 in a run of 600 s or more, else 1)")
    parser.add_argument("--domains", default=os.environ.get("TRITON_DOMAINS") or "encoders,codegen",
                        help="the servers, as TRITON_DOMAINS: one per failure domain (default), or 'one'")
    parser.add_argument("--server-kill", type=lambda v: v.split(","), default=["encoders", "codegen"],
                        metavar="DOMAIN,...", help="whose server each server kill kills, in turn (default: "
                                                   "encoders,codegen; with --domains one: the one server)")
    parser.add_argument("--warmup", type=float, default=None, help="default: 15%% of the run, 15-120 s")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "bench-results" / "soak")
    args = parser.parse_args()
    if unknown := sorted(set(args.kill) - set(shipped_models())):
        parser.error(f"--kill: not served models: {unknown}")
    warmup = args.warmup if args.warmup is not None else min(120.0, max(15.0, args.seconds * 0.15))
    args.log_dir.mkdir(parents=True, exist_ok=True)

    server_kills = args.server_kills if args.server_kills is not None else (2 if args.seconds >= 600 else 1)
    servers = Servers(args.domains, args.log_dir, args.log_dir / "supervisor.json")
    if unknown := sorted(set(args.server_kill) - set(servers.kept)) if not servers.one else []:
        parser.error(f"--server-kill: no such server: {unknown} (servers: {', '.join(servers.kept)})")
    # (killed at, stub or SERVER, serving again at, the domain whose server it hit)
    kills: list[tuple[float, str, float | None, str]] = []
    serving_after: list[float | None] = []  # each generator kill's kill -> serving (fresh requests answered)
    served_again: dict[float, float] = {}  # a generator kill's time -> when fresh requests were answered again
    tree: set[int] = set()
    regions: set[str] = set()  # these servers' /dev/shm regions (other servers may run on the box)
    dead_processes: set[int] = set()  # the processes of killed servers: reaped by the keeper
    try:
        servers.start(args.concurrency, args.bad_every)
        started = time.time()
        time.sleep(warmup)
        rss_warm = servers.rss_mib()
        regions |= shm_regions_mapped(list(servers.trees()))
        print(f"soak: warm after {warmup:.0f}s: servers+stubs RSS {rss_warm:.0f} MiB, "
              f"{len(servers.outcomes)} requests so far", flush=True)
        server_kill_count = 0
        for offset, target in kill_plan(args.seconds, warmup, args.kill_every, args.kill, server_kills):
            time.sleep(max(0.0, started + offset - time.time()))
            if target == SERVER:
                domain = ONE if servers.one else args.server_kill[server_kill_count % len(args.server_kill)]
                server_kill_count += 1
            else:
                domain = servers.home(target)
            kept = servers.kept[domain]
            pid = kept.server.process.pid
            restarts_before = len(kept.restarts)
            killed_at = time.time()
            if target == SERVER:
                group = process_group(pid)
                regions |= shm_regions_mapped(group)
                dead_processes |= set(group)
                os.kill(pid, signal.SIGKILL)
            else:
                kill_stub(pid, target)
            healed, how = None, ""
            while time.time() - killed_at < 180 and healed is None:
                restarted = next((r.ready_at for r in kept.restarts[restarts_before:] if r.ready_at), None)
                stub_healed = next((t for t, e, m in kept.events if e == "healed" and m == target and t > killed_at),
                                   None)
                healed, how = (stub_healed, "healed") if stub_healed else (restarted, "server restarted")
                time.sleep(0.05)
            if target != SERVER and how == "server restarted":
                dead_processes |= set(process_group(pid))
            if target == GENERATOR:  # issue 48's figure: until fresh codegen and codegen_stream answer 3 times in a row
                served_at, _ = serving_again(kept.server.grpc_url, 120.0)
                serving_after.append(None if served_at is None else served_at - killed_at)
                print(f"soak: t={killed_at - started:.0f}s kill -9 {target}: kill -> serving "
                      + (f"{served_at - killed_at:.2f}s" if served_at else "NOT within 120 s"), flush=True)
                if served_at:  # the codegen requests failed until then belong to this kill's window
                    served_again[killed_at] = served_at
            kills.append((killed_at, target, healed, domain))
            time.sleep(1.0)
            regions |= shm_regions_mapped(list(servers.trees()))
            print(f"soak: t={killed_at - started:.0f}s kill -9 {target} ({domain}): "
                  + (f"{how} in {healed - killed_at:.2f}s" if healed else "NOT serving again in 180 s"), flush=True)
        time.sleep(max(0.0, started + args.seconds - time.time()))
        rss_end = servers.rss_mib()
        tree = servers.trees()
        regions |= shm_regions_mapped(list(tree))
        restarts = [(name, r) for name, kept in servers.kept.items() for r in kept.restarts]
    finally:
        servers.stop()
    events = sorted(e for kept in servers.kept.values() for e in kept.events)

    def heal_window(o, kill) -> bool:
        k, target, h, domain = kill
        if domain != servers.home(o.pipeline):  # another server's kill or death is no excuse
            return False
        # after a server kill the clients' gRPC channels reconnect with a backoff of a few seconds
        slack = 20.0 if target == SERVER or any(r.died_at >= k and (h is None or r.died_at <= h)
                                                for name, r in restarts if name == domain) else 1.0
        return o.end >= k and o.start <= max(h or k + 180, served_again.get(k, 0.0)) + slack

    def around_a_death(o) -> bool:
        # a restart's died_at is when the keeper saw the exit (it polls): a request answered UNAVAILABLE at the
        # instant of the soak's own kill ends before it, so the kill's time counts as a death too; a server that
        # aborts by itself refuses connections while it writes its backtrace, seconds before it exits (seen: 2 s)
        return any(heal_window(o, (r.died_at - ABORT_S, SERVER, r.ready_at, name)) for name, r in restarts) or \
            any(heal_window(o, k) for k in kills if k[1] == SERVER)

    failed = servers.unexpected()
    # a bad request sent while the server was down cannot be refused by it: UNAVAILABLE is its answer too
    at_kill = [o for o in failed if (not o.bad or around_a_death(o)) and any(heal_window(o, kill) for kill in kills)]
    # around a server's death (a kill, or the generator's abort) a client may only see UNAVAILABLE
    # (a failure in a stub kill's own window may be that stub's: Stub process ... is not healthy)
    stub_windows = [k for k in kills if k[1] != SERVER]
    at_server = [o for o in at_kill if around_a_death(o) and not any(heal_window(o, k) for k in stub_windows)]
    not_unavailable = [o for o in at_server if "UNAVAILABLE" not in (o.error or "")]
    counted = {id(o) for o in at_kill}  # by identity: equal outcomes are still separate requests
    unexpected = [o for o in failed if id(o) not in counted] + not_unavailable
    bad = [o for o in servers.outcomes if o.bad]
    growth = (rss_end - rss_warm) / rss_warm * 100
    leaked_shm = sorted(r for r in regions if Path(r).exists())
    leaked_procs = alive_after(tree, 10.0)
    heal_times = [h - k for k, t, h, _ in kills if h and t != SERVER]
    server_heals = [h - k for k, t, h, _ in kills if h and t == SERVER]
    leaked_procs += alive_after(dead_processes, 10.0)
    per_pipeline = {name: sum(1 for o in servers.outcomes if o.pipeline == name) for name in PIPELINES}
    print(f"\nsoak: {args.seconds:.0f}s at concurrency {args.concurrency}, servers {', '.join(servers.kept)}: "
          f"{len(servers.outcomes)} requests "
          f"({', '.join(f'{k} {v}' for k, v in per_pipeline.items())})")
    print(f"  bad requests: {len(bad)}, refused with INVALID_ARGUMENT: {sum(o.expected for o in bad)}")
    stub_kills = [k for k in kills if k[1] != SERVER]
    print(f"  stub kills: {len(stub_kills)}, healed: {len(heal_times)}, heal time max "
          f"{max(heal_times, default=0):.2f}s; server kills: {len(kills) - len(stub_kills)}, serving again after "
          f"{', '.join(f'{t:.1f}s ({d})' for (_, tg, h, d), t in zip([k for k in kills if k[1] == SERVER and k[2]], server_heals)) or '-'}"
          f"; server restarts: {len(restarts)} "
          f"({', '.join(f'{n}: {r.cause}, start-up {r.start_s:.1f}s' if r.start_s else f'{n}: {r.cause}' for n, r in restarts)})")
    if serving_after:
        print("  generator kills, kill -> serving (3 fresh codegen + codegen_stream answers in a row): "
              + ", ".join("NOT within 120 s" if t is None else f"{t:.2f}s" for t in serving_after))
    print(f"  failed around the kills (in flight or before serving again): {len(at_kill)}, of which around a "
          f"server's death {len(at_server)} (UNAVAILABLE: {len(at_server) - len(not_unavailable)})")
    injected = {(stub, k) for k, stub, _, _ in kills}
    print(f"  supervisor events: {len(events)}; deaths not injected by the soak: "
          f"{sorted({m for t, e, m in events if e == 'death detected' and not any(m == s and abs(t - k) < 5 for s, k in injected)})}")
    hangs = sorted({m for _, e, m in events if e == "hang detected"})
    print(f"  canary failures: {sum(1 for _, e, _ in events if e == 'canary failed')}; "
          f"hangs healed: {hangs}")
    if not_unavailable:
        kinds = Counter(f"{o.pipeline}: {(o.error or 'answered')[:90]}" for o in not_unavailable)
        print("  around a server's death, not UNAVAILABLE: " + "; ".join(f"{n} x {k}" for k, n in kinds.most_common(5)))
    print(f"  unexpected errors: {len(unexpected)}")
    for o in unexpected[:10]:
        print(f"    {o.pipeline} bad={o.bad} t={o.start - started:.1f}s {o.error[:200] if o.error else 'answered'}")
    print(f"  RSS servers+stubs: {rss_warm:.0f} MiB after warm-up, {rss_end:.0f} MiB at the end ({growth:+.1f}%)")
    print(f"  after stop: leaked /dev/shm regions {len(leaked_shm)} of {len(regions)} seen, "
          f"processes left {len(leaked_procs)} of {len(tree)}")
    goals = {
        "0 unexpected errors": not unexpected,
        "every bad request refused with INVALID_ARGUMENT (but around a server's death)":
        all(o.expected or (around_a_death(o) and "UNAVAILABLE" in (o.error or "")) for o in bad),
        "at least one stub kill": bool(stub_kills),
        f"every stub kill healed within {HEAL_LIMIT_S:.0f}s (or its server restarted)": len(heal_times) == len(stub_kills)
        and all(t < HEAL_LIMIT_S or t2 == "server restarted" for t, t2 in
                ((h - k, "server restarted" if any(k <= r.died_at <= h for n, r in restarts if n == d) else "")
                 for k, tg, h, d in stub_kills if h)),
        f"every server kill serving again within {SERVER_HEAL_LIMIT_S:.0f}s": len(server_heals) == server_kills
        and all(t <= SERVER_HEAL_LIMIT_S for t in server_heals),
        "RSS growth < 5%": growth < 5.0,
        "no leaked /dev/shm region or process": not leaked_shm and not leaked_procs,
    }
    for goal, ok in goals.items():
        print(f"  {'PASS' if ok else 'FAIL'} {goal}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
