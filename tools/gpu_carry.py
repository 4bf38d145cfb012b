"""What tools/gpu_check.sh needs on a GPU machine that has Python 3.12 and torch with CUDA but no network and no
Triton, carried in at most 60 MiB: `gather` packs it here (into .gpu-carry/), `install` unpacks it there.

Carried (docs/deployment.md, "Checking a GPU node", lists the sizes):
- triton.tar.xz: Triton 2.51 out of the nvidia-pytriton wheel installed in .venv: the server and its libraries,
  the Python backend, the Python 3.12 stub, and an empty `pytriton` package so that launcher/triton_server.py
  finds them (not the stubs for other Pythons, nor the wheel's libpython3.13).
- site-packages.tar.xz: numpy 1.26.4 for CPython 3.12 and pytest with its own needs. The 2.51 stub fails on string
  tensors with numpy 2, and its embedded Python ignores PYTHONPATH (seen here): `install` makes a venv whose
  site-packages hold these and, after them (a .pth file), the machine's own site-packages; the check runs that venv's
  Python, and Triton's stubs find it first on PATH.
- models.tar.xz: what `make model` built, less what does not fit: every config, tokenizer and small weight file,
  but neither the text encoder's nor the NER tagger's weights (87 and 70 MB) nor any ONNX export (the GPU check
  runs the torch runtime; the GPU machine's onnxruntime is the CPU build).
- MANIFEST.txt: every file with its size.
Made there by `stand-ins`: seeded random weights of the demo encoder's and tagger's shapes where theirs are missing
(STAND_IN.txt in the folder says so): CPU and GPU then run the same weights, which is what the check compares."""
from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpu-carry"
WORK = ROOT / ".gpu-check"
DOWNLOADS = ROOT / ".artifacts" / "gpu-carry-downloads"
BUDGET = 60 * 2**20
PYTHON = "3.12"  # the GPU machine's
NUMPY = "numpy==1.26.4"
PYTEST_PACKAGES = ("pytest", "pluggy", "iniconfig", "pygments")  # pytest's needs but packaging (transformers has it)
ARCHIVES = ("triton.tar.xz", "site-packages.tar.xz", "models.tar.xz")
# too big to carry (text encoder 87 MB, NER tagger 70 MB): stand-ins are made on the GPU machine
STAND_INS = {"model_repository/text_embedding_encoder/1/model.safetensors": "encoder",
             "model_repository/ner_tagger/1/tagger.safetensors": "tagger"}
STAND_IN_SEED = 46
STAND_IN_NOTE = "STAND_IN.txt"


def carried_model_files(root: Path = ROOT) -> list[Path]:
    """The built artifacts that travel: model_repository/*/<version>/ and demo_models/clip-demo/, less the weights
    that get stand-ins, the ONNX exports and OpenVINO IRs (neither runs on the GPU machine)."""
    files = sorted(p for p in (root / "model_repository").glob("*/[0-9]*/**/*") if p.is_file())
    files += sorted(p for p in (root / "demo_models" / "clip-demo").glob("**/*") if p.is_file())
    return [p for p in files if p.relative_to(root).as_posix() not in STAND_INS and p.suffix != ".onnx"
            and "openvino" not in p.relative_to(root).parts and p.name != STAND_IN_NOTE
            and "__pycache__" not in p.parts]


def triton_files(site: Path, python: str = PYTHON) -> list[Path]:
    """The parts of the installed nvidia-pytriton wheel the server needs, relative to its site-packages."""
    server = site / "pytriton" / "tritonserver"
    wanted = [server / "bin" / "tritonserver", *sorted((server / "backends" / "python").iterdir()),
              *sorted(p for p in (server / "caches").rglob("*") if p.is_file()),
              *sorted((server / "python_backend_stubs" / python).iterdir())]
    wanted += sorted(p for p in (site / "nvidia_pytriton.libs").iterdir() if not p.name.startswith("libpython3"))
    return [p.relative_to(site) for p in wanted if p.is_file() and "__pycache__" not in p.parts]


