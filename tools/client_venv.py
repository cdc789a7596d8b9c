"""Build what the runtimes' own clients need, outside ``.venv``: one venv and one C++ loader.

- **The clients' venv** (default ``.venv-optimum`` at the repo root): optimum's ONNX exporter
  (``benchmarks/onnx.py``) and its ``ORTModelFor…`` classes (``tests/clients``), which need an
  older transformers than this project's (optimum-onnx 0.1.0 wants transformers < 4.58). Made
  with ``python -m venv`` and ``pip install -c`` of ``OPTIMUM_PINS`` (torch as constraints.txt
  pins it: the CPU build, which pip must resolve 2.13.0 to: a torch that pulls CUDA packages is
  refused before any download). A stamp file holding the pins and the package list makes a
  rerun reuse the venv; ``rm -r .venv-optimum`` builds it again.
- **The C++ loader** (``.clients/loader``, from ``tests/clients/loader.cpp``): compiled with g++
  against the libtorch inside that venv's torch wheel (its headers and ``lib/``, rpath to it,
  ``_GLIBCXX_USE_CXX11_ABI`` as the wheel says); it runs a TorchScript file
  (``torch::jit::load``), an AOTInductor package (``AOTIModelPackageLoader``) or a greedy loop
  over a generation package. A stamp holding the source's hash and the command makes a rerun
  compile only when either changed.
- **llama.cpp's libraries** (``.clients/llama.cpp``): the venv's ``llama-cpp-py-sync`` wheel
  (llama.cpp b11739 prebuilt, CFFI bindings: llama.cpp's runtime without a 30-minute source
  build) holds libraries linked against glibc 2.38; ``tools/llama_cpp_fit.py`` copies them
  there, made loadable by this machine's glibc (the wheel stays as installed). It lives in this
  one venv rather than one of its own: its only dependencies (cffi, numpy) sit beside
  optimum's pins, and one venv keeps one stamp and one build.

Run: ``.venv/bin/python tools/client_venv.py [--venv DIR] [--loader PATH] [--no-loader]``
(``make test-clients`` does, then runs ``pytest -m clients``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

# imported as tools.client_venv (the tests) or run as a script (its folder first on sys.path)
if __package__:
    from tools import llama_cpp_fit
else:
    import llama_cpp_fit

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv-optimum"
LOADER = REPO / ".clients" / "loader"
LOADER_SOURCE = REPO / "tests" / "clients" / "loader.cpp"
LLAMA_CPP = REPO / ".clients" / "llama.cpp"

# The set that installs and exports together (optimum-onnx 0.1.0 wants optimum~=2.1.0 and
# transformers<4.58; optimum 2.3's CLI has no `export onnx` without it). accelerate enables
# optimum's tied-weight deduplication check, which it skips (with a warning) otherwise.
OPTIMUM_PINS = {
    "torch": "2.13.0",
    "optimum": "2.1.0",
    "optimum-onnx": "0.1.0",
    "transformers": "4.57.6",
    "tokenizers": "0.22.2",
    "huggingface_hub": "0.36.2",
    "onnx": "1.23.2",
    "onnxruntime": "1.32.0",
    "accelerate": "1.16.0",
    "numpy": "2.4.6",
    # llama.cpp's runtime (b11739's prebuilt libllama/libggml-cpu with CFFI bindings): the
    # clients' tests load what --to gguf writes in llama.cpp itself; see tools/llama_cpp_fit.py
    "llama-cpp-py-sync": "0.11739",
    "cffi": "2.1.1",
    "pycparser": "3.12",
    "certifi": "2026.10.19.post1",
}
# optimum-onnx[onnxruntime] brings the ORTModel classes; pytest runs nothing there (the tests
# run in .venv and start the venv's python on scripts of their own)
INSTALL = [
    "torch",
    "optimum-onnx[onnxruntime]",
    "transformers",
    "onnx",
    "onnxruntime",
    "accelerate",
    "llama-cpp-py-sync",
]
STAMP = ".clients-stamp"


def pip_constraints(venv: Path) -> Path:
    path = venv / "clients-constraints.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in OPTIMUM_PINS.items()))
    return path


def check_cpu_torch(python: Path, constraints: Path) -> None:
    """Refuse before downloading when pip would resolve torch to a build with CUDA packages
    (the default on PyPI for Linux: gigabytes); the project's machines resolve the pin to the
    CPU build, as `make setup` relies on."""
    report = constraints.with_name("torch-resolve.json")
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--report",
            report,
            "-c",
            constraints,
            "torch",
        ],
        check=True,
    )
    (item,) = json.loads(report.read_text())["install"]
    meta = item["metadata"]
    if any(r.lower().startswith("nvidia") for r in meta.get("requires_dist") or []):
        raise SystemExit(
            f"pip resolves torch=={OPTIMUM_PINS['torch']} to a CUDA build ({meta['version']}): "
            "make a CPU build reachable (pip's --find-links or an extra index holding "
            f"torch {OPTIMUM_PINS['torch']}+cpu) and run again"
        )


def venv_wanted() -> str:
    """What the venv's stamp holds once it is built as this module says."""
    return json.dumps({"pins": OPTIMUM_PINS, "install": INSTALL}, sort_keys=True)


