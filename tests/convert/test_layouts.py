"""Every checkpoint layout torch reads converts, or fails with a named error (issue #11).

Files are written by torch itself (``torch.save`` with its options, a custom ``pickle_module``
for layouts old Python versions wrote) and the outputs are read back with the formats' own
loaders; the expected tensors are the ones the test saved.
"""

from __future__ import annotations

import collections
import copyreg
import io
import pickle
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from fixtures.build import write_legacy_tar
from ptconvert import convert as convert_weights
from ptconvert.errors import (
    NoWeightsError,
    PtconvertError,
    UnsafeInputError,
    UnsupportedConversionError,
    VerificationError,
)
from tests.conftest import run_cli


def state_dict(seed: int = 0) -> collections.OrderedDict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sd: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()
    sd["fc1.weight"] = torch.randn(4, 3, generator=gen)
    sd["fc1.bias"] = torch.randn(4, generator=gen)
    sd["fc2.weight"] = torch.randn(2, 4, generator=gen).half()
    sd["steps"] = torch.tensor(7)
    return sd


def raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (bitwise comparison, NaN-safe, any dtype)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want) or set(got) == set(want), (sorted(got), sorted(want))
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(raw(got[k]), raw(want[k])), k


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def read_back(path: Path, to: str) -> dict[str, torch.Tensor]:
    if to == "safetensors":
        return read_safetensors(path)
    return dict(torch.load(path, weights_only=True, mmap=True))


# --- pickles of a state dict in the ways old Pythons and other tools wrote them ---------------


def pairs_pickler(style: str) -> Any:
    """A ``pickle_module`` for torch.save whose Pickler reduces non-empty OrderedDicts as
    ``style`` says (Python 2 wrote ``(OrderedDict, ([[key, value], …],), attributes)``)."""

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is not collections.OrderedDict or not obj:
                return NotImplemented
            if style == "lists":
                return (collections.OrderedDict, ([[k, v] for k, v in obj.items()],))
            if style == "tuples":
                return (collections.OrderedDict, (tuple((k, v) for k, v in obj.items()),))
            if style == "py2":  # pairs plus the instance dict, as a BUILD state
                state = dict(vars(obj))
                return (collections.OrderedDict, ([[k, v] for k, v in obj.items()],), state)
            if style == "dict":
                return (dict, ([(k, v) for k, v in obj.items()],))
            if style == "reconstructor":
                # what protocols 0/1 write for a dict subclass without its own __reduce__
                return (copyreg._reconstructor, (dict, dict, dict(obj)))
            raise AssertionError(style)

    return types.SimpleNamespace(Pickler=Pickler, dump=pickle.dump, __name__="pairs_pickle")


def with_metadata(sd: collections.OrderedDict[str, torch.Tensor]) -> Any:
    out = collections.OrderedDict(sd)
    out._metadata = collections.OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    return out


PAIR_STYLES = ["lists", "tuples", "py2", "dict", "reconstructor"]


def test_pairs_built_ordered_dict_converts_with_every_tensor(tmp_path: Path, capsys) -> None:
    """The issue's file: an OrderedDict REDUCEd from a list of [key, tensor] pairs."""
    sd = state_dict()
    src = tmp_path / "pairs.pt"
    torch.save(with_metadata(sd), src, pickle_module=pairs_pickler("lists"))
    assert_same(torch.load(src, weights_only=True), sd)  # torch finds the tensors
    code, info, _ = run_cli(["info", str(src)], capsys)
    assert code == 0 and info["tensors"] == len(sd)
    out = tmp_path / "pairs.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 0 and report["weights"]["tensors"] == len(sd)
    assert report["weights"]["verification"]["tensors"] == len(sd)
    assert report["weights"]["verification"]["reader"] == "pickle records (stdlib pickle + zipfile)"
    assert_same(read_safetensors(out), sd)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("style", PAIR_STYLES)
