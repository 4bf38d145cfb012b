"""The generator's engines for the live-server tests: the shipped default (`engine: auto`, OpenVINO on a CPU
instance) first, then torch, by a config override of a loaded generator or by a model repository of its own; and
a prompt the served demo model runs to max_tokens (for tests that need a long generation: a holder of a row, a
stream still open at a deadline)."""
from __future__ import annotations

import json
import re
import time
from functools import lru_cache
from pathlib import Path

import tritonclient.grpc as grpcclient

# a repository of the codegen models on an engine: bench/generator_heal.py builds its server on one too
from bench.model_repo import (CODEGEN_MODELS, MODEL_REPOSITORY, SHIPPED_ENGINE as SHIPPED,  # noqa: F401
                              repository_with_engine)
from supervisor.codegen_probe import request_inputs

ENGINES = ["openvino", "torch"]  # what `engine: auto` picks on a CPU instance first
# Where the demo model tends to go on and on (lists, loops, repeated lines) rather than end a function: the
# candidates of long_prompt, most likely first. Which of them runs to the end depends on the trained weights (each
# training machine's demo model writes its own text), so the tests search them instead of naming one. Each ends on
# punctuation, which token healing leaves alone (codegen_preprocess/healing.py): the same ids, healing on or off.
LONG_PROMPTS = ("x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,", "0, 0, 0, 0, 0, 0, 0, 0, 0, 0,", "print(",
                "return (", "while True:", "s = '", "assert (", "data = {\n    'a': 1,\n    'b': 2,",
                "from . import (", "items = [", "#!", "if x:\n    pass\nelif y:\n    pass\nelif z:")


def pin_exact(config: str) -> str:
    """The generator's config.pbtxt with `precision` f32, the exact mode: served tokens and logprobs are held to
    transformers' on the same weights, on every CPU (the shipped auto is bf16 where the CPU computes it natively)."""
    pinned, found = re.subn(r'(key: "precision",? value: \{ string_value: )"[^"]*"', r'\g<1>"f32"', config)
    assert found == 1, "the generator's config has no precision parameter"
    return pinned


def exact_repository(folder: Path, source: Path = MODEL_REPOSITORY) -> Path:
    """`source` as a model repository in `folder`: every model folder's files linked, the generator's config pinned
    to f32 (pin_exact). The test session's server serves it (triton_fixtures.py)."""
    for model in sorted(p for p in Path(source).iterdir() if (p / "config.pbtxt").exists()):
        (folder / model.name).mkdir(parents=True)
        for item in model.iterdir():
            if model.name == "codegen_generator" and item.name == "config.pbtxt":
                (folder / model.name / item.name).write_text(pin_exact(item.read_text()))
            else:
                (folder / model.name / item.name).symlink_to(item, target_is_directory=item.is_dir())
    return folder


def load_generator_with_engine(client, engine: str, **parameters) -> None:
    """Reload codegen_generator with its configuration, `engine` and `parameters` overridden (a fresh marker each
    time, so that Triton never skips the load as unchanged); the ensembles and BLS fronts call it by name."""
    config = client.get_model_config("codegen_generator", as_json=True)["config"]
    config["parameters"] = {**config.get("parameters", {}), "engine": {"string_value": engine},
                            **{key: {"string_value": str(value)} for key, value in parameters.items()},
                            "test_reload": {"string_value": f"{time.time():.6f}"}}
    client.load_model("codegen_generator", config=json.dumps(config))


@lru_cache(maxsize=None)
def long_prompt(grpc_url: str, max_tokens: int = 512, timeout: float = 600) -> str:
    """The first of LONG_PROMPTS whose greedy completion the server's `codegen` runs to `max_tokens` (no
    end-of-text before): a request whose length is its max_tokens, whatever the demo model happens to write."""
    client = grpcclient.InferenceServerClient(grpc_url)
    seen = {}
    try:
        for prompt in LONG_PROMPTS:
            result = client.infer("codegen", request_inputs(prompt, max_tokens), client_timeout=timeout)
            seen[prompt] = int(result.as_numpy("completion_tokens").reshape(-1)[0])
            if seen[prompt] == max_tokens:
                return prompt
    finally:
        client.close()
    raise AssertionError(f"the demo model ends every candidate prompt before {max_tokens} tokens: {seen}")
