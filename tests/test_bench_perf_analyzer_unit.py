"""bench/bench_perf_analyzer.py's --input-data (issue 55): each ensemble's entries name only inputs its
config.pbtxt declares and every input it requires, in the declared data types; binary data is Triton's serialized
BYTES tensor, as perf_analyzer sends a b64 entry unchanged. And bench/lm_eval_task/'s local task names its jsonl,
whose rows have the fields the task's templates read."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import yaml
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from bench.bench_perf_analyzer import bytes_b64, ensembles
from bench.model_repo import parse_config

ROOT = Path(__file__).resolve().parent.parent
JSON_TYPES = {model_config_pb2.TYPE_STRING: str, model_config_pb2.TYPE_INT32: int, model_config_pb2.TYPE_UINT64: int,
              model_config_pb2.TYPE_FP32: float, model_config_pb2.TYPE_BOOL: bool}


def test_every_ensemble_is_measured_with_its_declared_inputs():
    measured = ensembles(["a sentence"], ["Marie Curie lived in Paris."], [b"\xff\xd8 not really a jpeg"])
    assert [e.model for e in measured] == ["text_embedding", "ner", "food_captioning", "codegen", "codegen_stream"]
    for ensemble in measured:
        config = parse_config(ensemble.model)
        declared = {i.name: i for i in config.input}
        assert ensemble.streaming == config.model_transaction_policy.decoupled, ensemble.model
        for entry in ensemble.data:
            assert set(entry) <= set(declared), (ensemble.model, set(entry) - set(declared))
            assert {n for n, i in declared.items() if not i.optional} <= set(entry), ensemble.model
            for name, value in entry.items():
                if isinstance(value, dict):  # binary: a b64 entry, for BYTES inputs only
                    assert declared[name].data_type == model_config_pb2.TYPE_STRING
                    continue
                assert all(type(v) is JSON_TYPES[declared[name].data_type] for v in value), (ensemble.model, name)


def test_binary_data_is_the_serialized_bytes_tensor():
    image = bytes(range(256)) * 3
    sent = base64.b64decode(bytes_b64(image)["b64"])
    assert sent == serialize_byte_tensor(np.array([image], dtype=np.object_)).item()
    assert deserialize_bytes_tensor(sent).tolist() == [image]


def test_the_lm_eval_task_is_local():
    task = yaml.safe_load((ROOT / "bench" / "lm_eval_task" / "codegen_python.yaml").read_text())
    assert task["dataset_path"] == "json" and task["output_type"] == "loglikelihood"
    rows = [json.loads(line) for line in (ROOT / task["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()]
    assert rows and all(set(row) == {"context", "continuation"} and row["context"] and row["continuation"]
                        for row in rows)
    assert "{{context}}" in task["doc_to_text"] and "{{continuation}}" in task["doc_to_target"]
