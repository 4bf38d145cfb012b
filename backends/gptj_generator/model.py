import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from codegen_common import logprobs_wire  # noqa: E402
from gptj_generator.loading import choose_engine, engine_options, load_engine  # noqa: E402
from gptj_generator.llm_metrics_publisher import ServingMetrics  # noqa: E402
from gptj_generator.published_settings import engine_settings, publish  # noqa: E402
from gptj_generator.pulled_stream import Chunk, PulledStream, PulledStreams  # noqa: E402
from gptj_generator.seam import FINISH_REASONS, GenerationRequest, SamplingParams  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.request_inputs import scalar_input, stop_words_input  # noqa: E402
from stage_common.tracing import StageTracing, traceparent_of  # noqa: E402
from stage_common.triton_io import (error_response, input_array, load_model_config, string_tensor,  # noqa: E402
                                    version_dir)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def parse(request) -> tuple[GenerationRequest, bool, bool]:
    ids = input_array(request, "input_ids")
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise BadInput(f"send one prompt per request (input_ids shape {list(ids.shape)})")
    length = int(scalar_input(request, "input_lengths", required=True))
    if not 0 <= length <= ids.shape[1]:
        raise BadInput(f"input_lengths {length} does not fit input_ids of {ids.shape[1]} tokens")
    sampling = SamplingParams(temperature=float(scalar_input(request, "temperature", 0.0)),
                              top_k=int(scalar_input(request, "runtime_top_k", 0)),
                              top_p=float(scalar_input(request, "runtime_top_p", 1.0)),
                              seed=scalar_input(request, "random_seed"))
    max_tokens = int(scalar_input(request, "request_output_len", required=True))
    logprobs = scalar_input(request, "logprobs")  # absent: none; k: each id's logprob and k alternatives
    heal = input_array(request, "heal_prefix", optional=True)  # token healing's backed-off bytes
    heal_prefix = b"" if heal is None or heal.size == 0 else heal.reshape(-1)[0]
    generation = GenerationRequest(ids[0, :length].tolist(), max_tokens, sampling, stop_words_input(request),
                                   key=request.request_id() or None,
                                   logprobs=None if logprobs is None else int(logprobs),
                                   prompt_logprobs=bool(scalar_input(request, "prompt_logprobs", False)),
                                   heal_prefix=heal_prefix if isinstance(heal_prefix, bytes) else str(heal_prefix).encode())
    return generation, bool(scalar_input(request, "streaming", True)), bool(scalar_input(request, "pull", False))


def ids_response(ids: list[int], reason: str, count: int, logprobs: list | None = None,
                 prompt_logprobs: list | None = None):
    """`logprobs` (JSON, codegen_common/logprobs_wire.py) only for requests that asked for them."""
    tensors = [pb_utils.Tensor("output_ids", np.array([ids], np.int32)),
               string_tensor("finish_reason", [reason], (1, 1)),
               pb_utils.Tensor("completion_tokens", np.array([[count]], np.int32))]
    if logprobs is not None or prompt_logprobs is not None:
        tensors.append(string_tensor("logprobs", [logprobs_wire.encode(logprobs or [], prompt_logprobs)], (1, 1)))
    return pb_utils.InferenceResponse(tensors)


def deliver_chunk(sender, chunk: Chunk) -> None:
    """A pulled stream's chunk: the one (final) response of the fetch that asked for it."""
    try:
        if chunk.error is not None:
            sender.send(error_response(chunk.error), flags=FINAL)
        else:
            reason = FINISH_REASONS[chunk.finish_reason] if chunk.finish_reason else ""
            sender.send(ids_response(chunk.token_ids, reason, chunk.completion_tokens, chunk.logprobs,
                                     chunk.prompt_logprobs), flags=FINAL)
    except Exception:  # noqa: BLE001 - the caller is gone; its stream ends by the abandon timeout
        pass


