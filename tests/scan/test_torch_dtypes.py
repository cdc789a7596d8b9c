"""The scanner's dtype and storage names, and the reader's item sizes, cover the installed torch.

A torch release can add a dtype (2.14 added ``bcomplex32``); a checkpoint holding one names it as a
global (``torch.bcomplex32``), and until the allowlist knows it the file is refused as dangerous.
These tests fail on the first torch that adds a name, whichever version is installed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from ptconvert.formats.torch_objects import DTYPE_SIZES, STORAGE_DTYPES
from ptconvert.pickles.allowlist import classify
from ptconvert.scan.scanner import scan_file
from ptconvert.weights.read import read_weights

# every dtype the installed torch has, by the name a pickle gives it (aliases like torch.half
# are the same object, pickled as torch.float16)
DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
# the typed storage classes of the torch module (TypedStorage/Storage are the untyped base names)
STORAGES = sorted(
    n for n in dir(torch) if n.endswith("Storage") and n not in {"Storage", "TypedStorage"}
)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _element_size(dtype: torch.dtype) -> int:
    with warnings.catch_warnings():  # complex32/bcomplex32: "support is experimental"
        warnings.simplefilter("ignore")
        return torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_every_dtype_of_the_installed_torch_is_safe_and_sized(dtype: torch.dtype) -> None:
    name = _name(dtype)
    assert classify("torch", name) == "safe"
    assert DTYPE_SIZES.get(name) == _element_size(dtype)


@pytest.mark.parametrize("storage", STORAGES)
def test_every_storage_class_of_the_installed_torch_is_safe_and_sized(storage: str) -> None:
    cls = getattr(torch, storage)
    assert classify(cls.__module__, storage) == "safe"  # as a pickle names it
    if storage == "UntypedStorage":
        assert STORAGE_DTYPES[storage] == ("uint8", 1)
        return
    dtype = cls.dtype
    assert STORAGE_DTYPES.get(storage) == (_name(dtype), _element_size(dtype))


def test_a_checkpoint_of_every_dtype_scans_clean_and_reads_at_its_sizes(tmp_path: Path) -> None:
    """torch.save of every dtype it can write (not the 1-7 bit ints, not quantized ones)."""
    sub_byte = {getattr(torch, f"{s}int{b}") for s in ("", "u") for b in range(1, 8)}
    quantized = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
    sd = {}
    for dtype in DTYPES:
        if dtype in sub_byte or dtype in quantized:
            continue
        size = _element_size(dtype)
        data = torch.arange(3 * 4 * size, dtype=torch.uint8).reshape(3, 4 * size)
        sd[_name(dtype)] = data % 2 == 0 if dtype == torch.bool else data.view(dtype)
    torch.save(sd, tmp_path / "all.pt")
    result = scan_file(tmp_path / "all.pt")
    assert result.verdict == "clean", result.findings
    entries = {e.name: e for e in read_weights(tmp_path / "all.pt").entries}
    assert {k: (e.dtype, e.nbytes) for k, e in entries.items()} == {
        k: (_name(t.dtype), t.nbytes) for k, t in sd.items()
    }
