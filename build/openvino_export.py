"""The generator's GPT-J as OpenVINO IR (issue 42): `make model` writes it beside the transformers weights, into
codegen_generator/1/openvino/, where the generator's OpenVINO engine loads it.

fp32 weights by default; CODEGEN_WEIGHTS=int8 or int4 compresses them at export (NNCF, data-free: int8
asymmetric per output channel, as `optimum-cli export openvino --weight-format int8`; int4 symmetric in groups).
Inference runs in f32 either way (the engine sets it: this CPU family would default to bf16).

The export tools (optimum-intel, optimum, nncf) live in .export-tools/, outside .venv (launcher/setup.sh says
why), so the export runs in a child process with them on its path: `python -m build.openvino_export SRC DEST
WEIGHTS`. Its result is kept in the machine's cache of built models (build/model_cache.py:
$XDG_CACHE_HOME/triton-pipelines/openvino/gptj-<weights>/<key>/), the key covering the source weights' bytes, this
file, the weight format and the versions of every library that writes the IR: the same inputs give the same
bytes, so `make model` in any clone of the machine copies the cached IR instead of exporting again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from build import model_cache

ROOT = Path(__file__).resolve().parent.parent
EXPORT_TOOLS = ROOT / ".export-tools"
CACHE_KIND = "openvino"  # build/model_cache.py's folder for the IR
IR_FOLDER = "openvino"  # inside the generator's version folder (backends/gptj_generator/loading.py reads it)
WEIGHTS_ENV = "CODEGEN_WEIGHTS"
WEIGHT_FORMATS = ("fp32", "int8", "int4")
SOURCE_FILES = ("config.json", "generation_config.json")  # + every *.safetensors
INT4_GROUP = 64  # columns per int4 scale: divides every width here (64 in the hub test layout, 128, 1024)
INFO_FILE = "export.json"  # what the IR is: weight format, the source's digest


def weight_format() -> str:
    weights = os.environ.get(WEIGHTS_ENV, "fp32")
    if weights not in WEIGHT_FORMATS:
        raise SystemExit(f"{WEIGHTS_ENV}={weights!r}: choose one of {list(WEIGHT_FORMATS)}")
    return weights


def _source_files(src: Path) -> list[Path]:
    files = [src / name for name in SOURCE_FILES if (src / name).exists()] + sorted(src.glob("*.safetensors"))
    if not any(f.suffix == ".safetensors" for f in files):
        raise FileNotFoundError(f"no *.safetensors in {src}: save the model with safe_serialization first")
    return files


def source_digest(src: Path) -> str:
    h = hashlib.sha256()
    for path in _source_files(src):
        h.update(path.name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def _library_versions() -> list[str]:
    """The libraries that shape the IR: in .venv (openvino, torch, transformers) and in .export-tools."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("openvino", "torch", "transformers"):
        try:
            found.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            found.append(package)
    found += sorted(p.name for p in EXPORT_TOOLS.glob("*.dist-info"))
    return found


def cache_key(src: Path, weights: str) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(weights.encode())
    h.update(source_digest(src).encode())
    h.update("\n".join(_library_versions()).encode())
    return h.hexdigest()[:32]


def export(src: Path, dest: Path, weights: str = "fp32") -> Path:
    """The model saved in `src` as OpenVINO IR in `dest` (emptied first): from the cache, or exported there."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights {weights!r}: choose one of {list(WEIGHT_FORMATS)}")
    name, key = f"gptj-{weights}", cache_key(Path(src), weights)
    shutil.rmtree(dest, ignore_errors=True)
    Path(dest).mkdir(parents=True)
    if model_cache.fetch(CACHE_KIND, name, key, Path(dest)):
        print(f"  OpenVINO IR ({weights}) reused from {model_cache.entry(CACHE_KIND, name, key)}/", flush=True)
        return dest
    if not (EXPORT_TOOLS / "optimum").is_dir():
        raise SystemExit(f"{EXPORT_TOOLS} has no export tools: run `make setup`")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXPORT_TOOLS), str(ROOT)])}
    subprocess.run([sys.executable, "-m", "build.openvino_export", str(src), str(dest), weights],
                   cwd=ROOT, env=env, check=True)
    try:
        model_cache.store(CACHE_KIND, name, key, Path(dest))
    except OSError as error:  # a read-only cache costs the next build an export, no more
        print(f"  OpenVINO IR ({weights}) not put in the cache {model_cache.root()}: {error}", flush=True)
    return dest


# ---- the child process (the export tools on its path) ------------------------------------------------------

def _silence_telemetry() -> None:
    """nncf and OpenVINO's converter send usage telemetry unless a consent file says no: nothing `make model`
    runs may reach outside this machine, so their Telemetry class is replaced by one that does nothing."""
    import openvino_telemetry

    class NoTelemetry:
        def __init__(self, *args, **kwargs):
            pass

        def __getattr__(self, name):  # send_event, start_session, force_shutdown, ...: accepted, dropped
            if name.startswith(("send", "start", "end", "force")):
                return lambda *args, **kwargs: None
            raise AttributeError(name)

    openvino_telemetry.Telemetry = NoTelemetry


def quantization(weights: str) -> dict:
    from optimum.intel import OVWeightQuantizationConfig

    if weights == "fp32":  # optimum compresses models over 1B parameters to int8 unless told not to
        return dict(load_in_8bit=False)
    if weights == "int8":
        return dict(quantization_config=OVWeightQuantizationConfig(bits=8, sym=False))
    return dict(quantization_config=OVWeightQuantizationConfig(bits=4, sym=True, group_size=INT4_GROUP, ratio=1.0))


def export_here(src: Path, dest: Path, weights: str) -> None:
    _silence_telemetry()
    from optimum.intel import OVModelForCausalLM

    model = OVModelForCausalLM.from_pretrained(str(src), export=True, compile=False, **quantization(weights))
    model.save_pretrained(str(dest))
    # optimum records the source path there (the artifact would depend on where it was built); the engine
    # does not read it: export.json says what the IR is
    (dest / "openvino_config.json").unlink(missing_ok=True)
    (dest / INFO_FILE).write_text(json.dumps({"weights": weights, "source_sha256": source_digest(src)},
                                             indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    source, target, fmt = sys.argv[1:4]
    export_here(Path(source), Path(target), fmt)
