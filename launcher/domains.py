"""The Triton servers `make triton` runs: one per failure domain (issue 54), each with its own ports, models,
log, supervisor state file and keeper (launcher/stack.py).

Why: a Python-backend server shares its process, its shared-memory locks and its aborts among every model it
holds, and Triton 2.51 aborts (SIGABRT) after a stub's death on 1 kill in 5 to 10: with one server, a codegen
generator's crash took the embeddings down for 27 s. Which model belongs to which domain is the gateway's rule
(gateway/triton/domains.py: the `codegen*` models are `codegen`, every other is `encoders`), imported here so
that the two never disagree.

`TRITON_DOMAINS` (or `--domains`) says which servers this launcher runs:
- `encoders,codegen` (the default): two servers. The encoders keep HTTP_PORT/GRPC_PORT/METRICS_PORT (8000/8001/
  8002): they hold the gateway's runtime models (model control goes there) and every pipeline but codegen; the
  codegen server listens on CODEGEN_HTTP_PORT/CODEGEN_GRPC_PORT/CODEGEN_METRICS_PORT (8010/8011/8012).
- `one`: every model in one server on HTTP_PORT/GRPC_PORT/METRICS_PORT, as before issue 54 (half the idle
  memory of two; a crash of any model takes every pipeline down).
- `encoders` or `codegen` alone: that domain's server only (the Kubernetes Deployments, one per domain).

Both servers load from the one model_repository/ in explicit model-control mode, each only its domain's
models (`--load-model`); only the encoders' server also has the gateway's generated repository. Their
/dev/shm regions do not collide: Triton 2.51's Python backend names each region with a random UUID (python
backend PR #351, 24.05 on), and each server's stop reaps only the regions its own processes mapped."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gateway.triton.domains import CODEGEN, DOMAINS, ENCODERS, domain_of

ONE = "one"  # TRITON_DOMAINS=one: a single server with every model
DEFAULT = ",".join(DOMAINS)  # encoders,codegen
CODEGEN_PORTS = {"http": 8010, "grpc": 8011, "metrics": 8012}  # CODEGEN_HTTP_PORT, ..._GRPC_PORT, ..._METRICS_PORT
# The codegen server yields the CPU to the encoders' where both share a box (CODEGEN_NICE, 0 for none): its
# generations run for seconds and keep the cores busy, while the encoders answer in milliseconds and must
# restart a stub within the soak's 5 s. Measured with the 120 s soak on 2 cores (2026-12-02): the encoder
# stub's heal took 10.5 and 12.2 s (CI) at an equal share, 2.0 s at 5; at 10 codegen served a tenth of its
# requests. On Kubernetes each server has a node share of its own (deploy/k8s: CPU requests) and this is moot.
CODEGEN_NICE = 5


@dataclass
class Domain:
    name: str  # encoders, codegen, or one
    http_port: int
    grpc_port: int
    metrics_port: int
    models: list[str]
    nice: int = 0  # CPU priority below the box's default: the codegen server's (CODEGEN_NICE)

    @property
    def main(self) -> bool:
        """The server on the public ports, with the gateway's runtime models: encoders, or the one server."""
        return self.name != CODEGEN

    @property
    def label(self) -> str:
        """How the launcher's lines name its server: '' for the main one, ' (codegen)'."""
        return "" if self.main else f" ({self.name})"

    def file(self, main_file: Path) -> Path:
        """A per-server file beside the main one's: tritonserver.log -> tritonserver-codegen.log."""
        return main_file if self.main else main_file.with_name(f"{main_file.stem}-{self.name}{main_file.suffix}")


def parse(spec: str) -> list[str]:
    """TRITON_DOMAINS -> the servers to run: ['one'], or domains in DOMAINS order. Raises on an unknown name."""
    names = [n.strip() for n in (spec or DEFAULT).split(",") if n.strip()]
    if names == [ONE]:
        return names
    unknown = [n for n in names if n not in DOMAINS]
    if unknown or not names:
        raise ValueError(f"TRITON_DOMAINS={spec!r}: expected '{ONE}', or one or more of {', '.join(DOMAINS)} "
                         f"(comma-separated)")
    return [d for d in DOMAINS if d in names]


def codegen_ports(environ=os.environ) -> tuple[int, int, int]:
    return tuple(int(environ.get(f"CODEGEN_{kind.upper()}_PORT") or port) for kind, port in CODEGEN_PORTS.items())


def codegen_nice(environ=os.environ) -> int:
    value = environ.get("CODEGEN_NICE", "").strip()
    if not value:
        return CODEGEN_NICE
    if not value.isdigit() or int(value) > 19:
        raise ValueError(f"CODEGEN_NICE={value!r}: expected a nice value from 0 (an equal share) to 19")
    return int(value)


def plan(spec: str, models: list[str], main_ports: tuple[int, int, int],
         codegen: tuple[int, int, int], nice: int = CODEGEN_NICE) -> list[Domain]:
    """The servers to run, each with its share of `models`. A domain without any of the models is not run
    (LOAD_MODELS=text_embedding: the encoders' server alone), unless it was named alone. `nice`: the codegen
    server's, beside the encoders' (alone it has nothing to yield to)."""
    names = parse(spec)
    if names == [ONE]:
        return [Domain(ONE, *main_ports, list(models))]
    servers = []
    for name in names:
        own = [m for m in models if domain_of(m) == name]
        if own or len(names) == 1:
            servers.append(Domain(name, *(main_ports if name == ENCODERS else codegen), own))
    if len(servers) > 1:
        for server in servers:
            server.nice = nice if server.name == CODEGEN else 0
    return servers
