"""One sequence's generation parameters, resolved once (in codegen_preprocess) from the codegen
tensors of its row and, when given, NVIDIA OpenAI-frontend `sampling_parameters` JSON; carried to the
other stages as a JSON string (torch-free).

sampling_parameters keys -> parameters: temperature, top_p, top_k, max_tokens, seed (-> random_seed),
stop (a string or a list of strings -> stop_words). A key given there overrides the tensor of the same
meaning; any other key is refused, naming it."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from codegen_common.limits import DEFAULT_MAX_TOKENS, MAX_LOGPROBS
from codegen_common.request_checks import check_sampling, check_stop_words
from stage_common.errors import BadInput

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    exclude_input: bool = True  # False: the prompt is prepended to text_output
    logprobs: int | None = None  # None: none; k: each generated id's logprob and k alternatives (+ the prompt's
    #                              when exclude_input is False: OpenAI's echo)
    token_healing: bool = True  # the preprocessing may back off the prompt's last id (codegen_preprocess/healing.py)
    heal_prefix: str = ""  # what it backed off: the generated text starts with it, and it is cut from the answer

    @property
    def prompt_logprobs(self) -> bool:
        return self.logprobs is not None and not self.exclude_input

    def check(self, max_stop_words: int, max_stop_word_chars: int) -> "GenerationParams":
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_stop_words(self.stop, max_stop_words, max_stop_word_chars)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise BadInput(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "GenerationParams":
        """The stages' JSON row; BadInput (INVALID_ARGUMENT for that request) for anything else: codegen_collect
        and codegen_postprocess can be called directly with a row made by hand."""
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as e:
            raise BadInput(f"generation_params is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise BadInput("generation_params must be a JSON object")
        if unknown := sorted(set(data) - set(FIELD_KINDS)):
            raise BadInput(f"generation_params has unknown keys {unknown}; known: {sorted(FIELD_KINDS)}")
        for key, value in data.items():
            _check_field(key, value)
        data["stop"] = tuple(data.get("stop", ()))
        return cls(**data)

    def generator_arrays(self) -> dict[str, np.ndarray]:
        """codegen_generator's inputs for these parameters (besides input_ids and input_lengths)."""
        arrays = {"request_output_len": np.array([[self.max_tokens]], np.int32),
                  "temperature": np.array([[self.temperature]], np.float32),
                  "runtime_top_k": np.array([[self.top_k]], np.int32),
                  "runtime_top_p": np.array([[self.top_p]], np.float32)}
        if self.seed is not None:
            arrays["random_seed"] = np.array([[self.seed]], np.uint64)
        if self.stop:
            arrays["stop_words"] = np.array([[w.encode("utf-8") for w in self.stop]], dtype=np.object_)
        if self.logprobs is not None:
            arrays["logprobs"] = np.array([[self.logprobs]], np.int32)
            arrays["prompt_logprobs"] = np.array([[self.prompt_logprobs]], bool)
        if self.heal_prefix:
            arrays["heal_prefix"] = np.array([[self.heal_prefix.encode("utf-8")]], dtype=np.object_)
        return arrays


# what each key of the JSON row holds: "int" and "number" as _number reads them, or a Python type
FIELD_KINDS = {"max_tokens": "int", "temperature": "number", "top_k": "int", "top_p": "number", "seed": "int",
               "stop": list, "exclude_input": bool, "logprobs": "int", "token_healing": bool, "heal_prefix": str}
OPTIONAL_FIELDS = ("seed", "logprobs")  # may be null


def _check_field(key: str, value) -> None:
    kind = FIELD_KINDS[key]
    if value is None and key in OPTIONAL_FIELDS:
        return
    if kind in ("int", "number"):
        try:
            _number(value, key, integer=kind == "int")
        except BadInput:
            raise BadInput(f"generation_params '{key}' must be {'an integer' if kind == 'int' else 'a finite number'}"
                           f", got {value!r}") from None
    elif not isinstance(value, kind) or (kind is list and not all(isinstance(w, str) for w in value)):
        raise BadInput(f"generation_params '{key}' must be {'a list of strings' if kind is list else kind.__name__}"
                       f", got {value!r}")


def _number(value, key: str, integer: bool):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise BadInput(f"sampling_parameters '{key}' must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise BadInput(f"sampling_parameters '{key}' must be finite, got {value!r}")
    return int(value) if integer else float(value)


def parse_sampling_parameters(text: str) -> dict:
    """The JSON object of NVIDIA's OpenAI frontend, as keyword arguments of GenerationParams."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise BadInput(f"sampling_parameters is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadInput("sampling_parameters must be a JSON object")
    unknown = sorted(set(data) - set(SAMPLING_KEYS))
    if unknown:
        raise BadInput(f"sampling_parameters has unsupported keys {unknown}; supported: {list(SAMPLING_KEYS)}")
    out: dict = {}
    for key in ("temperature", "top_p"):
        if data.get(key) is not None:
            out[key] = _number(data[key], key, integer=False)
    for key in ("top_k", "max_tokens"):
        if data.get(key) is not None:
            out[key] = _number(data[key], key, integer=True)
    if data.get("top_k") == -1:  # vLLM's "no limit"
        out["top_k"] = 0
    if data.get("seed") is not None:
        seed = _number(data["seed"], "seed", integer=True)
        if not 0 <= seed <= MAX_SEED:
            raise BadInput(f"sampling_parameters 'seed' must be between 0 and {MAX_SEED}, got {seed}")
        out["seed"] = seed
    stop = data.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(w, str) for w in stop):
            raise BadInput("sampling_parameters 'stop' must be a string or a list of strings")
        out["stop"] = tuple(w for w in stop if w)
    return out
