"""Steady request load on the served pipelines, shared by the fault-injection tests and the soak.

Each pipeline has one cheap good request and one bad request (which must be refused with
INVALID_ARGUMENT); a Load runs N client threads in a loop and records every outcome with its times,
so that failures can be set against the moments a stub was killed and healed.

Its test images come from tests/food_images.py: the caller has tests/ on sys.path (pytest's conftest does;
bench/soak.py adds it)."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.string_tensors import string_rows
from supervisor.codegen_probe import request_inputs, stream_call, tensor


def _ints(name: str, values) -> grpcclient.InferInput:
    return tensor(name, np.array(values, dtype=np.int32).reshape(-1, 1))


def _image() -> bytes:
    from food_images import encode, photo

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
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._counter = itertools.count(1)
        self._pipelines = pipelines()

    def start(self) -> "Load":
        for i in range(self.concurrency):
            thread = threading.Thread(target=self._client, args=(self.names[i % len(self.names)],), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Lets every request in flight finish (client timeout `timeout_s`); a client still stuck after the grace
        period (default: the timeout + 30 s) is recorded as a hung request, so that a hang never hides as a
        missing outcome."""
        self._stop.set()
        grace_s = self.timeout_s + 30 if grace_s is None else grace_s
        deadline = time.time() + grace_s
        for i, thread in enumerate(self._threads):
            thread.join(max(0.0, deadline - time.time()))
            if thread.is_alive():
                name = self.names[i % len(self.names)]
                self.outcomes.append(Outcome(name, deadline - grace_s, time.time(), False, "HUNG: no answer at stop"))

    def _client(self, name: str) -> None:
        pipeline = self._pipelines[name]
        client = grpcclient.InferenceServerClient(self.url)
        while not self._stop.is_set():
            bad = bool(self.bad_every) and next(self._counter) % self.bad_every == 0
            start, error = time.time(), None
            try:
                inputs = pipeline.bad() if bad else pipeline.good()
                if pipeline.stream:
                    stream_call(client, pipeline.model, inputs, self.timeout_s)
                else:
                    client.infer(pipeline.model, inputs, client_timeout=self.timeout_s)  # a hang: DEADLINE_EXCEEDED
            except InferenceServerException as exc:
                error = f"{exc.status()}: {exc.message()}"
            except Exception as exc:  # a client-side failure is an unexpected error too
                error = f"{type(exc).__name__}: {exc}"
            self.outcomes.append(Outcome(name, start, time.time(), bad, error, pipeline.refusal))
            if error is not None and not bad:
                time.sleep(0.1)  # e.g. the server is down or restarting: do not spin on the shared box's cores
        client.close()

    def unexpected(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.expected]
