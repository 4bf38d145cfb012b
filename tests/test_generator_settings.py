"""The generator follows the CPU it runs on (issue 53): `precision` auto is bf16 where the CPU computes bf16 natively
(AVX512_BF16 or AMX), f32 elsewhere; `openvino_threads` 0 is the cores the instance may use; both ship as the
default, and the start-up log and /health say what they resolved to (backends/gptj_generator/published_settings.py).
f32 stays the exact mode the fidelity tests pin (tests/codegen_engines.py pin_exact). The CPUs differ between
machines (an AMD EPYC with AVX512_BF16, another with AVX2 only, a Xeon with AMX): the choice is tested on fake
capability sets, the served default against this CPU's own."""
from __future__ import annotations

import asyncio
import logging
import os
from types import SimpleNamespace

import pytest

from gateway.supervisor_state import published_settings
from gptj_generator import openvino_engine
from gptj_generator.openvino_engine import cpu_capabilities, pipeline_properties, resolve_threads, usable_precision
from gptj_generator.published_settings import publish, settings_path
from model_configs import load_python_model, parse_config

XEON_AMX = ["FP32", "FP16", "INT8", "BF16", "BIN", "EXPORT_IMPORT"]  # the CPU plugin's OPTIMIZATION_CAPABILITIES
EPYC_AVX512_BF16 = ["BF16", "WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]
EPYC_AVX2 = ["WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]


@pytest.mark.parametrize("capabilities, auto", [(XEON_AMX, "bf16"), (EPYC_AVX512_BF16, "bf16"), (EPYC_AVX2, "f32")])
def test_auto_is_bf16_where_the_cpu_computes_it_and_f32_elsewhere(capabilities, auto):
    assert usable_precision("auto", capabilities) == auto
    assert usable_precision("bf16", capabilities) == auto  # asked for where the CPU lacks it: f32, with a warning
    assert usable_precision("f32", capabilities) == "f32"  # the exact mode, on every CPU


def test_f32_asks_nothing_of_the_cpu_and_unknown_precisions_are_refused(monkeypatch):
    def no_query():
        raise AssertionError("f32 must not depend on the CPU's capabilities")

    monkeypatch.setattr(openvino_engine, "cpu_capabilities", no_query)
    assert usable_precision("f32") == "f32"
    for bad in ("f16", "int8", "AUTO"):
        with pytest.raises(ValueError, match="precision"):
            usable_precision(bad, EPYC_AVX2)
    with pytest.raises(ValueError, match="precision"):
        pipeline_properties(1, "auto")  # the engine resolves auto before it builds the pipeline's properties


@pytest.mark.parametrize("setting", ["auto", "bf16"])
def test_an_engine_on_a_cpu_without_native_bf16_runs_f32(monkeypatch, setting):
    """(A CPU with it: the served test below, on this machine's own capabilities.)"""
    from test_codegen_engine import make_engine

    monkeypatch.setattr(openvino_engine, "cpu_capabilities", lambda: EPYC_AVX2)
    engine = make_engine("openvino", precision=setting)
    try:
        assert engine.settings()["precision"] == "f32"
    finally:
        engine.close()


def test_threads_0_follow_the_cores_this_process_may_use():
    assert resolve_threads(0) == len(os.sched_getaffinity(0))
    assert resolve_threads(3) == 3
    with pytest.raises(ValueError):
        resolve_threads(-1)


def test_the_shipped_config_says_auto_and_threads_0():
    """Both follow the CPU: the precision it computes natively, and every core the instance may use."""
    parameters = {key: value.string_value for key, value in parse_config("codegen_generator").parameters.items()}
    assert parameters["precision"] == "auto" and parameters["openvino_threads"] == "0"


def test_the_served_generator_runs_this_cpus_precision_and_cores_and_says_so(tmp_path, monkeypatch, caplog):
    """The shipped config in process, as Triton loads it: the engine resolved auto and 0 (bf16 on a CPU with native
    bf16, f32 on another; every core it may use), its start-up log line says so, and so does the file /health reads."""
    state_file = tmp_path / "run" / "supervisor-codegen.json"
    monkeypatch.setenv("SUPERVISOR_STATE_FILE", str(state_file))
    want = {"precision": "bf16" if "BF16" in cpu_capabilities() else "f32", "threads": len(os.sched_getaffinity(0))}
    with caplog.at_level(logging.INFO, logger="stage"):
        model = load_python_model("codegen_generator")
    try:
        settings = model.engine.settings()
        assert {key: settings[key] for key in want} == want
    finally:
        model.finalize()
    line = [r.getMessage() for r in caplog.records if "codegen OpenVINO engine:" in r.getMessage()]
    assert line and f"{want['precision']} precision, {want['threads']} inference thread(s)" in line[-1], line
    published = published_settings(state_file)
    assert list(published) == ["codegen_generator"]
    assert published["codegen_generator"]["engine"] == "openvino"
    assert {key: published["codegen_generator"][key] for key in want} == want


def test_publishing_needs_a_state_file_and_a_writable_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("SUPERVISOR_STATE_FILE", raising=False)
    assert publish("codegen_generator", {"precision": "f32"}) is None  # a bare tritonserver: nothing written
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert publish("codegen_generator", {"precision": "f32"}, blocked / "state.json") is None  # logged, not raised
    state_file = tmp_path / "supervisor.json"
    path = publish("codegen_generator", {"precision": "f32", "threads": 2}, state_file)
    assert path == settings_path(state_file, "codegen_generator") and path.parent == tmp_path
    assert published_settings(state_file) == {"codegen_generator": {"precision": "f32", "threads": 2}}
    # another server's state file in the same folder sees none of it
    assert published_settings(tmp_path / "supervisor-codegen.json") == {}


class _Live:
    async def live(self) -> bool:
        return True


def test_health_says_what_the_generator_runs_with(tmp_path):
    from gateway.routers.health import health

    state_file = tmp_path / "supervisor.json"
    settings = SimpleNamespace(supervisor_state_file=state_file, codegen_supervisor_state_file=None)

    def call():
        return asyncio.run(health(engine=_Live(), settings=settings, registry=None, admission=None, watch=None,
                                  quotas=None))

    assert "engines" not in call()  # nothing published (a bare Triton, or no generator loaded)
    publish("codegen_generator", {"engine": "openvino", "precision": "bf16", "threads": 2}, state_file)
    body = call()
    assert body["status"] == "ok"
    assert body["engines"] == {"codegen_generator": {"engine": "openvino", "precision": "bf16", "threads": 2}}
