"""What the generator's acknowledgement of each BLS call (issue 48) costs: the server's CPU time (tritonserver
and every stub, psutil) per request, with and without it, in interleaved rounds on one server. The server
loads the codegen models twice: the shipped fronts, and copies named `*_noack` whose config says
`ack_generator_calls: false` (the calls as before the acknowledgement), both calling one generator.

    .venv/bin/python -m bench.generator_ack_cost [--rounds 6] [--requests 40]

Each round sends the same greedy requests one at a time: `codegen_stream` (one acknowledgement per fetch)
and `codegen_collect` (one per row, 4 rows), then their `_noack` twins, in alternating order."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from bench import stats
from launcher.processes import free_port
from launcher.triton_server import MODEL_REPOSITORY, TritonServer
from supervisor.codegen_probe import request_inputs, stream_call, tensor
from supervisor.processes import cpu_time
from supervisor.stubs import scan_stub_pids

MODELS = ["codegen_generator", "codegen_preprocess", "codegen_collect", "codegen_stream"]
TWINS = {"codegen_collect": "codegen_collect_noack", "codegen_stream": "codegen_stream_noack"}
PROMPT, MAX_TOKENS = "def fibonacci(n):", 32


def repository(folder: Path) -> Path:
    """The codegen models linked from model_repository/, plus the fronts' twins without the acknowledgement."""
    folder.mkdir(parents=True)
    for model in MODELS:
        (folder / model).symlink_to(MODEL_REPOSITORY / model, target_is_directory=True)
    for model, twin in TWINS.items():
        (folder / twin).mkdir()
        config = (MODEL_REPOSITORY / model / "config.pbtxt").read_text().replace(f'name: "{model}"', f'name: "{twin}"')
        assert f'name: "{twin}"' in config
        config = config.replace("parameters [", 'parameters [\n  { key: "ack_generator_calls" value: { string_value: '
                                '"false" } },', 1)
        (folder / twin / "config.pbtxt").write_text(config)
        (folder / twin / "1").symlink_to(MODEL_REPOSITORY / model / "1", target_is_directory=True)
    return folder


def cpu_seconds(server_pid: int) -> float:
    """utime + stime of tritonserver and its live stubs."""
    return sum(cpu_time(pid) or 0.0 for pid in [server_pid, *scan_stub_pids(server_pid)])


def collect_inputs(ids: np.ndarray) -> list:
    rows = np.repeat(ids[None, :], 4, axis=0).astype(np.int32)
    params = json.dumps({"max_tokens": MAX_TOKENS}).encode()
    return [tensor("input_ids", rows), tensor("input_lengths", np.full((4, 1), ids.shape[0], np.int32)),
            tensor("generation_params", np.array([[params]] * 4, np.object_))]


def one_round(client, server_pid: int, model: str, inputs, requests: int) -> float:
    """CPU seconds of the server per request over `requests` requests to `model`."""
    before = cpu_seconds(server_pid)
    for _ in range(requests):
        if "stream" in model:
            stream_call(client, model, inputs)
        else:
            client.infer(model, inputs)
    return (cpu_seconds(server_pid) - before) / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="generator_ack_cost_"))
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository(folder / "models"),
                          explicit_models=MODELS + list(TWINS.values()), log_file=folder / "tritonserver.log")
    server.start(timeout=300)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        stream_inputs = request_inputs(PROMPT, MAX_TOKENS)
        ids = client.infer("codegen_preprocess", [tensor("text_input", np.array([[PROMPT.encode()]], np.object_)),
                                                  tensor("request_output_len", np.array([[MAX_TOKENS]], np.int32))])
        unary_inputs = collect_inputs(ids.as_numpy("input_ids")[0])
        pid = server.process.pid
        for model in (*TWINS, *TWINS.values()):  # warm-up
            one_round(client, pid, model, stream_inputs if "stream" in model else unary_inputs, 3)
        ratios: dict[str, list[float]] = {model: [] for model in TWINS}
        costs: dict[str, list[float]] = {model: [] for model in (*TWINS, *TWINS.values())}
        for i in range(args.rounds):
            for model, twin in TWINS.items():
                inputs = stream_inputs if "stream" in model else unary_inputs
                order = (model, twin) if i % 2 == 0 else (twin, model)
                cost = {m: one_round(client, pid, m, inputs, args.requests) for m in order}
                costs[model].append(cost[model])
                costs[twin].append(cost[twin])
                ratios[model].append(cost[model] / cost[twin])
        client.close()
    finally:
        server.stop()
    print(f"server CPU per request (tritonserver + stubs), {args.rounds} interleaved rounds of {args.requests} "
          f"requests, {MAX_TOKENS} tokens, greedy:")
    for model, twin in TWINS.items():
        print(f"  {model}: with ack {stats.median(costs[model]) * 1e3:.2f} ms, without "
              f"{stats.median(costs[twin]) * 1e3:.2f} ms; ratio per round median "
              f"{stats.median(ratios[model]):.3f} (min {min(ratios[model]):.3f}, max {max(ratios[model]):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