def test_every_way_of_building_the_dict(style: str, legacy: bool, tmp_path: Path) -> None:
    sd = state_dict()
    src = tmp_path / f"{style}.pt"
    wrapped = {"state_dict": with_metadata(sd), "epoch": 3}
    torch.save(
        wrapped,
        src,
        pickle_module=pairs_pickler(style),
        _use_new_zipfile_serialization=not legacy,
    )
    assert_same(torch.load(src, weights_only=False)["state_dict"], sd)
    report = convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    assert report.weights.unwrapped == "state_dict" and report.weights.tensors == len(sd)
    assert_same(read_safetensors(tmp_path / "o.safetensors"), sd)


# --- every layout torch reads -------------------------------------------------------------


def _zip(proto: int) -> Callable[[Path, Any], None]:
    return lambda p, sd: torch.save(sd, p, pickle_protocol=proto)


def _legacy(proto: int) -> Callable[[Path, Any], None]:
    return lambda p, sd: torch.save(
        sd, p, _use_new_zipfile_serialization=False, pickle_protocol=proto
    )


def _raw_pickle(proto: int) -> Callable[[Path, Any], None]:
    def write(p: Path, sd: Any) -> None:
        with open(p, "wb") as fh:
            pickle.dump(dict(sd), fh, protocol=proto)

    return write


def _tar(p: Path, sd: Any) -> None:
    write_legacy_tar(p, {k: v.float() for k, v in sd.items()})


def _deflated(p: Path, sd: Any) -> None:
    buf = io.BytesIO()
    torch.save(sd, buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))


def big_endian(p: Path, sd: Any) -> None:
    """A torch zip written on a big-endian machine: ``byteorder`` says big and every storage
    holds its elements byte-swapped (complex numbers swap each half), as torch reads them."""
    buf = io.BytesIO()
    tensors = list(sd.values())
    torch.save(sd, buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in info.filename and data:  # storage keys follow first use: 0, 1, …
                t = tensors[int(info.filename.rsplit("/", 1)[1])]
                unit = t.element_size() // (2 if t.is_complex() else 1)
                data = bytes(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8)
                    .reshape(-1, unit)
                    .flip(1)
                    .reshape(-1)
                    .numpy()
                )
            dst.writestr(info, data)


def _views(p: Path, sd: Any) -> None:
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    torch.save({**sd, "t": base.t(), "slice": base[1:4, 2:5], "row": base[3]}, p)


def _attributes(p: Path, sd: Any) -> None:
    t = torch.randn(3)
    t.note = "a Python attribute: pickled through _rebuild_from_type_v2"  # type: ignore[attr-defined]
    torch.save({**sd, "annotated": t}, p)


def _pairs(p: Path, sd: Any) -> None:
    torch.save(sd, p, pickle_module=pairs_pickler("lists"))


def _expected(write: Callable[[Path, Any], None], sd: Any) -> dict[str, torch.Tensor]:
    out = {k: v.contiguous() for k, v in sd.items()}
    if write is _tar:
        out = {k: v.float() for k, v in out.items()}
    return out


CONVERTS: dict[str, Callable[[Path, Any], None]] = {
    **{f"zip_p{p}": _zip(p) for p in range(1, 6)},
    **{f"legacy_p{p}": _legacy(p) for p in range(1, 6)},
    "legacy_tar": _tar,
    "zip_deflated": _deflated,
    "zip_big_endian": big_endian,
    "zip_views": _views,
    "tensor_attributes": _attributes,
    "zip_pairs": _pairs,
}
# layouts whose tensors torch.load(weights_only=True) cannot read either: a named error
REFUSED: dict[str, tuple[Callable[[Path, Any], None], tuple[type[PtconvertError], ...]]] = {
    # protocol 0 writes persistent ids as text; torch: "saved_id must be a tuple, got str"
    "legacy_p0": (_legacy(0), (UnsupportedConversionError,)),
    # plain pickle of a tensor: a nested torch.save under torch.storage._load_from_bytes
    **{
        f"raw_pickle_p{p}": (_raw_pickle(p), (UnsupportedConversionError, UnsafeInputError))
        for p in range(6)
    },
}


