"""``--export-mode`` reaches every export: ``exporting.export_once`` is ptconvert's one call of
``torch.export.export``, and the generation routes (a decoder's static cache to pt2, its past
inputs to ONNX, a seq2seq model's encoder and decoder to pt2 and to ONNX) and the ``.pte``'s
bounded export go through ``export_in_mode`` with the run's mode, as the main export does. The
flags are recorded where they are used, and the routes run through the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ptconvert.convert import exporting
from ptconvert.convert.exporting import EXPORT_MODES, ExportFailed, export_in_mode
from tests.conftest import run_cli

REFUSAL = "refused by the test"

# (fixture's model, --to, --task, the output's suffix)
ROUTES = {
    "decoder-pt2": ("llama", "pt2", "text-generation-with-past", "pt2"),
    "decoder-onnx": ("llama", "onnx", "text-generation-with-past", "onnx"),
    "seq2seq-pt2": ("t5", "pt2", "text2text-generation-with-past", "pt2"),
    "seq2seq-onnx": ("t5", "onnx", "text2text-generation-with-past", "onnx"),
}


def _record(monkeypatch: pytest.MonkeyPatch, refuse: bool) -> list[bool]:
    """The ``strict`` flag of every export from now on; ``refuse``: each one fails (cheaply,
    before torch traces anything) instead of exporting."""
    seen: list[bool] = []
    real: Callable[..., Any] = exporting.export_once

    def recording(*args: Any, strict: bool, **kwargs: Any) -> Any:
        seen.append(strict)
        if refuse:
            raise RuntimeError(REFUSAL)
        return real(*args, strict=strict, **kwargs)

    monkeypatch.setattr(exporting, "export_once", recording)
    return seen


@pytest.fixture
def flags(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    return _record(monkeypatch, refuse=False)


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    return _record(monkeypatch, refuse=True)


class Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")


class Doubles(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


@pytest.mark.parametrize("mode", ["auto", "strict", "non-strict"])
def test_export_in_mode_tries_each_mode_in_order(mode: Any, flags: list[bool]) -> None:
    with pytest.raises(Exception) as caught:
        export_in_mode(Raises(), (torch.ones(2),), None, None, mode)
    assert (
        flags
        == list(EXPORT_MODES[mode])
        == {
            "auto": [False, True],
            "strict": [True],
            "non-strict": [False],
        }[mode]
    )
    if mode == "auto":  # both failed: each mode's first line, in order
        assert caught.type is ExportFailed
        assert str(caught.value).startswith("non-strict: ValueError: boom; strict: ")
    elif mode == "non-strict":  # one mode: torch's own exception, as it was raised
        assert caught.type is ValueError


def test_auto_stops_at_the_first_mode_that_exports(flags: list[bool]) -> None:
    ep = export_in_mode(Doubles(), (torch.ones(2),), None, None, "auto")
    assert flags == [False]
    assert torch.equal(ep.module()(torch.ones(2)), torch.full((2,), 2.0))


def _convert(
    route: str, mode: str | None, models: dict[str, Path], tmp: Path, capsys: Any
) -> tuple[int, Any]:
    name, to, task, suffix = ROUTES[route]
    args = [str(models[name]), "--to", to, "--task", task, "-o", str(tmp / f"out.{suffix}")]
    code, out, _ = run_cli(
        [*args, "--no-verify", *(["--export-mode", mode] if mode else [])], capsys
    )
    return code, out


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(
    ("mode", "expected"), [("strict", [True]), (None, [False]), ("non-strict", [False])]
)
def test_the_generation_exports_take_the_export_mode(
    route: str,
    mode: str | None,
    expected: list[bool],
    refused: list[bool],
    tiny: dict[str, Path],
    tiny_seq2seq: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every export refused: the route's first export is tried in each mode of the run's (auto:
    non-strict only, ``wrapper_mode``), and the failure is said as the route's own error (never
    an internal error)."""
    code, out = _convert(route, mode, {**tiny, **tiny_seq2seq}, tmp_path, capsys)
    assert refused == expected
    assert code != 0
    error = out["error"]
    assert error["type"] == "UnsupportedConversionError", error
    assert REFUSAL in error["message"]


@pytest.mark.parametrize(("mode", "expected"), [("strict", [True]), (None, [False])])
def test_a_static_cache_exports_in_the_mode_asked(
    mode: str | None,
    expected: list[bool],
    flags: list[bool],
    tiny: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The real export: strict when asked; by default non-strict, at the first try."""
    code, out = _convert("decoder-pt2", mode, tiny, tmp_path, capsys)
    assert code == 0, out
    assert flags == expected


def test_the_pte_bounds_export_takes_the_export_mode(flags: list[bool]) -> None:
    """``.pte``: the program exported again with every dynamic dim bounded, in the run's mode."""
    from torch.export import Dim

    from ptconvert.convert.state import RunState
    from ptconvert.formats.pte.edges.export import _export_bounded, upper_bounds
    from ptconvert.options import Options

    opts = Options(strict="strict")
    state = RunState(src=Path("model.pt"), src_format="pt")
    state.exported = export_in_mode(
        Doubles(), (torch.ones(3, 2),), None, ({0: Dim.DYNAMIC},), "non-strict"
    )
    bounds = upper_bounds(state, opts)
    assert bounds
    flags.clear()
    _export_bounded(state, bounds, opts.strict)
    assert flags == [True]
