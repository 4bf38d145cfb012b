"""The NER tagger as ONNX graphs, written from the extracted weights (no tracing), and checked against the
torch tagger at build time.

Three graphs, because the char LMs run in time segments whose LSTM state the runner carries between calls
(see backends/ner_tagger/segments.py):
- char_lm_<direction>.onnx: char_ids [steps, rows] (+ h0, c0 [layers, rows, hidden]) -> output [steps, rows,
  out], h, c: the embedding lookup, the LSTM layers and the optional projection.
- tagger_head.onnx: embeddings [rows, tokens, dim] + token_count [rows] -> emissions [rows, tokens, tags]:
  reprojection, the BiLSTM over each row's own length (ONNX LSTM's sequence_lens, as torch's packed
  sequence), the linear layer."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ner_tagger.onnx_tagger import HEAD_FILE, OnnxNerTagger, char_lm_file
from ner_tagger.rows import padded, sentence_rows

OPSET = 17


def _gates_torch_to_onnx(x: np.ndarray) -> np.ndarray:
    """torch stacks an LSTM's gates i, f, g, o along axis 0; ONNX expects i, o, f, c (c = torch's g)."""
    i, f, g, o = np.split(x, 4, axis=0)
    return np.concatenate([i, o, f, g], axis=0)


def _lstm_inputs(weights: dict, prefix: str, layer: int, directions: int) -> list[np.ndarray]:
    """W [dirs, 4H, in], R [dirs, 4H, H], B [dirs, 8H] for one layer of a torch nn.LSTM."""
    suffixes = [f"l{layer}", f"l{layer}_reverse"][:directions]
    w = [_gates_torch_to_onnx(weights[f"{prefix}.weight_ih_{s}"]) for s in suffixes]
    r = [_gates_torch_to_onnx(weights[f"{prefix}.weight_hh_{s}"]) for s in suffixes]
    b = [np.concatenate([_gates_torch_to_onnx(weights[f"{prefix}.bias_ih_{s}"]),
                         _gates_torch_to_onnx(weights[f"{prefix}.bias_hh_{s}"])]) for s in suffixes]
    return [np.stack(w), np.stack(r), np.stack(b)]


class _Graph:
    """A small helper over onnx.helper: named initializers and nodes, in the order they are added."""

    def __init__(self):
        self.nodes, self.initializers = [], []

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> list[str]:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{len(self.nodes)}", **attrs))
        return outputs

    def linear(self, x: str, weights: dict, prefix: str, out: str) -> str:
        """x @ weight.T + bias, as torch's nn.Linear."""
        product = self.node("MatMul", [x, self.const(f"{prefix}.weight_t", weights[f"{prefix}.weight"].T)],
                            [f"{out}_matmul"])[0]
        return self.node("Add", [product, self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])], [out])[0]

    def save(self, path: Path, name: str, inputs: list, outputs: list) -> None:
        import onnx
        from onnx import helper

        model = helper.make_model(helper.make_graph(self.nodes, name, inputs, outputs, self.initializers),
                                  opset_imports=[helper.make_opsetid("", OPSET)], producer_name="build/ner_onnx.py")
        onnx.checker.check_model(model)
        path.write_bytes(model.SerializeToString())


def char_lm_graph(weights: dict, lm: dict, path: Path) -> None:
    from onnx import TensorProto, helper

    prefix, layers, hidden = f"char_lm_{lm['direction']}", lm["nlayers"], lm["hidden_size"]
    g = _Graph()
    x = g.node("Gather", [g.const(f"{prefix}.encoder.weight", weights[f"{prefix}.encoder.weight"]), "char_ids"],
               ["embedded"])[0]
    hs, cs = [], []
    for layer in range(layers):
        h0, c0 = "h0", "c0"
        if layers > 1:  # this layer's slice of the stacked state
            bounds = [g.const(f"l{layer}_{k}", np.array([v], dtype=np.int64))
                      for k, v in (("start", layer), ("end", layer + 1))]
            h0 = g.node("Slice", ["h0", *bounds], [f"h0_l{layer}"])[0]
            c0 = g.node("Slice", ["c0", *bounds], [f"c0_l{layer}"])[0]
        w, r, b = (g.const(f"{prefix}.rnn.{k}_l{layer}", v)
                   for k, v in zip("WRB", _lstm_inputs(weights, f"{prefix}.rnn", layer, 1)))
        y, h, c = g.node("LSTM", [x, w, r, b, "", h0, c0], [f"y_l{layer}", f"h_l{layer}", f"c_l{layer}"],
                         hidden_size=hidden)
        x = g.node("Squeeze", [y, g.const(f"axis1_l{layer}", np.array([1], dtype=np.int64))], [f"x_l{layer + 1}"])[0]
        hs.append(h)
        cs.append(c)
    out = g.linear(x, weights, f"{prefix}.proj", "output") if lm["nout"] else \
        g.node("Identity", [x], ["output"])[0]
    for name, parts in (("h", hs), ("c", cs)):
        g.node("Concat", parts, [name], axis=0) if len(parts) > 1 else g.node("Identity", parts, [name])
    state = ["layers", "rows", hidden]
    g.save(path, prefix,
           [helper.make_tensor_value_info("char_ids", TensorProto.INT64, ["steps", "rows"]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("c0", TensorProto.FLOAT, state)],
           [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["steps", "rows", lm["nout"] or hidden]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, state)])


