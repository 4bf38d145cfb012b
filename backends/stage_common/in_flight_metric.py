"""The requests a BLS front has in flight, as a gauge labelled with its stub's pid.

After a heal, the old version's stubs live on (Triton 2.51 may never unload them) and the supervisor retires
them. A front waiting on its callee uses no CPU, so "idle CPU" does not mean "done": the supervisor reads
this gauge from /metrics and retires an old front's stub only when it has no request in flight (issue 35).
The pid label tells the old stub's series from the new one's (both have the model's name)."""
from __future__ import annotations

import os

import triton_python_backend_utils as pb_utils

FAMILY = "bls_front_requests_in_flight"
# a MetricFamily that is garbage-collected takes its metrics off /metrics: the families live as long as the stub
KEPT_FAMILIES: list = []


def in_flight_gauge(model_name: str):
    """A Metric whose set(n) publishes this stub's count of requests in flight."""
    family = pb_utils.MetricFamily(FAMILY, "requests a BLS front has in flight, per stub process",
                                   pb_utils.MetricFamily.GAUGE)
    KEPT_FAMILIES.append(family)
    return family.Metric({"model": model_name, "stub_pid": str(os.getpid())})