def write_archive(path: Path, members: list[tuple[str, Path | bytes]]) -> None:
    """A tar.xz of (name in the archive, file or bytes), modes kept (the server binary stays executable)."""
    with tarfile.open(path, "w:xz", preset=9) as tar:
        for name, source in members:
            if isinstance(source, bytes):
                info = tarfile.TarInfo(name)
                info.size = len(source)
                tar.addfile(info, io.BytesIO(source))
            else:
                tar.add(source, arcname=name, recursive=False)


def download(requirements: list[str], python: str | None = None) -> list[Path]:
    """Wheels from PyPI (cached in .artifacts/), for `python` when given (binary wheels of another CPython)."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", python, "--platform", "manylinux2014_x86_64"] if python else []
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "-d", str(DOWNLOADS), *target, *requirements], check=True)
    prefixes = tuple(r.lower().replace("-", "_").replace("==", "-") + "-" for r in requirements)
    tag = f"-cp{python.replace('.', '')}-" if python else "-py3-"
    return sorted(p for p in DOWNLOADS.glob("*.whl") if p.name.lower().startswith(prefixes) and tag in p.name)


def wheel_members(wheels: list[Path]) -> list[tuple[str, bytes]]:
    """Every file of the wheels as it lies in site-packages, less their test suites."""
    members = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                parts = Path(info.filename).parts
                if info.is_dir() or "tests" in parts[1:]:
                    continue
                members.append((info.filename, archive.read(info)))
    return members


def gather(out: Path = CARRY) -> int:
    import pytriton

    out.mkdir(parents=True, exist_ok=True)
    site = Path(pytriton.__file__).parent.parent
    empty_package = b'"""Only the Triton server of nvidia-pytriton, carried by tools/gpu_carry.py."""\n'
    write_archive(out / "triton.tar.xz", [("pytriton/__init__.py", empty_package)]
                  + [(p.as_posix(), site / p) for p in triton_files(site)])
    pinned = [f"{name}=={metadata.version(name)}" for name in PYTEST_PACKAGES]
    wheels = download([NUMPY], PYTHON) + download(pinned)
    write_archive(out / "site-packages.tar.xz", wheel_members(wheels))
    write_archive(out / "models.tar.xz", [(p.relative_to(ROOT).as_posix(), p) for p in carried_model_files()])
    total = write_manifest(out)
    print(f"gpu_carry: {out}: {total / 2**20:.1f} MiB (budget {BUDGET / 2**20:.0f} MiB)")
    if total > BUDGET:
        print("gpu_carry: over budget", file=sys.stderr)
        return 1
    return 0


def write_manifest(out: Path) -> int:
    lines, total = [], 0
    for name in ARCHIVES:
        size = (out / name).stat().st_size
        total += size
        lines.append(f"{name}  {size / 2**20:.2f} MiB")
        with tarfile.open(out / name) as tar:
            lines += [f"    {m.name}  {m.size / 2**20:.2f} MiB" for m in tar.getmembers() if m.isfile()]
    lines.append(f"total  {total / 2**20:.2f} MiB of {BUDGET / 2**20:.0f} MiB")
    (out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    return total + (out / "MANIFEST.txt").stat().st_size


def extract(archive: Path, dest: Path, keep_existing: bool = False) -> list[str]:
    """Unpacks `archive` into `dest` (files already there are left alone with keep_existing); returns the names
    written. Names are checked to stay inside `dest`."""
    written = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise ValueError(f"{archive}: {member.name} would land outside {dest}")
            if keep_existing and target.exists():
                continue
            tar.extract(member, dest, filter="tar")
            written.append(member.name)
    return written


def stub_serves_this_python(stub: Path) -> bool:
    """Whether backends/python's stub embeds this interpreter's libpython (make setup copied another's)."""
    version = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so".encode()
    return stub.is_file() and version in stub.read_bytes()


def install_backend(triton_site: Path, backends: Path = ROOT / "backends" / "python") -> bool:
    """backends/python/ from the carried Triton, unless it already holds a stub for this Python."""
    if stub_serves_this_python(backends / "triton_python_backend_stub"):
        return False
    server = triton_site / "pytriton" / "tritonserver"
    stub = server / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    backends.mkdir(parents=True, exist_ok=True)
    for source in [*(server / "backends" / "python").iterdir(), stub / "triton_python_backend_stub"]:
        if source.is_file():
            shutil.copy2(source, backends / source.name)
    return True


def make_stand_ins(root: Path = ROOT) -> list[str]:
    """Seeded random weights of the demo's shapes where the encoder's or the tagger's are missing."""
    made = []
    for relative, kind in STAND_INS.items():
        path = root / relative
        if path.exists():
            continue
        (stand_in_encoder if kind == "encoder" else stand_in_tagger)(path.parent)
        (path.parent / STAND_IN_NOTE).write_text(
            f"{path.name}: random weights (torch seed {STAND_IN_SEED}) of the demo model's shapes, made by "
            "tools/gpu_carry.py install: the demo's own weights are too big to carry to a GPU machine.\n")
        made.append(relative)
    return made


def stand_in_encoder(folder: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(STAND_IN_SEED)
    model = AutoModel.from_config(AutoConfig.from_pretrained(str(folder)))
    model.save_pretrained(str(folder), safe_serialization=True)


def stand_in_tagger(folder: Path) -> None:
    """The plain-torch tagger of backends/ner_tagger/ at its config's shapes, its char LMs widened as
    build/ner.py widens the demo's (the default init gives near-constant LM states)."""
    import torch
    from safetensors.torch import save_file

    from build.ner import CHAR_EMBEDDING_SCALE, CHAR_INPUT_SCALE, CHAR_RECURRENT_SCALE
    from ner_tagger.tagger import NerTagger

    torch.manual_seed(STAND_IN_SEED)
    model = NerTagger(json.loads((folder / "tagger_config.json").read_text()))
    with torch.no_grad():
        for direction in model.lm_order:
            lm = getattr(model, f"char_lm_{direction}")
            lm.encoder.weight.mul_(CHAR_EMBEDDING_SCALE)
            lm.rnn.weight_ih_l0.mul_(CHAR_INPUT_SCALE)
            lm.rnn.weight_hh_l0.mul_(CHAR_RECURRENT_SCALE)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "tagger.safetensors"))


