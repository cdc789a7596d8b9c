"""Every command that reads a file, over every malicious sample of the scan corpus.

For each sample: no command runs its payload (the marker never appears), every command that
would load the file refuses it (exit 10, or 3 for the samples the corpus grades "error"), with
``--trust`` as without, and nothing is written to any output path. ``info`` never loads: it is
only held to the marker. Commands run in-process; a refused command costs one scan, so the whole
matrix takes seconds once the scanner flags every sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.scan_corpus import malicious_corpus
from tests.conftest import run_cli
from tests.scan.test_corpus import REFUSED, TECHNIQUES

MODEL = "fixtures.models:MLP"  # lets program targets, verify and bench reach loading the file
TRUST = ["--trust"]


def commands(src: str, out: Path) -> dict[str, list[str]]:
    """Label → argv for every command over ``src``, outputs under ``out``."""
    model = ["--model", MODEL]
    got: dict[str, list[str]] = {"info": ["info", src], "scan": ["scan", src]}
    for to in ("safetensors", "pt", "torchscript", "pt2", "onnx", "aoti"):
        extra = [*model, "--no-verify"] if to not in ("safetensors", "pt") else []
        for trust in ([], TRUST):
            label = f"--to {to}{' --trust' if trust else ''}"
            dest = out / f"{to}{'-trust' if trust else ''}.out"
            got[label] = [src, "--to", to, "-o", str(dest), *extra, *trust]
    got["plan --to pt2"] = ["plan", src, "--to", "pt2", *model]
    for trust in ([], TRUST):
        tag = " --trust" if trust else ""
        got[f"verify{tag}"] = ["verify", src, src, *model, "--batch-sizes", "1", *trust]
        bench = ["--compile-mode", "none", "--repeats", "1", "--warmup", "0", "--batch-sizes", "1"]
        got[f"bench{tag}"] = ["bench", src, *model, *bench, *trust]
    return got


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    marker = tmp_path_factory.mktemp("commands-marker") / "PAYLOAD_RAN"
    return malicious_corpus(tmp_path_factory.mktemp("commands-corpus"), marker), marker


@pytest.mark.parametrize("name", TECHNIQUES)
def test_every_command_refuses_every_sample(corpus, name: str, tmp_path: Path, capsys) -> None:
    paths, marker = corpus
    src = str(paths[name])
    expected = {"error": 3}.get(REFUSED.get(name, "dangerous"), 10)
    out = tmp_path / "out"
    out.mkdir()
    wrong: dict[str, str] = {}
    for label, argv in commands(src, out).items():
        try:
            code, body, _ = run_cli(argv, capsys)
        except json.JSONDecodeError as exc:  # a command must print JSON only under --json
            code, body = -1, {"error": {"message": f"output is not JSON: {exc}"}}
        if marker.exists():
            wrong[label] = "RAN THE PAYLOAD"
            marker.unlink()  # judge the next command on its own
            continue
        if label == "info":
            continue  # describes without loading: its exit code says nothing about safety
        if code != expected:
            why = body.get("error", body) if isinstance(body, dict) else body
            why = why.get("message", why) if isinstance(why, dict) else why
            wrong[label] = f"exit {code}: {str(why)[:160]}"
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert wrong == {} and written == [], (wrong, written)


def test_torchscript_code_under_a_models_folder_is_not_a_pt2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transformers model's TorchScript code lives in code/__torch__/…/models/…: that is not a
    pt2 archive, and its weight bytes (here shaped like a pickle with an EXT4 opcode) are data."""
    import torch

    package = tmp_path / "zoo" / "models"
    package.mkdir(parents=True)
    (tmp_path / "zoo" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "net.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.register_buffer('table', torch.tensor([0x80, 2, 0x84, 1, 0, 0, 0, 0x2E],"
        " dtype=torch.uint8))\n"
        "    def forward(self, x):\n"
        "        return x + self.table.float().sum()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from zoo.models.net import Net  # type: ignore[import-not-found]

    torch.jit.script(Net()).save(str(tmp_path / "net.ts"))
    from ptconvert.scan.scanner import scan_file

    result = scan_file(tmp_path / "net.ts")
    assert result.verdict == "clean", result.findings


@pytest.mark.slow  # ~3 minutes: every trusted command starts its load probe
def test_no_command_runs_the_code_of_a_class_trust_rebuilds(tmp_path: Path, capsys) -> None:
    """The issue-38 samples whose payload is a class's own code (needs-code by the scan): every
    command, with and without --trust, and --allow of that class, never runs it."""
    from fixtures.trust_corpus import OWN_CODE, own_code_samples

    marker = tmp_path / "PAYLOAD_RAN"
    samples = own_code_samples(tmp_path / "samples", marker)
    allow = [a for cls in OWN_CODE for a in ("--allow", cls)]
    ran = {}
    for name, path in samples.items():
        out = tmp_path / name.replace(".", "-")
        out.mkdir()
        for label, argv in commands(str(path), out).items():
            extra = allow if "--trust" in argv else []
            run_cli([*argv, *extra], capsys)
            if marker.exists():
                ran[f"{name}: {label}"] = True
                marker.unlink()
    assert ran == {}