def venv_ready(venv: Path = VENV) -> bool:
    stamp = venv / STAMP
    python = venv / "bin" / "python"
    return stamp.is_file() and stamp.read_text() == venv_wanted() and python.exists()


def setup_venv(venv: Path = VENV) -> Path:
    """The clients' venv, made or reused; returns its python."""
    venv = venv.resolve()
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    want = venv_wanted()
    if venv_ready(venv):
        return python
    if not python.exists():
        print(f"creating {venv} (optimum's exporter and ORTModel classes, transformers 4.57)")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    constraints = pip_constraints(venv)
    check_cpu_torch(python, constraints)
    print(f"installing into {venv}: {' '.join(INSTALL)} (pinned)", flush=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", constraints, *INSTALL],
        check=True,
    )
    probe = "import torch; assert torch.version.cuda is None, torch.__version__"
    subprocess.run([python, "-c", probe], check=True)
    stamp.write_text(want)
    return python


TORCH_PATHS = """
import json, os, torch
root = os.path.dirname(torch.__file__)
print(json.dumps({
    "include": [os.path.join(root, "include"),
                os.path.join(root, "include", "torch", "csrc", "api", "include")],
    "lib": os.path.join(root, "lib"),
    "abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
}))
"""


def loader_command(python: Path, source: Path, out: Path) -> list[str]:
    """g++'s command line for the loader, against the libtorch of ``python``'s torch wheel."""
    found = subprocess.run([python, "-c", TORCH_PATHS], check=True, capture_output=True, text=True)
    paths = json.loads(found.stdout)
    lib = paths["lib"]
    return [
        "g++",
        "-std=c++20",
        "-O1",
        f"-D_GLIBCXX_USE_CXX11_ABI={paths['abi']}",
        *(f"-I{p}" for p in paths["include"]),
        str(source),
        "-o",
        str(out),
        f"-L{lib}",
        f"-Wl,-rpath,{lib}",
        "-Wl,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
    ]


def loader_wanted(python: Path, source: Path, out: Path) -> tuple[list[str], str]:
    """g++'s command, and what the loader's stamp holds once it is compiled by it."""
    command = loader_command(python, source, out)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    return command, json.dumps({"source": digest, "command": command})


def loader_ready(python: Path, source: Path = LOADER_SOURCE, out: Path = LOADER) -> bool:
    stamp = out.with_name(out.name + ".stamp")
    want = loader_wanted(python, source, out)[1]
    return out.exists() and stamp.is_file() and stamp.read_text() == want


def build_loader(python: Path, source: Path = LOADER_SOURCE, out: Path = LOADER) -> Path:
    """The C++ loader, compiled when its source or its command changed; returns its path."""
    command, want = loader_wanted(python, source, out)
    stamp = out.with_name(out.name + ".stamp")
    if out.exists() and stamp.is_file() and stamp.read_text() == want:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    print(f"compiling {out} against {python}'s libtorch", flush=True)
    print(shlex.join(command), flush=True)
    subprocess.run(command, check=True)
    stamp.write_text(want)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--venv", type=Path, default=VENV, help="the clients' venv")
    ap.add_argument("--loader", type=Path, default=LOADER, help="the compiled C++ loader")
    ap.add_argument("--no-loader", action="store_true", help="build the venv only")
    ap.add_argument(
        "--llama-cpp", type=Path, default=LLAMA_CPP, help="llama.cpp's libraries, fitted here"
    )
    args = ap.parse_args()
    python = setup_venv(args.venv)
    print(f"clients' venv: {python.parent.parent}")
    print(f"llama.cpp's libraries: {llama_cpp_fit.fit(python, args.llama_cpp.resolve())}")
    if not args.no_loader:
        print(f"C++ loader: {build_loader(python, out=args.loader.resolve())}")


if __name__ == "__main__":
    main()