def outer_site_packages() -> list[str]:
    """This interpreter's package folders (a system Python's, a venv's or a conda env's)."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def make_check_venv(venv: Path, after: list[str]) -> Path:
    """A venv of this interpreter whose own site-packages come first and `after` next (a .pth file): its
    packages win over the machine's, and everything else is the machine's. Returns its site-packages."""
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "_gpu_check_outer.pth").write_text("".join(f"{p}\n" for p in after))
    return site


def install(carry: Path = CARRY, work: Path = WORK, root: Path = ROOT) -> int:
    """Triton into .gpu-check/triton, the check's venv (.gpu-check/venv: numpy<2 and pytest, then this Python's
    packages and the carried Triton), the models where `make model` would have put them (a model built here is
    kept), and backends/python/ for this Python."""
    for name in ARCHIVES:
        if not (carry / name).is_file():
            print(f"gpu_carry: {carry / name} is missing (run `tools/gpu_carry.py gather` where there is a network)",
                  file=sys.stderr)
            return 1
    triton = work / "triton"
    if triton.exists():
        shutil.rmtree(triton)
    triton.mkdir(parents=True)
    extract(carry / "triton.tar.xz", triton)
    site = make_check_venv(work / "venv", outer_site_packages() + [str(triton.resolve())])
    extract(carry / "site-packages.tar.xz", site)
    models = extract(carry / "models.tar.xz", root, keep_existing=True)
    print(f"gpu_carry: {len(models)} model files installed, Triton in {triton}, the check's Python is "
          f"{work / 'venv' / 'bin' / 'python'}")
    if install_backend(triton, root / "backends" / "python"):
        print(f"gpu_carry: backends/python/ now serves Python {sys.version_info.major}.{sys.version_info.minor}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["gather", "install", "stand-ins", "manifest"])
    parser.add_argument("--carry", type=Path, default=CARRY, help="the carried folder (default .gpu-carry/)")
    parser.add_argument("--work", type=Path, default=WORK, help="where install unpacks (default .gpu-check/)")
    args = parser.parse_args()
    if args.step == "gather":
        return gather(args.carry)
    if args.step == "install":
        return install(args.carry, args.work)
    if args.step == "manifest":
        print(f"{write_manifest(args.carry) / 2**20:.2f} MiB")
        return 0
    made = make_stand_ins()
    print(f"gpu_carry: stand-in weights made for {made}" if made else "gpu_carry: no stand-in needed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
