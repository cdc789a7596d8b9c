"""Property: the symbolic reader finds exactly the tensors torch.load(weights_only=True) finds.

For every file torch's safe loader reads (the scan corpus's benign files, the layouts of
test_layouts, and random state dicts in random layouts), the names, dtypes, shapes and bytes the
symbolic pickle reader gives equal torch's. Files torch's safe loader cannot read are skipped,
each with its reason.
"""

from __future__ import annotations

import collections
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.scan_corpus import benign_corpus
from ptconvert.errors import PtconvertError
from ptconvert.formats import detect
from ptconvert.formats.checkpoint import read_checkpoint
from ptconvert.formats.checkpoint_reference import _plain
from ptconvert.formats.checkpoint_weights import Storages
from ptconvert.formats.torch_objects import (
    TensorRef,
    Unmapped,
    UnsupportedTensor,
    flatten_tensors,
)
from ptconvert.scan.scanner import scan_file
from tests.convert.test_layouts import CONVERTS, big_endian, pairs_pickler, raw, state_dict


def torch_tensors(path: Path, weights_only: bool = True) -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(path, weights_only=weights_only, map_location="cpu")
    if not weights_only:  # objects (a Namespace, a module) as the dicts of their attributes
        loaded = _plain(loaded, [], lambda v: isinstance(v, torch.Tensor))
    return flatten_tensors(loaded, is_tensor=lambda v: isinstance(v, torch.Tensor))


def symbolic_bytes(storages: Storages, name: str, t: TensorRef) -> bytes:
    source, _ = storages.locate(name, t)
    if source is None:
        return bytes(raw(storages.rebuild(t)).numpy())
    with open(source.path, "rb") as fh:
        fh.seek(source.offset)
        return fh.read(t.nbytes)


def mismatches(path: Path, weights_only: bool = True) -> list[str]:
    """What the symbolic reader sees differently from torch.load."""
    d = detect(path)
    ckpt = read_checkpoint(d.path, d.layout)
    collisions: list[str] = []
    ours = flatten_tensors(ckpt.tree, collisions=collisions)
    theirs = torch_tensors(path, weights_only)
    problems = [f"names two tensors flatten to: {collisions}"] if collisions else []
    if set(ours) != set(theirs):
        problems.append(f"names: ours {sorted(ours)[:8]} ≠ torch {sorted(theirs)[:8]}")
    storages = Storages(ckpt, d.path)
    for name in sorted(set(ours) & set(theirs)):
        mine, t = ours[name], theirs[name]
        if isinstance(mine, Unmapped):
            problems.append(f"{name}: torch reads it, ours cannot ({mine})")
        elif isinstance(mine, UnsupportedTensor):
            plain = type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            if plain and not t.is_quantized:
                problems.append(f"{name}: a plain tensor taken for {mine.kind}")
        else:
            assert isinstance(mine, TensorRef)
            dtype = str(t.dtype).removeprefix("torch.")
            if (mine.dtype, mine.shape) != (dtype, tuple(t.shape)):
                problems.append(f"{name}: {mine.dtype}{mine.shape} ≠ {dtype}{tuple(t.shape)}")
            elif symbolic_bytes(storages, name, mine) != bytes(raw(t).numpy()):
                problems.append(f"{name}: bytes differ")
    return problems


def check_file(path: Path, skipped: dict[str, str], full: set[str]) -> list[str]:
    """Mismatches against torch.load(weights_only=True); a file it refuses is compared with the
    full loader when the scanner finds it clean (added to ``full``), else skipped with why."""
    if path.is_dir():
        skipped[str(path)] = "a directory"
        return []
    try:
        fmt = detect(path).format
    except PtconvertError as exc:
        skipped[str(path)] = f"not detected: {exc.message}"
        return []
    if fmt != "pt":
        skipped[str(path)] = f"{fmt}, not a pickle checkpoint"
        return []
    try:
        torch_tensors(path)
    except Exception as exc:  # torch's refusals vary in type
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        why = next((ln for ln in lines if "Unsupported" in ln or "Cannot" in ln), lines[0])
        if scan_file(path).verdict != "clean":
            skipped[str(path)] = f"torch.load(weights_only=True): {why.strip()[:100]}"
            return []
        try:
            torch_tensors(path, weights_only=False)
        except Exception as exc2:  # e.g. a raw pickle: no torch.load reads it at all
            lines = str(exc2).strip().splitlines() or [type(exc2).__name__]
            skipped[str(path)] = f"no torch.load reads it: {why.strip()[:60]}; {lines[0][:60]}"
            return []
        full.add(str(path))
        return mismatches(path, weights_only=False)
    return mismatches(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, samples: dict[str, Path]) -> dict[str, Path]:
    files = {
        k: p for k, (p, _) in benign_corpus(tmp_path_factory.mktemp("benign"), samples).items()
    }
    layouts = tmp_path_factory.mktemp("layouts")
    for name, write in CONVERTS.items():
        write(layouts / f"{name}.pt", state_dict())
        files[f"layout_{name}"] = layouts / f"{name}.pt"
    return files