def head_graph(weights: dict, config: dict, path: Path) -> None:
    from onnx import TensorProto, helper

    dim = sum(lm["nout"] or lm["hidden_size"] for lm in config["char_lms"])
    directions = 2 if config["bidirectional"] else 1
    g = _Graph()
    x = g.linear("embeddings", weights, "embedding2nn", "reprojected") if config["reproject_embeddings"] \
        else "embeddings"
    x = g.node("Transpose", [x], ["time_major"], perm=[1, 0, 2])[0]  # [tokens, rows, dim]
    lengths = g.node("Cast", ["token_count"], ["lengths"], to=TensorProto.INT32)[0]
    merge = g.const("merge_directions", np.array([0, 0, -1], dtype=np.int64))
    for layer in range(config["rnn_layers"]):
        w, r, b = (g.const(f"rnn.{k}_l{layer}", v)
                   for k, v in zip("WRB", _lstm_inputs(weights, "rnn", layer, directions)))
        y = g.node("LSTM", [x, w, r, b, lengths], [f"y_l{layer}"], hidden_size=config["hidden_size"],
                   direction="bidirectional" if directions == 2 else "forward")[0]
        # [tokens, dirs, rows, hidden] -> [tokens, rows, dirs * hidden]: forward then backward, as torch
        y = g.node("Transpose", [y], [f"y_l{layer}_t"], perm=[0, 2, 1, 3])[0]
        x = g.node("Reshape", [y, merge], [f"x_l{layer + 1}"])[0]
    x = g.node("Transpose", [x], ["batch_major"], perm=[1, 0, 2])[0]
    g.linear(x, weights, "linear", "emissions")
    g.save(path, "ner_tagger_head",
           [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["rows", "tokens", dim]),
            helper.make_tensor_value_info("token_count", TensorProto.INT64, ["rows"])],
           [helper.make_tensor_value_info("emissions", TensorProto.FLOAT, ["rows", "tokens", config["num_tags"]])])


def probe_rows(char_lm_json: Path) -> tuple[np.ndarray, ...]:
    """Sentences of very different lengths in one batch, so the check crosses segments, padding and the
    per-row lengths of the BiLSTM."""
    from ner_preprocess.preprocessing import NerPreprocessor

    texts = ["George Washington went to Washington.", "Zoë Saldaña visited Zürich café.", "a",
             "In 1900 the board of Siemens AG met Angela Merkel in Munich, and nothing was decided. " * 4]
    encoded = NerPreprocessor(char_lm_json).encode(texts)
    rows = sentence_rows(*(encoded[k] for k in ("char_ids", "sentence_chars", "sentence_tokens",
                                                 "token_positions", "token_count")))
    return padded(rows.sentences)


def export_tagger(model_dir: Path, char_lm_json: Path, tolerance: float = 1e-4) -> float:
    """Writes the three graphs beside tagger.safetensors; returns the max abs difference of the emissions
    to the torch tagger on probe rows (build fails above `tolerance`)."""
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "tagger_config.json").read_text())
    weights = load_file(str(model_dir / "tagger.safetensors"))
    for lm in config["char_lms"]:
        char_lm_graph(weights, lm, model_dir / char_lm_file(lm["direction"]))
    head_graph(weights, config, model_dir / HEAD_FILE)

    import torch
    from ner_tagger.tagger import NerTaggerRunner

    rows = probe_rows(char_lm_json)
    reference = NerTaggerRunner(model_dir, torch.device("cpu")).emissions(*rows)
    got = OnnxNerTagger(model_dir, threads=1).emissions(*rows)
    real = np.arange(rows[2].shape[2])[None, :] < rows[3][:, None]  # tokens each row really has
    diff = float(np.abs(got[real] - reference[real]).max())
    if not diff <= tolerance:
        for path in [model_dir / HEAD_FILE] + [model_dir / char_lm_file(lm["direction"]) for lm in config["char_lms"]]:
            path.unlink(missing_ok=True)
        raise SystemExit(f"{model_dir}: the ONNX tagger differs from torch by {diff:.2e} (> {tolerance:.0e})")
    return diff
