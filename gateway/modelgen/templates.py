"""config.pbtxt text of the generated models (parsed by the tests with Triton's own protobuf)."""
from __future__ import annotations


def _params(**values) -> str:
    return "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in values.items())


def _runtime_comment(note: str) -> str:
    """The export's outcome as a comment line above the runtime parameter (one line, whatever it says)."""
    return "# " + " ".join(note.split())


def _stage(name: str, backend: str, max_batch: int, body: str, kind: str = "KIND_CPU") -> str:
    """One generic stage (a Python-based backend): its inputs, outputs and parameters (`body`), batched
    by Triton with no delay and a queue of at most 1024 requests, one instance of `kind`."""
    return f'''name: "{name}"
backend: "{backend}"
max_batch_size: {max_batch}
{body}
dynamic_batching {{ max_queue_delay_microseconds: 0 default_queue_policy {{ max_queue_size: 1024 }} }}
instance_group [{{ kind: {kind} count: 1 }}]
'''


def tokenizer(name: str, max_length: int, max_batch: int) -> str:
    return _stage(name, "text_tokenizer", max_batch, f'''input [{{ name: "text" data_type: TYPE_STRING dims: [1] }}]
output [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [-1] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [-1] }}
]
{_params(max_length=max_length)}''')


def transformer_encoder(name: str, hidden: int, max_batch: int, runtime: str = "torch",
                        note: str = "torch: no ONNX export") -> str:
    return _stage(name, "transformer_encoder", max_batch, f'''input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [-1] allow_ragged_batch: true }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [-1] allow_ragged_batch: true }}
]
output [{{ name: "token_embeddings" data_type: TYPE_FP32 dims: [-1, {hidden}] }}]
{_runtime_comment(note)}
{_params(runtime=runtime, threads=2, rows_per_forward=8)}''', kind="KIND_AUTO")


def pooling(name: str, hidden: int, mode: str, normalize: bool, max_batch: int) -> str:
    return _stage(name, "mean_pooling", max_batch, f'''input [
  {{ name: "token_embeddings" data_type: TYPE_FP32 dims: [-1, {hidden}] allow_ragged_batch: true }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [-1] allow_ragged_batch: true }}
]
output [{{ name: "embedding" data_type: TYPE_FP32 dims: [{hidden}] }}]
{_params(mode=mode, normalize=str(normalize).lower())}''')


def image_preprocess(name: str, max_batch: int, max_image_bytes: int, max_megapixels: float) -> str:
    """The image limits are the gateway's own (MAX_IMAGE_BYTES, MAX_IMAGE_MEGAPIXELS): an image the gateway
    accepts is never refused by the stage under another name."""
    return _stage(name, "image_preprocess", max_batch, f'''input [{{ name: "image" data_type: TYPE_STRING dims: [1] }}]
output [{{ name: "pixel_values" data_type: TYPE_FP32 dims: [3, -1, -1] }}]
{_params(processor_file="preprocessor_config.json", max_image_bytes=max_image_bytes, max_megapixels=max_megapixels)}''')


def clip_encoder(name: str, dimension: int, max_batch: int, runtime: str = "torch",
                 note: str = "torch: no ONNX export") -> str:
    return _stage(name, "clip_encoder", max_batch, f'''input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [-1] allow_ragged_batch: true optional: true }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [-1] allow_ragged_batch: true optional: true }},
  {{ name: "pixel_values" data_type: TYPE_FP32 dims: [3, -1, -1] optional: true }}
]
output [{{ name: "embedding" data_type: TYPE_FP32 dims: [{dimension}] }}]
{_runtime_comment(note)}
{_params(runtime=runtime, threads=2)}''', kind="KIND_AUTO")


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return "    {\n      model_name: \"%s\"\n      model_version: -1\n      %s\n    }" % (model, "\n      ".join(maps))


def _ensemble(name: str, input_name: str, dimension: int, max_batch: int, steps: list[str]) -> str:
    joined = ",\n".join(steps)
    return f'''name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch}
input [{{ name: "{input_name}" data_type: TYPE_STRING dims: [1] }}]
output [{{ name: "embedding" data_type: TYPE_FP32 dims: [{dimension}] }}]
ensemble_scheduling {{
  step [
{joined}
  ]
}}
'''


def text_ensemble(name: str, names: dict[str, str], dimension: int, max_batch: int) -> str:
    ids = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    return _ensemble(name, "text", dimension, max_batch, [
        _step(names["tokenizer"], {"text": "text"}, ids),
        _step(names["encoder"], ids, {"token_embeddings": "token_embeddings"}),
        _step(names["pooling"], {"token_embeddings": "token_embeddings", "attention_mask": "attention_mask"},
              {"embedding": "embedding"}),
    ])


def clip_text_ensemble(name: str, names: dict[str, str], dimension: int, max_batch: int) -> str:
    ids = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    return _ensemble(name, "text", dimension, max_batch, [
        _step(names["tokenizer"], {"text": "text"}, ids),
        _step(names["encoder"], ids, {"embedding": "embedding"}),
    ])


def clip_image_ensemble(name: str, names: dict[str, str], dimension: int, max_batch: int) -> str:
    return _ensemble(name, "image", dimension, max_batch, [
        _step(names["preprocess"], {"image": "image"}, {"pixel_values": "pixel_values"}),
        _step(names["encoder"], {"pixel_values": "pixel_values"}, {"embedding": "embedding"}),
    ])
