"""Steady request load on the served pipelines, shared by the fault-injection tests and the soak.

Each pipeline has one cheap good request and one bad request (which must be refused with
INVALID_ARGUMENT); a Load runs N client threads in a loop and records every outcome with its times,
so that failures can be set against the moments a stub was killed and healed. The clients are bench/load.py's
(`Background`), on the wall clock (time.time(): the kills are timed on it)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bench import load
from bench.images import encode, photo
from client.string_tensors import string_rows
from gateway.triton.engine import channel_args
from supervisor.codegen_probe import request_inputs, stream_call, tensor


def _ints(name: str, values) -> grpcclient.InferInput:
    return tensor(name, np.array(values, dtype=np.int32).reshape(-1, 1))


def _image() -> bytes:
    return encode(photo(96, 96, seed=1), "JPEG")


@dataclass
class Pipeline:
    model: str
    good: callable  # () -> inputs
    bad: callable
    stream: bool = False
    refusal: str = ""  # over a gRPC stream Triton sends no status code: the bad request's refusal message


def pipelines() -> dict[str, Pipeline]:
    image = _image()
    return {
        "text_embedding": Pipeline("text_embedding", lambda: [string_rows("text", ["a steady load sentence"])],
                                   lambda: [_ints("text", [1])]),  # wrong datatype: refused by the server
        "ner": Pipeline("ner", lambda: [string_rows("text", ["George Washington went to Washington."])],
                        lambda: [_ints("text", [1])]),
        "food_captioning": Pipeline("food_captioning", lambda: [string_rows("image", [image])],
                                    lambda: [_ints("image", [1])]),
        "codegen": Pipeline("codegen", lambda: request_inputs("def add(a, b):", 4),
                            lambda: request_inputs("def add(a, b):", 4, temperature=float("nan"))),
        "codegen_stream": Pipeline("codegen_stream", lambda: request_inputs("def add(a, b):", 4),
                                   lambda: request_inputs("def add(a, b):", 4, temperature=float("nan")), stream=True,
                                   refusal="temperature must be"),
    }


@dataclass
class Outcome:
    pipeline: str
    start: float
    end: float
    bad: bool  # a deliberately bad request
    error: str | None  # None: answered; else "<status>: <message>"
    refusal: str = ""  # for a stream: the message that marks the bad request's refusal

    @property
    def expected(self) -> bool:
        """A good request answered, or a bad one refused with INVALID_ARGUMENT (or its refusal message
        on a stream, which carries no status code)."""
        if not self.bad:
            return self.error is None
        if self.error is None:
            return False
        return "INVALID_ARG" in self.error or bool(self.refusal) and self.error.startswith("None: ") \
            and self.refusal in self.error


@dataclass
class Load:
    url: str
    names: list[str]
    concurrency: int = 8
    bad_every: int = 0  # every n-th request is a bad one (0: none)
    # a request in flight on a killed decoupled stub (the generator) is never answered by Triton 2.51: it
    # ends only at this client timeout
    timeout_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self):
        self._pipelines = pipelines()
        self._clients: dict[int, grpcclient.InferenceServerClient] = {}
        self._load = load.Background(self._request, self.concurrency, clock=time.time, describe_error=_described,
                                     on_record=self._note,
                                     # e.g. the server is down or restarting: do not spin on the shared box's cores
                                     pause_after_error=lambda record: 0.0 if self._bad(record) else 0.1)

    def start(self) -> "Load":
        self._load.start()
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Lets every request in flight finish (client timeout `timeout_s`); a client still stuck after the grace
        period (default: the timeout + 30 s) is recorded as a hung request, so that a hang never hides as a
        missing outcome."""
        grace_s = self.timeout_s + 30 if grace_s is None else grace_s
        stopped = time.time()
        hung = self._load.stop(grace_s)
        for worker in hung:
            self.outcomes.append(Outcome(self._name(worker), stopped, time.time(), False, "HUNG: no answer at stop"))
        for worker, client in self._clients.items():
            if worker not in hung:  # a hung client's call still holds its channel
                client.close()

    def _name(self, worker: int) -> str:
        return self.names[worker % len(self.names)]

    def _bad(self, call) -> bool:
        """Every bad_every-th request started (counting from 1) is a bad one."""
        return bool(self.bad_every) and (call.index + 1) % self.bad_every == 0

    def _request(self, call: load.Call) -> None:
        pipeline = self._pipelines[self._name(call.worker)]
        client = self._clients.get(call.worker) or self._clients.setdefault(
            # the gateway's short reconnect backoff: gRPC's own grows to seconds while a server restarts, and a
            # request sent after the server is back would still fail to connect (CI saw it 1 s after)
            call.worker, grpcclient.InferenceServerClient(self.url, channel_args=channel_args()))
        inputs = pipeline.bad() if self._bad(call) else pipeline.good()
        if pipeline.stream:
            stream_call(client, pipeline.model, inputs, self.timeout_s)
        else:
            client.infer(pipeline.model, inputs, client_timeout=self.timeout_s)  # a hang: DEADLINE_EXCEEDED

    def _note(self, record: load.Record) -> None:
        name = self._name(record.worker)
        self.outcomes.append(Outcome(name, record.start, record.end, self._bad(record), record.error,
                                     self._pipelines[name].refusal))

    def unexpected(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.expected]


def _described(error: BaseException) -> str:
    if isinstance(error, InferenceServerException):
        return f"{error.status()}: {error.message()}"
    return f"{type(error).__name__}: {error}"  # a client-side failure is an unexpected error too
