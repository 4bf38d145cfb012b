"""One Triton server per failure domain (issue 54), without a server: which model is whose, what the launcher
runs for each TRITON_DOMAINS, the gateway's engine choosing each call's server, and the server watch closing
the gateway only when no server is left (a dead codegen server leaves the embeddings open)."""
from __future__ import annotations

import asyncio

import pytest

from gateway.middleware.admission import Admission
from gateway.registry import ModelRegistry
from gateway.settings import Settings
from gateway.triton.domains import CODEGEN, ENCODERS, DomainEngines, domain_of, engines_for
from gateway.triton.server_watch import ServerWatch
from launcher.domains import CODEGEN_NICE, ONE, Domain, codegen_nice, parse, plan
from launcher.triton_server import shipped_models
from test_server_watch_unit import FakeServer


def test_each_shipped_model_has_its_domain():
    codegen = {"codegen", "codegen_stream", "codegen_collect", "codegen_generator", "codegen_preprocess",
               "codegen_postprocess"}
    assert {m for m in shipped_models() if domain_of(m) == CODEGEN} == codegen & set(shipped_models())
    for model in ("text_embedding", "ner_tagger", "food_captioning", "emb_all_minilm_l6_v2_0123456789"):
        assert domain_of(model) == ENCODERS
    assert domain_of("codegenx") == ENCODERS  # the prefix is the name and an underscore


def test_the_launcher_plans_one_server_per_domain_or_one():
    models = ["text_embedding", "ner", "codegen", "codegen_generator"]
    encoders, codegen = plan("encoders,codegen", models, (8000, 8001, 8002), (8010, 8011, 8012))
    assert (encoders.name, encoders.grpc_port, encoders.models) == (ENCODERS, 8001, ["text_embedding", "ner"])
    assert (codegen.name, codegen.grpc_port, codegen.models) == (CODEGEN, 8011, ["codegen", "codegen_generator"])
    assert encoders.main and not codegen.main
    assert codegen.file(encoders.file(__import__("pathlib").Path("run/tritonserver.log"))).name == \
        "tritonserver-codegen.log"
    (one,) = plan(ONE, models, (8000, 8001, 8002), (8010, 8011, 8012))
    assert one == Domain(ONE, 8000, 8001, 8002, models) and one.main
    # LOAD_MODELS with one domain's models only: that server alone; a domain named alone runs anyway
    assert [d.name for d in plan("", ["text_embedding"], (1, 2, 3), (4, 5, 6))] == [ENCODERS]
    assert [(d.name, d.grpc_port) for d in plan("codegen", models, (1, 2, 3), (4, 5, 6))] == [(CODEGEN, 5)]
    assert parse("codegen,encoders") == [ENCODERS, CODEGEN]
    # the codegen server yields the CPU (CODEGEN_NICE) only beside the encoders' server
    assert (encoders.nice, codegen.nice) == (0, CODEGEN_NICE) and CODEGEN_NICE > 0
    assert [d.nice for d in plan("encoders,codegen", models, (1, 2, 3), (4, 5, 6), nice=0)] == [0, 0]
    assert [d.nice for d in plan("codegen", models, (1, 2, 3), (4, 5, 6))] == [0]
    assert codegen_nice({}) == CODEGEN_NICE and codegen_nice({"CODEGEN_NICE": "0"}) == 0
    for bad in ("-5", "20", "low"):
        with pytest.raises(ValueError, match="CODEGEN_NICE"):
            codegen_nice({"CODEGEN_NICE": bad})
    with pytest.raises(ValueError, match="TRITON_DOMAINS"):
        parse("encoders,llm")


class Recorder(FakeServer):
    def __init__(self, name):
        super().__init__()
        self.name, self.calls = name, []

    async def infer(self, model, inputs, outputs, timeout_s=None):
        self.calls.append(model)
        return {"server": self.name}


def test_the_gateway_routes_each_model_to_its_server():
    async def main():
        one = engines_for(Settings(triton_grpc_url="127.0.0.1:1"))
        assert one.engines[ENCODERS] is one.engines[CODEGEN] and list(one.servers()) == [ENCODERS]
        await one.close()
        engines = DomainEngines({ENCODERS: "127.0.0.1:1", CODEGEN: "127.0.0.1:2"})
        assert list(engines.servers()) == [ENCODERS, CODEGEN]
        await engines.close()
        engines.engines = {ENCODERS: Recorder(ENCODERS), CODEGEN: Recorder(CODEGEN)}
        engines.main = engines.engines[ENCODERS]
        assert (await engines.infer("codegen", {}, ()))["server"] == CODEGEN
        assert (await engines.infer("text_embedding", {}, ()))["server"] == ENCODERS
        engines.engines[ENCODERS].models, engines.engines[CODEGEN].models = {"ner"}, {"codegen"}
        assert {m["name"] for m in await engines.repository_index()} == {"ner", "codegen"}

        async def gone():
            raise ConnectionError("codegen server restarting")

        engines.engines[CODEGEN].repository_index = gone  # a dead codegen server fails no encoders' call
        assert [m["name"] for m in await engines.repository_index()] == ["ner"]
        engines.engines[ENCODERS].repository_index = gone
        with pytest.raises(ConnectionError):
            await engines.repository_index()

    asyncio.run(asyncio.wait_for(main(), 30))


class TwoServers:
    def __init__(self):
        self.encoders, self.codegen = FakeServer(), FakeServer()
        self.url = self.encoders.url

    def servers(self):
        return {ENCODERS: self.encoders, CODEGEN: self.codegen}

    async def live(self):
        return await self.encoders.live()

    async def repository_index(self):
        return await self.encoders.repository_index()

    async def load(self, model):
        await self.encoders.load(model)


def test_a_dead_codegen_server_leaves_the_gateway_open(tmp_path):
    async def main():
        engines = TwoServers()
        admission = Admission()
        watch = ServerWatch(engines, ModelRegistry(Settings(data_dir=tmp_path / "data"), engines), admission)
        await watch.check_once()
        assert admission.refusal() is None and watch.problems() == {}
        engines.codegen.is_live = False
        await watch.check_once()
        assert admission.refusal() is None  # embeddings are admitted; codegen's calls fail on their own (503)
        assert list(watch.problems()) == ["triton_codegen"]
        engines.encoders.is_live = False
        await watch.check_once()
        assert admission.refusal() is not None and set(watch.problems()) == {"triton", "triton_codegen"}
        engines.codegen.is_live = True  # the encoders' server alone is down: completions are admitted
        await watch.check_once()
        assert admission.refusal() is None and list(watch.problems()) == ["triton"]
        engines.encoders.is_live = True
        await watch.check_once()
        assert admission.refusal() is None and watch.problems() == {}

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_clients_default_to_each_pipelines_server(monkeypatch):
    from client.triton_urls import default_url

    for variable in ("TRITON_DOMAINS", "GRPC_PORT", "CODEGEN_GRPC_PORT"):
        monkeypatch.delenv(variable, raising=False)
    assert default_url("codegen") == "localhost:8011" and default_url("text_embedding") == "localhost:8001"
    monkeypatch.setenv("CODEGEN_GRPC_PORT", "9011")
    assert default_url("codegen_stream") == "localhost:9011"
    monkeypatch.setenv("TRITON_DOMAINS", "one")  # every pipeline on the one server
    assert default_url("codegen") == "localhost:8001"
