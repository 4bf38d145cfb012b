"""Complete code with the served codegen pipelines over gRPC.

    python client/generate.py "def fibonacci(n):" --max-tokens 64 [--stream] [--url localhost:8011]

Unary calls `codegen`; --stream calls `codegen_stream` and prints each piece as it arrives.
"""
from __future__ import annotations

import argparse
import queue
import sys
from typing import Iterator

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.gateway_key import add_api_key_argument
from client.triton_urls import default_url


def request_inputs(prompt: str, max_tokens: int, temperature: float | None = None, top_k: int | None = None,
                   top_p: float | None = None, seed: int | None = None,
                   stop_words: list[str] | None = None) -> list[grpcclient.InferInput]:
    """The tensors of Triton's TensorRT-LLM ensemble: text_input, max_tokens and the optional ones."""
    values = [("text_input", np.array([[prompt.encode("utf-8")]], dtype=np.object_), "BYTES"),
              ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32")]
    optional = [("temperature", temperature, np.float32, "FP32"), ("top_k", top_k, np.int32, "INT32"),
                ("top_p", top_p, np.float32, "FP32"), ("random_seed", seed, np.uint64, "UINT64")]
    values += [(name, np.array([[v]], dtype=dtype), triton) for name, v, dtype, triton in optional if v is not None]
    if stop_words:
        values.append(("stop_words", np.array([[w.encode("utf-8") for w in stop_words]], dtype=np.object_), "BYTES"))
    tensors = []
    for name, array, datatype in values:
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def complete(url: str, inputs: list[grpcclient.InferInput]) -> str:
    result = grpcclient.InferenceServerClient(url).infer("codegen", inputs)
    return result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")


def stream(url: str, inputs: list[grpcclient.InferInput]) -> Iterator[str]:
    """The pieces of text as the server sends them (each valid UTF-8), until the final response."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("codegen_stream", inputs, enable_empty_final_response=True)
        while True:
            result, error = events.get()
            if error is not None:
                raise error
            response = result.get_response()
            if response.outputs:
                yield result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")
            if response.parameters["triton_final_response"].bool_param:
                return
    finally:
        client.stop_stream(cancel_requests=True)


def complete_openai(args) -> int:
    """The same completion through the gateway's OpenAI-compatible API, with the official SDK."""
    import openai

    client = openai.OpenAI(base_url=args.openai, api_key=args.api_key or "unused")  # unused: an open gateway
    params = dict(model="codegen", prompt=args.prompt, max_tokens=args.max_tokens, stop=args.stop, seed=args.seed,
                  temperature=0 if args.temperature is None else args.temperature, top_p=args.top_p)
    try:
        print(args.prompt, end="", flush=True)
        if args.stream:
            for chunk in client.completions.create(stream=True, **{k: v for k, v in params.items() if v is not None}):
                print(chunk.choices[0].text, end="", flush=True)
        else:
            print(client.completions.create(**{k: v for k, v in params.items() if v is not None}).choices[0].text, end="")
        print()
    except openai.APIError as e:
        print(f"\nerror: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the SDK closes the connection: the gateway cancels the sequence
        return 130
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream", action="store_true", help="print pieces as they are generated")
    parser.add_argument("--temperature", type=float, help="0 or absent: greedy")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--stop", action="append", help="stop word (repeatable); the output ends before it")
    parser.add_argument("--url", default=default_url("codegen"),
                        help="Triton gRPC address (default: CODEGEN_GRPC_PORT, 8011; client/triton_urls.py)")
    add_api_key_argument(parser)
    parser.add_argument("--openai", metavar="URL", help="call the gateway's /v1/completions with the openai SDK "
                                                        "instead, e.g. http://localhost:8080/v1 (no --top-k there)")
    args = parser.parse_args()
    if args.openai:
        if args.top_k is not None:
            parser.error("--top-k has no counterpart in OpenAI's completions API")
        return complete_openai(args)
    inputs = request_inputs(args.prompt, args.max_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                            args.stop)
    try:
        print(args.prompt, end="", flush=True)
        if args.stream:
            for piece in stream(args.url, inputs):
                print(piece, end="", flush=True)
        else:
            print(complete(args.url, inputs), end="")
        print()
    except InferenceServerException as e:
        print(f"\nerror: {e.message()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the stream is cancelled on the way out: the server frees the row
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