def test_symbolic_reader_matches_torch_on_the_corpus(corpus: dict[str, Path]) -> None:
    skipped: dict[str, str] = {}
    full: set[str] = set()
    failures = {n: p for n, path in corpus.items() if (p := check_file(path, skipped, full))}
    compared = len(corpus) - len(skipped)
    print(f"compared {compared} files ({len(full)} of them with torch.load(weights_only=False)")
    print(f"after a clean scan: {sorted(Path(f).name for f in full)}); skipped {len(skipped)}:")
    for path, reason in sorted(skipped.items()):  # shown with -s, or on failure
        print(f"  {Path(path).name}: {reason}")
    assert not failures, failures
    assert compared - len(full) >= 20


# --- random state dicts in random layouts --------------------------------------------------

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.uint16,
    torch.float8_e4m3fn,
]
# torch.save's legacy layout has typed storages only
LEGACY_DTYPES = DTYPES[:9]


@st.composite
def tensors(draw: Any, dtypes: list[torch.dtype]) -> torch.Tensor:
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    size = torch.empty(0, dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    seed = draw(st.integers(0, 2**16))
    data = torch.randint(
        0,
        256,
        (numel * size + 8 * size,),
        dtype=torch.uint8,
        generator=torch.Generator().manual_seed(seed),
    )
    base = (data % 2 == 0) if dtype == torch.bool else data.view(dtype)
    view = draw(st.sampled_from(["contiguous", "offset", "transposed"]))
    if view == "offset" or numel == 0:
        return base[3 : 3 + numel].reshape(shape)
    t = base[:numel].reshape(shape)
    return t.t() if view == "transposed" and t.dim() == 2 else t


@st.composite
def layouts(draw: Any) -> tuple[str, dict[str, Any]]:
    layout = draw(st.sampled_from(["zip", "legacy", "pairs", "big_endian"]))
    dtypes = LEGACY_DTYPES if layout in ("legacy", "big_endian") else DTYPES
    names = draw(
        st.lists(
            st.sampled_from(["a", "b.weight", "b.bias", "c.0", "emb"]),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    sd: dict[str, Any] = collections.OrderedDict()
    for name in names:
        if sd and draw(st.booleans()) and layout != "big_endian":
            sd[name] = sd[draw(st.sampled_from(sorted(sd)))]  # tied
        else:
            sd[name] = draw(tensors(dtypes))
    if layout == "big_endian":  # the test's writer swaps whole storages: one per tensor
        sd = collections.OrderedDict((k, v.contiguous().clone()) for k, v in sd.items())
    if draw(st.booleans()):
        sd = {"state_dict": sd, "epoch": draw(st.integers(0, 9))}
    return layout, sd


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=layouts(), protocol=st.integers(2, 5))
def test_symbolic_reader_matches_torch_on_random_files(
    case: tuple[str, dict[str, Any]], protocol: int
) -> None:
    layout, sd = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sd.pt"
        if layout == "zip":
            torch.save(sd, path, pickle_protocol=protocol)
        elif layout == "legacy":
            torch.save(sd, path, pickle_protocol=protocol, _use_new_zipfile_serialization=False)
        elif layout == "pairs":
            torch.save(sd, path, pickle_protocol=protocol, pickle_module=pairs_pickler("lists"))
        else:
            inner = sd.get("state_dict", sd)
            big_endian(path, inner)
        # a file this test wrote: torch's full loader reads what its safe one refuses (the
        # FRAME opcode of protocols 4 and 5 in the legacy layout)
        assert mismatches(path, weights_only=False) == []