@pytest.mark.parametrize("to", ["safetensors", "pt"])
@pytest.mark.parametrize("layout", sorted(CONVERTS))
def test_every_layout_converts(layout: str, to: str, tmp_path: Path) -> None:
    write = CONVERTS[layout]
    sd = state_dict()
    src = tmp_path / f"{layout}.pt"
    write(src, sd)
    want = dict(torch.load(src, weights_only=False))  # torch's own reading of the file
    expected = _expected(write, sd)
    assert_same({k: want[k] for k in expected}, expected)
    out = tmp_path / f"out.{to}"
    report = convert_weights(src, to, out)
    assert report.weights.verification and report.weights.verification.status == "pass"
    assert report.weights.verification.reader.startswith("pickle records (stdlib pickle")
    assert report.weights.verification.reader_seconds >= 0 and report.weights.tensors == len(want)
    assert_same(read_back(out, to), {k: v.contiguous() for k, v in want.items()})


@pytest.mark.parametrize("layout", sorted(REFUSED))
def test_unreadable_layouts_get_a_named_error(layout: str, tmp_path: Path, capsys) -> None:
    write, errors = REFUSED[layout]
    src = tmp_path / f"{layout}.pt"
    write(src, state_dict())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(src, weights_only=True)  # torch's own safe loader refuses it too
    with pytest.raises(errors):
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(tmp_path / "o")], capsys)
    assert code in {e.exit_code for e in errors} and code != 1, report
    assert not (tmp_path / "o").exists()
    code, _, _ = run_cli(["info", str(src)], capsys)  # described, not "unrecognised content"
    assert code == 0


def test_big_endian_untyped_storage_is_a_named_error(tmp_path: Path) -> None:
    """torch.load does not byte-swap dtypes saved in untyped storages (uint16, float8, …)."""
    src = tmp_path / "be16.pt"
    big_endian(src, {"u": torch.arange(4, dtype=torch.int32).to(torch.uint16)})
    with pytest.raises(UnsupportedConversionError, match=r"'u' .*uint16.* big-endian"):
        convert_weights(src, "pt", tmp_path / "o.pt")


# --- dtypes ---------------------------------------------------------------------------------

ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
SUB_BYTE = {getattr(torch, f"{s}int{b}") for s in ("", "u") for b in range(1, 8)}
NOT_IN_SAFETENSORS = {
    torch.complex128,
    torch.complex32,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.bits1x8,
    torch.bits2x4,
    torch.bits4x2,
    torch.bits8,
    torch.bits16,
}
if hasattr(torch, "bcomplex32"):  # torch 2.14's complex of two bfloat16: safetensors has no code
    NOT_IN_SAFETENSORS.add(torch.bcomplex32)