class ResponseSink:
    """One request's response sender: a response per released chunk of ids when streaming, else one
    response with all of them. Every response carries finish_reason ("" until the last) and
    completion_tokens (ids released so far); the last one carries the final flag (each send is a round
    trip to the server, so no separate empty one)."""

    def __init__(self, request, sender, streaming: bool):
        self.request, self.sender, self.streaming = request, sender, streaming
        self.collected: list[int] = []
        self.count = 0
        self.logprobs: list | None = None  # unary: every id's (requests that asked)
        self.prompt_logprobs: list | None = None

    def _respond(self, ids: list[int], reason: str = "", flags: int = 0, logprobs=None, prompt_logprobs=None) -> None:
        self.sender.send(ids_response(ids, reason, self.count, logprobs, prompt_logprobs), flags=flags)

    def send(self, token_ids: list[int], logprobs: list | None = None, prompt_logprobs: list | None = None) -> None:
        self.count += len(token_ids)
        if self.streaming:
            self._respond(token_ids, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        else:
            self.collected += token_ids
            self._keep(logprobs, prompt_logprobs)

    def _keep(self, logprobs, prompt_logprobs) -> None:
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
        if prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs

    def finish(self, reason: str, token_ids: list[int], logprobs: list | None = None,
               prompt_logprobs: list | None = None) -> None:
        self.count += len(token_ids)
        if self.streaming:
            self._respond(token_ids, FINISH_REASONS[reason], FINAL, logprobs, prompt_logprobs)
            return
        self._keep(logprobs, prompt_logprobs)
        self._respond(self.collected + token_ids, FINISH_REASONS[reason], FINAL, self.logprobs, self.prompt_logprobs)

    def fail(self, error: BaseException) -> None:
        try:
            self.sender.send(error_response(error), flags=FINAL)
        except Exception:  # noqa: BLE001 - the client is already gone
            pass

    def cancelled(self) -> bool:
        return self.request.is_cancelled()


class EngineMetrics:
    """Custom /metrics entries: Triton's own counts see one execution per enqueue, not decode steps."""

    def __init__(self, model_name: str):
        labels = {"model": model_name}
        self._families = [
            pb_utils.MetricFamily("codegen_active_sequences", "sequences being decoded or waiting for a row",
                                  pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily("codegen_decode_steps", "batched decode forward passes",
                                  pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily("codegen_decode_rows", "sequence rows over all decode steps (rows/steps = "
                                  "mean batch size)", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily("codegen_compute_duration_us", "time the decode loop spent prefilling, "
                                  "decoding and sampling", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily("codegen_request_compute_duration_us", "decode-loop time counted once for "
                                  "every sequence in each step (summed per request, as "
                                  "nv_inference_compute_infer_duration_us counts a batched execution)",
                                  pb_utils.MetricFamily.COUNTER),
        ]
        self._families += [
            pb_utils.MetricFamily("codegen_generator_active_sequences", "sequences in the decode batch",
                                  pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily("codegen_generator_pending_requests", "requests waiting for a row of the "
                                  "decode batch (bounded by max_pending_requests)", pb_utils.MetricFamily.GAUGE)]
        (self.active, self.steps, self.rows, self.compute_us, self.request_compute_us, self.running_gauge,
         self.pending_gauge) = (family.Metric(labels) for family in self._families)
        self._seen = (0, 0, 0, 0)
        self._gauges = (-1, -1)
        self._updated_at = 0.0

    def update(self, engine) -> None:
        """Each metric call is a round trip to the server: the two gauges every loop turn they change,
        the rest at most every 0.2 s, and when idle."""
        stats = engine.stats()
        gauges = (stats.running, stats.pending)
        if gauges != self._gauges:
            self.running_gauge.set(gauges[0])
            self.pending_gauge.set(gauges[1])
            self._gauges = gauges
        now_s = time.monotonic()
        if stats.active and now_s - self._updated_at < 0.2:
            return
        self._updated_at = now_s
        self.active.set(stats.active)
        now = (stats.steps, stats.rows_decoded, int(stats.busy_seconds * 1e6), int(stats.request_seconds * 1e6))
        if now != self._seen:
            for metric, value, seen in zip((self.steps, self.rows, self.compute_us, self.request_compute_us),
                                           now, self._seen):
                metric.increment(value - seen)
            self._seen = now


class TritonPythonModel:
    """Decoupled: input_ids, input_lengths, request_output_len (+ optional sampling inputs, stop_words,
    streaming) -> a stream of output_ids chunks, the last one flagged final. Requests only enqueue
    here; the engine's decode loop batches them per step (continuous batching). stop=true with a
    request_id stops that request. pull=true: one response (the first chunk), and one per fetch=true
    request with the same request_id (pulled_stream.py says why)."""

    def initialize(self, args):
        config = load_model_config(args)
        kind = choose_engine(config_param(config, "engine", str, "auto"), args.get("model_instance_kind") == "GPU")
        if kind == "torch":
            from stage_common.torch_runtime import configure_torch

            placement = dict(device=configure_torch(args, config))
        else:
            placement = dict(threads=config_param(config, "openvino_threads", int, 0))
        self.metrics = EngineMetrics(args["model_name"])
        self.serving = ServingMetrics(args["model_name"])  # time to first token, tokens, ... (llm_metrics.py)
        self.engine = load_engine(kind, version_dir(args), **engine_options(config), **placement,
                                  on_progress=self._progress)
        self.serving.follow(self.engine)
        publish(args["model_name"], engine_settings(self.engine))  # what /health says it runs with
        self.pulled = PulledStreams()
        # a pulled stream nobody fetched for this long (its caller's stub died) ends and frees its row
        self.abandon_after_s = config_param(config, "pulled_stream_abandon_s", float, 60.0)
        self.tracing = StageTracing.from_env(args["model_name"])  # None (tracing off): no SDK, no span

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                if scalar_input(request, "stop", False):
                    self._stop(request, sender)
                    continue
                ack = bool(scalar_input(request, "ack", False))
                if scalar_input(request, "fetch", False):
                    self._ack(sender, ack)
                    self.pulled.fetch(request.request_id(), sender)
                    continue
                if scalar_input(request, "probe", False):
                    self._probe(request, sender)
                    continue
                generation, streaming, pull = parse(request)
                if self.tracing is not None:  # a span under the caller's traceparent parameter, if it sent one
                    generation.on_event = self.tracing.sequence(traceparent_of(request.parameters()), generation,
                                                                self.engine.name, FINISH_REASONS)
                generation.on_event = self.serving.watch(generation, generation.on_event)
                self._ack(sender, ack)
                if pull:
                    self._submit_pulled(generation, sender)
                else:
                    self.engine.submit(generation, ResponseSink(request, sender, streaming))
            except Exception as exc:  # noqa: BLE001 - each request fails on its own
                try:
                    sender.send(error_response(exc), flags=FINAL)
                except Exception:  # noqa: BLE001 - the client is gone
                    pass
        return None

    def _progress(self, engine) -> None:
        """After each engine loop turn (its thread): the statistics."""
        self.metrics.update(engine)
        self.serving.update(engine)

    @staticmethod
    def _ack(sender, asked: bool) -> None:
        """An empty, non-final response, for a caller that asked (input `ack`): it frees the caller's
        Triton-side thread, which waits for a BLS call's first response (config.pbtxt, issue 48)."""
        if asked:
            sender.send(pb_utils.InferenceResponse([]))

    def _submit_pulled(self, generation: GenerationRequest, sender) -> None:
        """The request's own response is its first chunk; its caller fetches the rest (pulled_stream.py)."""
        stream = PulledStream(deliver_chunk, sender, abandon_after_s=self.abandon_after_s)
        self.pulled.open(generation.key, stream)
        try:
            self.engine.submit(generation, stream)
        except Exception:
            self.pulled.close(generation.key)
            raise

    def _stop(self, request, sender) -> None:
        """A request with stop=true ends the running request that has the same request_id (a caller
        that reaches this model through BLS or an ensemble cannot cancel it the Triton way in 2.51)."""
        if not request.request_id():
            raise BadInput("a stop request needs the request_id of the request to stop")
        self.engine.cancel(request.request_id())
        sender.send(flags=FINAL)

    def _probe(self, request, sender) -> None:
        """probe=true with a request_id: an empty final answer if that request is still here, else
        INVALID_ARGUMENT. A BLS front waiting long for an answer asks, to tell a slow generator from one
        whose stub died and was replaced (the new stub knows nothing of the old one's requests)."""
        key = request.request_id()
        if not key:
            raise BadInput("a probe needs the request_id of the request it asks about")
        if not (self.engine.holds(key) or key in self.pulled):
            raise BadInput(f"no request in flight has request_id '{key}'")
        sender.send(flags=FINAL)

    def finalize(self):
        self.engine.close()
        if self.tracing is not None:
            self.tracing.close()
