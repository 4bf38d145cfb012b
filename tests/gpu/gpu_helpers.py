"""What the gpu tests share: the skip where no GPU is visible, the demo models' folders, GPU placements as
Triton would give them, where a stage runs (torch modules, ONNX Runtime sessions), and the rule for greedy
tokens that part between the CPU and the GPU (a near tie on the CPU's logits, once per row, in one row in eight)."""
from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from stage_common.gpu_placement import GpuPlacement

ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = ROOT / "model_repository"
CLIP_DIR = ROOT / "demo_models" / "clip-demo"
CUDA = torch.device("cuda:0")
EMBEDDING_TOLERANCE = 1e-3  # embeddings and CLIP features, L2-normalized, CPU against GPU
LOGIT_TOLERANCE = 5e-3  # of the largest logit: candidates this close on the reference are a near tie
MAX_TIE_ROWS_IN = 8  # at most one row in this many may hold a near tie

# each test module's pytestmark
GPU_TIER = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"no GPU visible: torch.cuda.is_available() is false (torch {torch.__version__})")]


def model_dir(model: str, *needed: str) -> Path:
    """model_repository/<model>/1, skipping the test when `make model` (or gpu_check's carry) left it unbuilt."""
    folder = MODEL_REPOSITORY / model / "1"
    missing = [name for name in needed if not (folder / name).exists()]
    if missing:
        pytest.skip(f"{folder} lacks {', '.join(missing)}: run `make model` (tools/gpu_check.sh installs the carry)")
    return folder


def on_gpu(stage: str) -> GpuPlacement:
    """GPU 0 as Triton's KIND_GPU instance would give it: a runtime that cannot use it refuses (no fallback)."""
    return GpuPlacement(stage, 0)


def onnx_on_gpu_or_skip(folder: Path, *files: str) -> None:
    """The ONNX Runtime variant needs onnxruntime-gpu and the exported graphs."""
    import onnxruntime

    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        pytest.skip(f"{folder} lacks {', '.join(missing)} (the ONNX export): runtime onnx not checked")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu: "
                    "make setup GPU=1)")


def runtimes_in(stage, depth: int = 6) -> tuple[list, list]:
    """(torch modules, ONNX Runtime sessions) a stage holds: found through its attributes, containers and its
    functions' closures (the encoder and the classifier keep theirs in a closure)."""
    modules, sessions, seen = [], [], set()

    def visit(thing, left: int) -> None:
        if thing is None or id(thing) in seen or left < 0 or isinstance(thing, (
                str, bytes, int, float, Path, np.ndarray, torch.Tensor, type, types.ModuleType)):
            return
        seen.add(id(thing))
        if isinstance(thing, torch.nn.Module):
            modules.append(thing)
        elif callable(getattr(type(thing), "get_providers", None)):  # onnxruntime.InferenceSession
            sessions.append(thing)
        elif isinstance(thing, dict):
            for value in list(thing.values()):
                visit(value, left - 1)
        elif isinstance(thing, (list, tuple, set)):
            for value in list(thing):
                visit(value, left - 1)
        elif isinstance(thing, types.FunctionType):
            for cell in thing.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # a cell not assigned yet
                    continue
                visit(value, left - 1)
        elif hasattr(thing, "__dict__"):
            for value in list(vars(thing).values()):  # a copy: an engine's thread may change it meanwhile
                visit(value, left - 1)

    visit(stage, depth)
    return modules, sessions


def assert_on_gpu(name: str, stage, device: torch.device = CUDA) -> None:
    """Every ONNX Runtime session the stage holds has CUDAExecutionProvider first; every torch module's
    parameters and buffers are on `device`; and it holds at least one of them (else there is nothing to check)."""
    modules, sessions = runtimes_in(stage)
    assert modules or sessions, f"{name}: no torch module or ONNX Runtime session found in {type(stage).__name__}"
    for session in sessions:
        providers = session.get_providers()
        assert providers[:1] == ["CUDAExecutionProvider"], f"{name}: an ONNX Runtime session runs on {providers}"
    for module in modules:
        devices = {t.device for t in (*module.parameters(), *module.buffers())}
        assert devices == {device}, f"{name}: {type(module).__name__}'s tensors are on {devices}, not {device}"


def gpu_memory_grows(name: str, call: Callable, device: torch.device = CUDA, cuda=torch.cuda):
    """call()'s result, failing unless the GPU's allocator took memory during it: the torch stage's forward ran
    there (its weights alone being there shows nothing). ONNX Runtime's allocations are its own: torch only."""
    cuda.synchronize(device)
    cuda.reset_peak_memory_stats(device)
    before = cuda.memory_allocated(device)
    result = call()
    cuda.synchronize(device)
    peak = cuda.max_memory_allocated(device)
    assert peak > before, f"{name}: no memory allocated on {device} during the call ({before} bytes before, " \
                          f"peak {peak}): it did not compute there"
    return result


def max_difference(cpu: np.ndarray, gpu: np.ndarray) -> float:
    assert cpu.shape == gpu.shape, (cpu.shape, gpu.shape)
    return float(np.abs(cpu.astype(np.float64) - gpu.astype(np.float64)).max(initial=0.0))


