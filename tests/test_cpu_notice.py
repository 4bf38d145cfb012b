"""The launcher's one line on a machine without a usable GPU (issue 32): when it is printed and what it says.
The launcher printing it on a real CPU start-up is checked in test_launcher.py."""
from __future__ import annotations

import ctypes

import pytest

from launcher import cpu_notice as cn


class FakeCuda:
    def __init__(self, init_status=0, count_status=0, count=0):
        self.init_status, self.count_status, self.count = init_status, count_status, count

    def cuInit(self, flags):
        assert flags == 0
        return self.init_status

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.count
        return self.count_status


def with_driver(monkeypatch, driver):
    def cdll(name):
        assert name == "libcuda.so.1"
        if driver is None:
            raise OSError("libcuda.so.1: cannot open shared object file")
        return driver
    monkeypatch.setattr(ctypes, "CDLL", cdll)


@pytest.mark.parametrize("driver, devices, why", [
    (None, 0, "libcuda.so.1 not found"),
    (FakeCuda(init_status=35), 0, "cuInit failed with CUDA error 35"),  # driver older than the runtime
    (FakeCuda(init_status=100), 0, "cuInit failed with CUDA error 100"),  # no device
    (FakeCuda(count_status=3), 0, "cuDeviceGetCount failed"),
    (FakeCuda(count=0), 0, "sees no device"),
    (FakeCuda(count=2), 2, ""),
])
def test_cuda_devices_asks_the_driver(monkeypatch, driver, devices, why):
    with_driver(monkeypatch, driver)
    found, reason = cn.cuda_devices()
    assert found == devices
    assert why in reason if why else reason == ""


def test_no_gpu_gives_one_line_naming_cpu_and_every_expected_message():
    line = cn.cpu_notice(0, "no CUDA driver (libcuda.so.1 not found)")
    assert line is not None and "\n" not in line
    assert line.startswith("triton: no usable GPU (no CUDA driver (libcuda.so.1 not found)): serving on CPU.")
    # the messages a newcomer sees in Triton's log on CPU, as Triton words them
    for message in ("CudaDriverHelper has not been initialized", "unable to create stream for <ensemble>",
                    "CUDA driver version is insufficient", "DCGM unable to start", "Failed to initialize NVML"):
        assert message in line
    assert "docs/operations.md" in line
    assert "triton: ready" not in line, "callers wait for that text: the notice must not contain it"


def test_a_usable_gpu_prints_nothing():
    assert cn.cpu_notice(1, "") is None


def test_operations_page_explains_every_expected_message():
    from launcher.paths import ROOT

    page = (ROOT / "docs" / "operations.md").read_text()
    assert "## Start-up messages" in page
    for message in cn.EXPECTED_MESSAGES:
        assert message in page, f"docs/operations.md does not explain {message!r}"
