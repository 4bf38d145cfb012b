"""The one way the clients, benchmarks and tests build a TYPE_STRING input: one item per batch row."""
from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient


def string_rows(name: str, values: list[str | bytes]) -> grpcclient.InferInput:
    """[len(values), 1] BYTES tensor; str is sent as UTF-8, bytes as they are (e.g. images)."""
    tensor = grpcclient.InferInput(name, [len(values), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[v.encode("utf-8") if isinstance(v, str) else v] for v in values],
                                        dtype=np.object_))
    return tensor