def normalized(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (one ending early counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tie_bound(reference: np.ndarray) -> float:
    """How far below the reference's top logit a candidate may be and still count as a near tie."""
    return LOGIT_TOLERANCE * max(1.0, float(np.abs(reference).max(initial=0.0)))


def divergence(position: int, cpu_ids: list[int], gpu_ids: list[int], cpu_logits: np.ndarray,
               gpu_logits: np.ndarray, end_token: int | None = None) -> tuple[bool, str]:
    """(near tie, report) for greedy tokens that part at `position`, given both devices' logits after the CPU's
    tokens before it. The CPU is the reference: the flip is a near tie only when, on the reference's logits,
    both candidates (the CPU's token and the GPU's) lie within `tie_bound` of the top. Identical logits on both
    devices do not excuse a flip between tokens that the reference ranks far apart: a GPU that picks a clearly
    worse token computed something else. A list that ended there chose `end_token` (the engine does not
    deliver its end-of-sequence token); without one, an early end is no tie."""
    a = cpu_ids[position] if position < len(cpu_ids) else end_token
    b = gpu_ids[position] if position < len(gpu_ids) else end_token
    bound = tie_bound(cpu_logits)
    top = float(cpu_logits.max(initial=-np.inf))
    near_tie = a is not None and b is not None and all(top - float(cpu_logits[t]) <= bound for t in (a, b))

    def best(logits: np.ndarray) -> str:
        return ", ".join(f"{i}:{logits[i]:.6f}" for i in np.argsort(-logits)[:3])

    report = (f"tokens part at position {position}: cpu {a}, gpu {b}; tie bound {bound:.2e} below the cpu's top "
              f"{top:.6f}; cpu logits [{a}]={_at(cpu_logits, a)} [{b}]={_at(cpu_logits, b)} top {best(cpu_logits)}; "
              f"gpu logits [{a}]={_at(gpu_logits, a)} [{b}]={_at(gpu_logits, b)} top {best(gpu_logits)} "
              f"(largest logit difference {max_difference(cpu_logits, gpu_logits):.2e})")
    return near_tie, report


def _at(logits: np.ndarray, token: int | None) -> str:
    return "-" if token is None else f"{logits[token]:.6f}"


@dataclass
class Row:
    """One sequence greedily decoded on both devices. `logits_at(position) -> (cpu_logits, gpu_logits)`: each
    device's next-token logits after the CPU's tokens before `position` (teacher forced on the reference).
    Positions before `first_new` are the prompt, not generated."""
    name: str
    cpu_ids: list[int]
    gpu_ids: list[int]
    logits_at: Callable[[int], tuple[np.ndarray, np.ndarray]]
    first_new: int = 0


def row_ties(row: Row, end_token: int | None = None) -> list[str]:
    """The reports of the positions where the devices part in `row`: where the free-running tokens first part,
    and every generated position where the GPU, fed the CPU's tokens, would pick another token than the CPU
    did. Each must be a near tie (`divergence`), and a row may hold one; else pytest.fail with the reports."""
    parted: dict[int, tuple[bool, str]] = {}
    first = first_difference(row.cpu_ids, row.gpu_ids)
    if first is not None:
        parted[first] = divergence(first, row.cpu_ids, row.gpu_ids, *row.logits_at(first), end_token)
    for position in range(row.first_new, len(row.cpu_ids)):
        if position == first:
            continue
        cpu_logits, gpu_logits = row.logits_at(position)
        choice = int(np.argmax(gpu_logits))
        if choice != row.cpu_ids[position]:
            forced = row.cpu_ids[:position] + [choice]
            parted[position] = divergence(position, row.cpu_ids, forced, cpu_logits, gpu_logits, end_token)
    ordered = sorted(parted.items())
    refused = [f"{row.name}: {report}" for _, (near, report) in ordered if not near]
    if refused:
        pytest.fail("not a near tie: " + "; ".join(refused))
    reports = [f"{row.name}: {report}" for _, (_, report) in ordered]
    if len(parted) > 1:
        pytest.fail(f"{len(parted)} positions part in one row (at most one near tie per row): " + "; ".join(reports))
    return reports


def check_rows(rows: list[Row], end_token: int | None = None) -> None:
    """Every row's tokens equal on both devices, or parted once at a near tie (`row_ties`); at most one row in
    MAX_TIE_ROWS_IN may hold a tie (so a batch under that many rows may hold none). Accepted ties are warnings."""
    import warnings

    tied = [reports[0] for reports in (row_ties(row, end_token) for row in rows) if reports]
    allowed = len(rows) // MAX_TIE_ROWS_IN
    if len(tied) > allowed:
        pytest.fail(f"{len(tied)} of {len(rows)} rows hold a near tie (at most {allowed}: one row in "
                    f"{MAX_TIE_ROWS_IN}): " + "; ".join(tied))
    for report in tied:
        warnings.warn(f"a near tie, {report}")
