"""bench/compare_embeddings.py's report logic: round means, client-limited marks, and the issue's goals
read met or missed from the figures (no server: points are made up here)."""
from __future__ import annotations

from bench import compare_embeddings as ce


def point(name: str, c: int, rps: float, p50: float, client_cpu: float = 0.1) -> dict:
    return {"contender": name, "concurrency": c, "rps": rps, "p50_ms": p50, "p95_ms": 2 * p50, "errors": 0,
            "client_cpu": client_cpu, "serving_cpu": 1.0, "client_ms": 0.2, "own_ms": 0.5, "triton_ms": 4.0,
            "client_limited": client_cpu >= ce.CLIENT_LIMITED}


def test_means_average_rounds_and_keep_a_client_limited_round():
    m = ce.means([point(ce.GATEWAY, 32, 300, 100), point(ce.GATEWAY, 32, 400, 80, client_cpu=0.95)])
    r = m[(ce.GATEWAY, 32)]
    assert r["rps"] == 350 and r["p50_ms"] == 90 and r["rounds"] == [300, 400] and r["client_limited"]


def test_goals_met_and_missed():
    points = [point(ce.GRPC, 1, 120, 8.0), point(ce.GATEWAY, 1, 110, 9.0), point("infinity (torch)", 1, 40, 22.0),
              point(ce.GRPC, 32, 450, 70), point(ce.GATEWAY, 32, 400, 80), point("infinity (torch)", 32, 410, 90),
              point(ce.GRPC, 64, 450, 140), point(ce.GATEWAY, 64, 430, 150)]
    names = [ce.GRPC, ce.GATEWAY, "infinity (torch)"]
    lines = ce.goals(ce.means(points), names, (1, 32, 64))
    # one round: its spread is unknown, so nothing is decided
    assert "- gateway/direct gRPC throughput at c32: 0.89 (goal >= 0.90: missed; rounds' mean 0.889 ± inf: not decided)" in lines
    assert "- gateway/direct gRPC throughput at c64: 0.96 (goal >= 0.90: met; rounds' mean 0.956 ± inf: not decided)" in lines
    assert "- added p50 at c1: +1.00 ms (goal <= 1.5 ms: met; rounds' mean 1.000 ± inf: not decided)" in lines
    assert any(line.startswith("- c1: ") and "ahead of every peer" in line for line in lines)
    # a peer ahead in throughput at c32 is named, even with a worse p50
    assert any(line.startswith("- c32: ") and "NOT ahead of infinity (torch) (410.0/s" in line for line in lines)


def test_paired_rounds_decide_a_goal_only_outside_their_spread():
    def run(grpc_rps, gateway_rps):
        return [point(name, 32, rps, 100) for pair in zip(grpc_rps, gateway_rps)
                for name, rps in zip((ce.GRPC, ce.GATEWAY), pair)]
    steady = ce.goals(ce.means(run([300, 320, 310], [282, 301, 291])), [ce.GRPC, ce.GATEWAY], (32,))
    assert any("at c32: 0.94" in line and line.endswith(": met)") for line in steady)
    swinging = ce.goals(ce.means(run([300, 320, 310], [240, 320, 300])), [ce.GRPC, ce.GATEWAY], (32,))
    assert any("at c32: 0.92" in line and line.endswith(": not decided)") for line in swinging)


def test_report_marks_client_limited_figures_and_draws_the_plot(tmp_path):
    points = [point(ce.GRPC, 1, 120, 8.0), point(ce.GATEWAY, 1, 110, 9.0, client_cpu=0.97)]
    text = ce.report(points, [ce.GRPC, ce.GATEWAY], (1,), "header", {}, {"fastembed": "not installed"}, tmp_path)
    assert "| gateway | 1 | 110.0 (client-limited) (110.0) |" in text
    assert "- fastembed: not measured (not installed)" in text
    assert (tmp_path / "embeddings_compare.png").stat().st_size > 0
