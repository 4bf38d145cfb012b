"""Config and code never drift: every config.pbtxt parses, names a backend that exists, and every
ensemble step's maps match the step model's declared inputs and outputs (names, dtypes, shapes)."""
from __future__ import annotations

import pytest

from model_configs import ROOT, all_models, parse_config

MODELS = all_models()
ENSEMBLES = [m for m in MODELS if parse_config(m).platform == "ensemble"]


def shapes_compatible(a, b) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def test_repository_has_models():
    assert "text_embedding" in ENSEMBLES


@pytest.mark.parametrize("model", MODELS)
def test_config_parses_and_backend_exists(model):
    config = parse_config(model)
    assert config.name == model, "the folder name is the model name clients call"
    if config.platform != "ensemble":
        assert (ROOT / "backends" / config.backend / "model.py").is_file(), config.backend
    for tensor in list(config.input) + list(config.output):
        assert tensor.name == tensor.name.lower() and " " not in tensor.name, "tensor names are snake case"


@pytest.mark.parametrize("ensemble", ENSEMBLES)
def test_ensemble_maps_match_step_models(ensemble):
    config = parse_config(ensemble)
    # tensor name inside the ensemble -> (dtype, dims) as declared by whoever produces it
    known = {t.name: (t.data_type, list(t.dims)) for t in config.input}
    for step in config.ensemble_scheduling.step:
        step_config = parse_config(step.model_name)
        assert step_config.max_batch_size >= config.max_batch_size, step.model_name
        step_inputs = {t.name: t for t in step_config.input}
        step_outputs = {t.name: t for t in step_config.output}
        for step_name, ensemble_name in step.input_map.items():
            assert step_name in step_inputs, f"{step.model_name} has no input {step_name}"
            assert ensemble_name in known, f"{ensemble_name} is used before any step produces it"
            declared = step_inputs[step_name]
            dtype, dims = known[ensemble_name]
            assert declared.data_type == dtype, f"{step.model_name}.{step_name} dtype"
            assert shapes_compatible(list(declared.dims), dims), f"{step.model_name}.{step_name} dims"
        required = {t.name for t in step_config.input if not t.optional}
        assert required <= set(step.input_map), f"{step.model_name} misses inputs {required - set(step.input_map)}"
        for step_name, ensemble_name in step.output_map.items():
            assert step_name in step_outputs, f"{step.model_name} has no output {step_name}"
            out = step_outputs[step_name]
            known[ensemble_name] = (out.data_type, list(out.dims))
    for output in config.output:
        assert output.name in known, f"no step produces ensemble output {output.name}"
        dtype, dims = known[output.name]
        assert output.data_type == dtype and shapes_compatible(list(output.dims), dims), output.name
