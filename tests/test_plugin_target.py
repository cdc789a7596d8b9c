"""A program target added from outside the package, with no change inside it: one format (its
detection, ``info``, ``open`` and the edge that writes it) registered by a plugin's entry point.
``plan``, ``convert`` (checked for parity, loaded in a fresh interpreter as its user loads it),
``verify``, ``bench`` and ``--to all`` take it as they take the built-in targets.

The toy program is torch.export's archive with one more member (``toyprog``) that tells it from a
``.pt2``; its own loader reads it from memory (torch.export.load takes only ``.pt2`` names)."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.models import MLP, seeded
from ptconvert.options import flag
from tests.conftest import run_cli

STAMP = "toyprog"
MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]


def _load(path: Path) -> Any:
    return torch.export.load(io.BytesIO(Path(path).read_bytes()))


@dataclass
class ToyOptions:
    """The toy target's own option (``Format.options_class``): what its stamp member holds."""

    toy_stamp: str = field(default="1", metadata=flag("--toy-stamp", help="The stamp's text."))


def _stamp(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(f"/{STAMP}"))).decode()


def _toy_program_format() -> Any:
    from ptconvert.convert.graph import Edge
    from ptconvert.formats.base import FileInfo, Format, Probe, file_entry
    from ptconvert.formats.program import Program, Signature, by_position

    def write(state: Any, opts: Any) -> None:
        torch.export.save(state.exported, state.output)
        with zipfile.ZipFile(state.output, "a") as z:  # beside the archive's own members
            z.writestr(f"{z.namelist()[0].split('/')[0]}/{STAMP}", opts.of(ToyOptions).toy_stamp)

    class ToyProgramFormat(Format):
        name = "toyprog"
        kind = "program"
        suffixes = (".toyprog",)
        holds = "an ExportedProgram stamped as a toy program (a plugin's target)"
        priority = 50  # above the .pt2 archive it also is
        options_class = ToyOptions
        load_line = "import io\nprog = torch.export.load(io.BytesIO(open(p, 'rb').read())).module()"
        warm_line = "import torch"

        def match(self, probe: Probe) -> str | None:
            return "archive" if probe.zip_has(STAMP) else None

        def info(self, path: Path, layout: str) -> FileInfo:
            return FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])

        def open(self, path: Path, device: str = "cpu") -> Program:
            ep = _load(path)
            module = ep.module()
            names = list(ep.graph_signature.user_inputs)  # exported positionally
            call = by_position(module, names)
            return Program(call, Signature(names, names), module=module, exported=ep)

        def edges(self) -> list[Any]:
            label = "torch.export.save, stamped"
            return [Edge("exported", self.name, "toyprog_save", 1, label=label, run=write)]

    return ToyProgramFormat()


def register(registry: Any) -> None:
    registry.add_format(_toy_program_format())


class _EntryPoint:
    name, value = "toyprog", "tests.test_plugin_target:register"

    def load(self) -> Any:
        return register


@pytest.fixture
def toy_target(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The plugin installed (its entry point listed), the registries restored afterwards."""
    import importlib.metadata

    from ptconvert import plugins
    from ptconvert.convert import graph
    from ptconvert.formats import FORMATS, FORMATS_BY_NAME

    saved = (list(FORMATS), dict(FORMATS_BY_NAME), list(graph._PLUGIN_NODES))
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group=None: [_EntryPoint()] if group == plugins.GROUP else [],
    )
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(plugins, "_failed", [])
    yield
    FORMATS[:], graph._PLUGIN_NODES[:] = saved[0], saved[2]
    FORMATS_BY_NAME.clear()
    FORMATS_BY_NAME.update(saved[1])


def test_a_plugin_program_target_is_planned_converted_verified_and_timed(
    toy_target: None, samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(samples["mlp_zip"])
    code, plan, _ = run_cli(["plan", src, "--to", "toyprog", *MLP_ARGS], capsys)
    assert code == 0, plan
    assert [s["step"] for s in plan["steps"]][-2:] == ["export", "toyprog_save"]

    out = tmp_path / "mlp.toyprog"
    args = [src, "--to", "toyprog", *MLP_ARGS, "--dynamic-batch", "-o", str(out), "--no-cache"]
    code, report, _ = run_cli(args, capsys)
    assert code == 0 and report["check"] == "parity", report
    assert report["parity"]["status"] == "pass"
    x = torch.randn(5, 8)  # another batch than the example's, through the toy's own loader
    torch.testing.assert_close(_load(out).module()(x), seeded(MLP())(x))

    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0 and info["format"] == "toyprog", info
    code, verdict, _ = run_cli(["verify", src, str(out), *MLP_ARGS], capsys)
    assert code == 0 and verdict["status"] == "pass", verdict
    bench = ["bench", str(out), "--reference", src, *MLP_ARGS, "--repeats", "2", "--warmup", "1"]
    code, timing, _ = run_cli(bench, capsys)
    assert code == 0, timing
    assert "toyprog" in json.dumps(timing)


def test_a_plugin_targets_own_option_is_a_keyword_of_the_api(
    toy_target: None, samples: dict[str, Path], tmp_path: Path
) -> None:
    """Its option reaches its step, and is refused by name where it is not one (the target
    registered by the first call: ``convert`` loads the plugins)."""
    import ptconvert
    from ptconvert.errors import UsageError

    src, spec = samples["mlp_zip"], {"model": MLP_ARGS[1], "inputs": [MLP_ARGS[3]]}
    out = tmp_path / "stamped.toyprog"
    ptconvert.convert(src, "toyprog", out, **spec, cache=False)
    assert _stamp(out) == "1"
    ptconvert.convert(src, "toyprog", out, **spec, cache=False, force=True, toy_stamp="7")
    assert _stamp(out) == "7"
    with pytest.raises(UsageError, match="toy_stam"):
        ptconvert.convert(src, "toyprog", out, **spec, force=True, toy_stam="7")


def test_to_all_reaches_a_plugin_program_target(
    toy_target: None, samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "every"
    args = [str(samples["mlp_zip"]), "--to", "all", *MLP_ARGS, "-o", f"{out}/", "--no-cache"]
    _, report, _ = run_cli(args, capsys)  # its exit code is the first failing format's
    rows = {r["format"]: r for r in report["rows"]}
    assert "toyprog" in rows, report
    assert rows["toyprog"]["check"] == "parity" and rows["toyprog"]["status"] == "ok", rows
    written = Path(rows["toyprog"]["output"])
    x = torch.ones(2, 8)
    torch.testing.assert_close(_load(written).module()(x), seeded(MLP())(x))


def test_a_format_in_a_package_without_converters_declares_none() -> None:
    """A plugin's format class in a package of its own with no ``edges`` or ``generation``
    module adds no converter (it was an import error)."""
    from ptconvert.formats.base import Format

    class Bare(Format):
        name = "bare"

    Bare.__module__ = "ptconvert.formats"  # a package with neither submodule
    assert Bare().edges() == [] and Bare().generation_targets() == []
