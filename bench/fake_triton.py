"""A stand-in for Triton's gRPC ModelInfer that answers at once: every request's rows get one fixed
unit vector (`embedding`, FP32 [rows, 384]). In front of it the gateway is the only thing working, so its
own cost per request (CPU ms/request) and its ceiling (req/s) can be measured without the model's
compute and without the noise of a busy box drowning a sub-millisecond difference.

    python bench/fake_triton.py --port 9400      # then TRITON_GRPC_URL=127.0.0.1:9400 python -m gateway
"""
from __future__ import annotations

import argparse
import asyncio

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

DIM = 384


class FakeInference(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self):
        vector = np.random.default_rng(0).standard_normal(DIM).astype(np.float32)
        self.row = (vector / np.linalg.norm(vector)).tobytes()

    async def ModelInfer(self, request, context):
        rows = request.inputs[0].shape[0] if request.inputs else 1
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


async def serve(port: int) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeInference(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
