"""A stand-in for Triton's gRPC ModelInfer that answers at once: every request's rows get one fixed
unit vector (`embedding`, FP32 [rows, 384]). In front of it the gateway is the only thing working, so its
own cost per request (CPU ms/request) and its ceiling (req/s) can be measured without the model's
compute and without the noise of a busy box drowning a sub-millisecond difference.

    python -m bench.fake_triton --port 9400      # then TRITON_GRPC_URL=127.0.0.1:9400 python -m gateway

--delay-ms: answer after that long instead (a real model's time, so the gateway idles between requests at
c1 as it does in front of Triton; costs that only show on a cold, idle loop show then).
"""
from __future__ import annotations

import argparse
import asyncio

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

DIM = 384


class FakeInference(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        vector = np.random.default_rng(0).standard_normal(DIM).astype(np.float32)
        self.row = (vector / np.linalg.norm(vector)).tobytes()

    async def ModelInfer(self, request, context):
        rows = request.inputs[0].shape[0] if request.inputs else 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        for wanted in request.outputs or [service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="embedding")]:
            tensor = response.outputs.add()
            tensor.name, tensor.datatype = wanted.name, "FP32"
            tensor.shape.extend([rows, DIM])
            response.raw_output_contents.append(self.row * rows)
        return response

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=True)


async def serve(port: int, delay_s: float = 0.0) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeInference(delay_s), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