def every_dtype() -> dict[str, torch.Tensor]:
    """One tensor of every dtype torch.save can write (torch cannot save the 1–7 bit ints)."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for dt in ALL_DTYPES:
        if dt in QUANTIZED or dt in SUB_BYTE:
            continue
        size = torch.empty(0, dtype=dt).element_size()
        data = torch.randint(0, 255, (3, 4 * size), generator=gen, dtype=torch.uint8)
        out[str(dt).removeprefix("torch.")] = data % 2 == 0 if dt == torch.bool else data.view(dt)
    return out


def test_every_dtype_converts_to_pt(tmp_path: Path) -> None:
    sd = every_dtype()
    torch.save(sd, tmp_path / "all.pt")
    report = convert_weights(tmp_path / "all.pt", "pt", tmp_path / "back.pt")
    assert report.weights.tensors == len(sd) and not report.weights.skipped
    assert_same(torch.load(tmp_path / "back.pt", weights_only=True), sd)


def test_dtypes_safetensors_cannot_hold_are_named(tmp_path: Path, capsys) -> None:
    sd = every_dtype()
    src = tmp_path / "all.pt"
    torch.save(sd, src)
    unsupported = {str(d).removeprefix("torch.") for d in NOT_IN_SAFETENSORS}
    with pytest.raises(UnsupportedConversionError) as caught:
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    for name in unsupported:  # each tensor named with its dtype
        assert f"'{name}' ({name})" in caught.value.message
    code, report, _ = run_cli(
        [str(src), "--to", "safetensors", "-o", str(tmp_path / "o.safetensors")], capsys
    )
    assert code == 4 and "complex128" in report["error"]["message"]
    code, report, _ = run_cli(
        [
            str(src),
            "--to",
            "safetensors",
            "-o",
            str(tmp_path / "o.safetensors"),
            "--skip-unsupported",
        ],
        capsys,
    )
    assert code == 0 and set(report["weights"]["skipped"]) == unsupported
    assert any("left out" in n for n in report["notes"])
    kept = {k: v for k, v in sd.items() if k not in unsupported}
    assert_same(read_safetensors(tmp_path / "o.safetensors"), kept)
    assert "float4_e2m1fn_x2" in kept  # packed 4-bit: safetensors counts values, torch bytes


def test_issue_file_complex128_and_fnuz(tmp_path: Path) -> None:
    src = tmp_path / "d.pt"
    torch.save(
        {
            "c": torch.randn(3, dtype=torch.complex128),
            "f": torch.zeros(4).to(torch.float8_e4m3fnuz),
            "x": torch.ones(2),
        },
        src,
    )
    with pytest.raises(UnsupportedConversionError, match=r"'c' \(complex128\), 'f' \(float8"):
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    report = convert_weights(src, "safetensors", tmp_path / "o.safetensors", skip_unsupported=True)
    assert report.weights.tensors == 1 and set(report.weights.skipped) == {"c", "f"}
    assert set(read_safetensors(tmp_path / "o.safetensors")) == {"x"}


# --- files without tensors, and tensors the reader cannot name ------------------------------


def test_a_file_without_tensors_says_so(tmp_path: Path, capsys) -> None:
    zip_src = tmp_path / "epoch.pt"
    torch.save({"epoch": 3, "lr": 0.1}, zip_src)
    tar_src = tmp_path / "empty.pth.tar"
    write_legacy_tar(tar_src, {})
    for src in (zip_src, tar_src):
        with pytest.raises(NoWeightsError, match="holds no tensors"):
            convert_weights(src, "safetensors", tmp_path / "o.safetensors")
        code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
        assert code == 3 and report["error"]["kind"] == "no_weights"
        assert "--trust" not in str(report["error"]["hint"])
        code, info, _ = run_cli(["info", str(src)], capsys)
        assert code == 0 and info["tensors"] == 0
        assert "the file holds no tensors" in info["notes"]
    assert not list(tmp_path.glob("*.safetensors"))


def test_tensors_in_a_set_are_an_error_naming_it(tmp_path: Path) -> None:
    src = tmp_path / "set.pt"
    torch.save({"w": torch.ones(2), "s": {torch.zeros(1), torch.ones(1)}}, src, pickle_protocol=2)
    with pytest.raises(UnsupportedConversionError, match=r"at 's': builtins\.set"):
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")


def test_a_blind_reader_cannot_pass_its_own_check(tmp_path: Path, monkeypatch) -> None:
    """Were the symbolic reader to miss a tensor, the independent reading still sees it."""
    from ptconvert.formats import checkpoint_weights as weights_read

    src = tmp_path / "sd.pt"
    torch.save(state_dict(), src)
    real = weights_read._tensor_leaves

    def blind(tree: Any, path: Path, skip: bool) -> Any:
        refs, skipped = real(tree, path, skip)
        refs.pop("fc1.bias")
        return refs, skipped

    monkeypatch.setattr(weights_read, "_tensor_leaves", blind)
    with pytest.raises(VerificationError, match=r"missing in output: \['fc1.bias'\]"):
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists()


def test_a_list_or_a_single_tensor_is_named_by_position(tmp_path: Path) -> None:
    torch.save([torch.ones(2), torch.zeros(3)], tmp_path / "list.pt")
    torch.save(torch.arange(5.0), tmp_path / "single.pt")
    convert_weights(tmp_path / "list.pt", "safetensors", tmp_path / "list.safetensors")
    convert_weights(tmp_path / "single.pt", "safetensors", tmp_path / "single.safetensors")
    assert_same(
        read_safetensors(tmp_path / "list.safetensors"), {"0": torch.ones(2), "1": torch.zeros(3)}
    )
    assert_same(read_safetensors(tmp_path / "single.safetensors"), {"tensor": torch.arange(5.0)})
