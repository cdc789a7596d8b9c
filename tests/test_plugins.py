"""A plugin adds a format and a converter from outside the package: one module, one entry
point. The toy format holds float32 tensors as JSON (names, shapes, values) after a magic number;
it declares how its weights are read, read again for the check, and written, and the converter
graph, ``plan`` and ``--to`` take it from there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli

MAGIC = b"TOYW"


def _toy_tensors(path: Path) -> dict[str, Any]:
    import torch

    data = json.loads(path.read_bytes()[len(MAGIC) :])
    return {
        n: torch.tensor(t["values"], dtype=torch.float32).reshape(t["shape"])
        for n, t in data.items()
    }


def _toy_format() -> Any:
    from ptconvert.formats.base import FileInfo, Format, Probe, file_entry

    class ToyFormat(Format):
        name = "toy"
        suffixes = (".toy",)
        holds = "float32 tensors as JSON (a plugin's format)"
        priority = 10
        write_label = "write the toy file"

        def match(self, probe: Probe) -> str | None:
            return "json" if not probe.is_dir and probe.head.startswith(MAGIC) else None

        def info(self, path: Path, layout: str) -> FileInfo:
            info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
            info.metadata["tensors"] = sorted(_toy_tensors(path))
            return info

        def read_weights(self, path: Path, layout: str, key: Any, skip: bool) -> Any:
            from ptconvert.formats.weightset import weights_from_tensors

            return weights_from_tensors(_toy_tensors(path))

        def reference(self, ws: Any, may_load: Any, stack: Any) -> Any:
            from ptconvert.formats.reference import Reference, torch_ref

            tensors = _toy_tensors(ws.origin)
            return Reference("toy", {n: torch_ref(t) for n, t in tensors.items()})

        def holds_dtype(self, dtype: str) -> bool:
            return dtype == "float32"

        def write_weights(self, ws: Any, out: Path, **_: Any) -> list[Path]:
            from ptconvert.weights.read import as_tensors

            data = {
                n: {"shape": list(t.shape), "values": t.reshape(-1).tolist()}
                for n, t in as_tensors(ws).items()
            }
            out.write_bytes(MAGIC + json.dumps(data).encode())
            return [out]

    return ToyFormat()


def register(registry: Any) -> None:
    from ptconvert.convert.graph import Edge

    registry.add_format(_toy_format())
    # a need of its own: the "signed" toy variant wants a key in the metadata
    registry.add_need("toy_key", "pass --metadata toy_key=…", lambda f, o: "toy_key" in o.metadata)
    registry.add_edge(Edge("toy", "signed_toy", "sign_toy", 1, ("toy_key",), "sign"), sign_toy)
    # and one that needs nothing, after the toy file a weights route writes
    registry.add_edge(Edge("toy", "stamped_toy", "stamp_toy", 1, label="stamp"), stamp_toy)


def stamp_toy(state: Any, opts: Any) -> None:
    state.output.write_bytes(state.output.read_bytes() + b"#stamped")


def sign_toy(state: Any, opts: Any) -> None:
    state.output.write_bytes(MAGIC + opts.metadata["toy_key"].encode())


class _EntryPoint:
    name, value = "toy", "tests.test_plugins:register"

    def load(self) -> Any:
        return register


@pytest.fixture
def toy_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin installed (its entry point listed), the registries restored afterwards."""
    import importlib.metadata

    from ptconvert import plugins
    from ptconvert.convert import graph, needs
    from ptconvert.formats import FORMATS, FORMATS_BY_NAME

    saved = (list(FORMATS), dict(FORMATS_BY_NAME), list(graph.EDGES), list(graph._PLUGIN_NODES))
    saved_needs = dict(needs.NEEDS)
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group=None: [_EntryPoint()] if group == plugins.GROUP else [],
    )
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(plugins, "_failed", [])
    yield
    FORMATS[:], graph.EDGES[:], graph._PLUGIN_NODES[:] = saved[0], saved[2], saved[3]
    FORMATS_BY_NAME.clear()
    FORMATS_BY_NAME.update(saved[1])
    needs.NEEDS.clear()
    needs.NEEDS.update(saved_needs)


def test_a_plugin_format_and_edge_reach_formats_plan_and_to(
    toy_plugin: None, samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, listing, _ = run_cli(["formats"], capsys)
    assert code == 0 and "toy" in json.dumps(listing)
    code, plan, _ = run_cli(["plan", str(samples["mlp_zip"]), "--to", "toy"], capsys)
    assert code == 0 and [s["step"] for s in plan["steps"]] == ["read_weights", "write_weights"]
    out = tmp_path / "mlp.toy"
    code, report, _ = run_cli([str(samples["mlp_zip"]), "--to", "toy", "-o", str(out)], capsys)
    # written by the plugin's writer, read back by its reader, compared bitwise with the
    # checkpoint's independent reading
    assert code == 0 and report["check"] == "bitwise", report
    assert {n: t["shape"] for n, t in json.loads(out.read_bytes()[len(MAGIC) :]).items()} == {
        "fc1.weight": [16, 8],
        "fc1.bias": [16],
        "fc2.weight": [4, 16],
        "fc2.bias": [4],
    }
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0 and info["format"] == "toy"
    # and out of it: its reader, checked bitwise against its independent reader
    back = tmp_path / "back.safetensors"
    code, report, _ = run_cli([str(out), "--to", "safetensors", "-o", str(back)], capsys)
    assert code == 0 and report["check"] == "bitwise", report
    import torch
    from safetensors.torch import load_file

    original = torch.load(samples["mlp_zip"], weights_only=True)
    again = load_file(str(back))
    assert again.keys() == original.keys()
    assert all(torch.equal(again[k], original[k]) for k in original)


def test_a_plugin_edge_runs_after_the_weights_are_written_as_the_format_it_starts_from(
    toy_plugin: None, samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pt → weights → toy (the format's own writer) → stamped_toy (the plugin's step): the
    write step writes the format its edge leads to, not the route's target."""
    out = tmp_path / "mlp.stamped_toy"
    code, report, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "stamped_toy", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert report["route"] == ["pt → weights", "weights → toy", "toy → stamped_toy"]
    data = out.read_bytes()
    assert data.startswith(MAGIC) and data.endswith(b"#stamped")
    assert set(json.loads(data[len(MAGIC) : -len(b"#stamped")])) == {
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    }


def test_a_plugin_need_is_checked_by_the_engine_with_its_hint(
    toy_plugin: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "a.toy"
    src.write_bytes(MAGIC + b"{}")
    code, plan, _ = run_cli(["plan", str(src), "--to", "signed_toy"], capsys)
    assert code == 5 and not plan["runnable"]  # exit 5: a need is missing
    assert plan["missing"] == {"toy_key": "pass --metadata toy_key=…"}
    out = tmp_path / "b.signed_toy"
    code, report, _ = run_cli([str(src), "--to", "signed_toy", "-o", str(out)], capsys)
    assert code == 5 and report["error"]["hint"] == "pass --metadata toy_key=…"
    assert not out.exists()


def test_a_plugin_that_fails_to_load_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    import ptconvert
    from ptconvert import plugins

    class Broken(_EntryPoint):
        def load(self) -> Any:
            raise ImportError("no module named ptconvert_toy")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [Broken()])
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(plugins, "_failed", [])  # both restored after the test
    with pytest.raises(ptconvert.UsageError, match="plugin 'toy'"):
        ptconvert.format_names()
    with pytest.raises(ptconvert.UsageError, match="plugin 'toy'"):  # not forgotten
        ptconvert.describe(Path(__file__))
