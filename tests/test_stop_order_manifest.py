"""The Kustomize pod stops in order: the gateway drains (its preStop, then DRAIN_S) before Triton's preStop
ends, and Triton's stop fits in the grace period after that."""
from __future__ import annotations

import yaml

from launcher.paths import ROOT

TRITON_EXIT_TIMEOUT_S = 30  # Triton waits this long for its stubs on SIGTERM


def test_the_gateway_drains_before_triton_stops_within_the_grace_period():
    deployment = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}

    def pre_stop_s(name: str) -> int:
        command = containers[name]["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep"
        return int(command[1])

    drain_s = float(next(e["value"] for e in containers["gateway"]["env"] if e["name"] == "DRAIN_S"))
    assert pre_stop_s("gateway") + drain_s < pre_stop_s("triton")
    assert pre_stop_s("triton") + TRITON_EXIT_TIMEOUT_S < pod["terminationGracePeriodSeconds"]
