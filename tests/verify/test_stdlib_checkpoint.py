"""The independent reader of pickle checkpoints (pickles/stdlib_checkpoint.py, stdlib_unpickler.py).

It must read what torch.load reads (names, dtypes, shapes, bytes) in every layout, read whole
pickled modules without importing their code, and never import or call anything a pickle names,
with or without --trust.
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import pickle
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ptconvert
from fixtures.build import write_legacy_tar
from ptconvert import convert as convert_weights
from ptconvert.formats import checkpoint_reference as independent
from ptconvert.formats.reference import CHUNK, Pages
from ptconvert.formats.torch_objects import flatten_tensors
from ptconvert.pickles.stdlib_checkpoint import PickleFile, read_pickle_file
from ptconvert.pickles.stdlib_unpickler import ITEMSIZES, STORAGE_DTYPES, StandIn, Tensor
from tests.convert.test_layouts import big_endian, read_safetensors

Tensors = dict[str, tuple[str, tuple[int, ...], bytes]]


def records(path: Path) -> tuple[PickleFile, dict[str, Tensor]]:
    read = read_pickle_file(path)
    tree = independent._plain(read.tree, [], is_tensor=lambda v: isinstance(v, Tensor))
    return read, flatten_tensors(tree, is_tensor=lambda v: isinstance(v, Tensor))


SPANS: dict[Path, set[str]] = {}  # the tensors each file's reading found stored as they are


def ours(path: Path) -> Tensors:
    """What the verification compares: each tensor's dtype, shape and bytes, chunk by chunk;
    where the reading says they lie in the file as they are (``span``, compared in place by the
    check), the file holds those same bytes there."""
    read, flat = records(path)
    out: Tensors = {}
    SPANS[path] = set()
    for name, t in flat.items():
        assert read.problem(t) is None, (name, read.problem(t))
        ref = independent._record_ref(read, t, Pages(path), path)
        data = b"".join(bytes(c) for c in ref.chunks())
        assert len(data) == ref.nbytes
        out[name] = (ref.dtype, ref.shape, data)
        if ref.span is not None:
            with open(ref.span[0], "rb") as fh:
                fh.seek(ref.span[1])
                assert fh.read(ref.nbytes) == data, f"{name}: not the bytes at its span"
            SPANS[path].add(name)
    return out


def torch_reads(path: Path, weights_only: bool = True) -> Tensors:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(path, weights_only=weights_only, map_location="cpu")
    if not weights_only:
        loaded = independent._plain(loaded, [], lambda v: isinstance(v, torch.Tensor))
    flat = flatten_tensors(loaded, is_tensor=lambda v: isinstance(v, torch.Tensor))
    return {
        n: (
            str(t.dtype).removeprefix("torch."),
            tuple(t.shape),
            bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()),
        )
        for n, t in flat.items()
    }


def assert_agree(path: Path, weights_only: bool = True) -> Tensors:
    mine, theirs = ours(path), torch_reads(path, weights_only)
    assert sorted(mine) == sorted(theirs)
    for name in theirs:
        assert mine[name][:2] == theirs[name][:2], name
        assert mine[name][2] == theirs[name][2], f"{name}: bytes differ"
    return mine


def mixed(legacy: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    sd = {
        "f32": torch.randn(3, 4, generator=gen),
        "bf16": torch.randn(5, generator=gen).bfloat16(),
        "f16": torch.randn(2, 3, generator=gen).half(),
        "i8": torch.randint(-100, 100, (7,), dtype=torch.int8, generator=gen),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(4, dtype=torch.complex64, generator=gen),
        "i64": torch.tensor(7),
        "empty": torch.zeros(0, 3),
    }
    if not legacy:  # saved as an untyped storage plus a dtype (_rebuild_tensor_v3)
        sd["u16"] = torch.arange(6, dtype=torch.int32).to(torch.uint16)
        sd["f8"] = torch.randn(4, generator=gen).to(torch.float8_e4m3fn)
    return sd


def views() -> dict[str, torch.Tensor]:
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    flat = torch.arange(100, dtype=torch.float64)
    return {
        "t": base.t(),
        "block": base[1:4, 2:7],
        "row": base[3],
        "every_other": base[:, ::2],
        "permuted": torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
        "head": flat[:10],
        "middle": flat[40:60].view(4, 5),  # same storage, at an offset
        "tail": flat[90:],
    }


# --- agreement with torch.load ----------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 5])
def test_mixed_dtypes_agree_with_torch(protocol: int, tmp_path: Path) -> None:
    src = tmp_path / "mixed.pt"
    torch.save(mixed(), src, pickle_protocol=protocol)
    # torch's safe loader refuses the FRAME opcode of protocols 4 and 5: its full one reads them
    got = assert_agree(src, weights_only=protocol < 4)
    assert {v[0] for v in got.values()} >= {"bfloat16", "float16", "int8", "bool", "complex64"}
    assert records(src)[0].reader == "stdlib pickle + zipfile"
    assert SPANS[src] == set(got)  # every tensor stored as it is: compared in place


def test_views_and_shared_storages_agree_with_torch(tmp_path: Path) -> None:
    src = tmp_path / "views.pt"
    torch.save(views(), src)
    assert_agree(src)
    _, flat = records(src)
    assert not flat["t"].contiguous and flat["middle"].offset == 40
    assert flat["head"].storage == flat["middle"].storage == flat["tail"].storage


def test_a_training_checkpoint_agrees_with_torch(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    src = tmp_path / "ckpt.pt"
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "best": 0.25,
        "arch": "mlp",
        "history": [{"loss": 1.5, "step": 10}, {"loss": 0.5, "step": 20}],
    }
    torch.save(ckpt, src)
    got = assert_agree(src)
    assert {"model.0.weight", "optimizer.state.0.exp_avg", "optimizer.state.0.step"} <= set(got)
    read = read_pickle_file(src)
    assert (read.tree["epoch"], read.tree["best"], read.tree["arch"]) == (3, 0.25, "mlp")
    assert read.tree["optimizer"]["param_groups"][0]["lr"] == 0.01


@pytest.mark.parametrize("protocol", [2, 5])
def test_the_legacy_layout_agrees_with_torch(protocol: int, tmp_path: Path) -> None:
    src = tmp_path / "legacy.pt"
    sd = {**mixed(legacy=True), **views()}
    torch.save(sd, src, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    # torch's safe loader refuses the FRAME opcode of protocols 4 and 5 in this layout
    got = assert_agree(src, weights_only=protocol < 4)
    assert records(src)[0].reader == "stdlib pickle"
    assert SPANS[src] and SPANS[src] < set(got)  # stored as they are, but the strided views


def test_big_endian_zips_give_torchs_little_endian_bytes(tmp_path: Path) -> None:
    src = tmp_path / "be.pt"
    sd = {k: mixed()[k] for k in ("f32", "bf16", "f16", "i8", "c64", "i64")}
    big_endian(src, sd)
    assert read_pickle_file(src).big_endian
    got = assert_agree(src)
    assert got["f32"][2] == bytes(sd["f32"].numpy())
    assert SPANS[src] == {"i8"}  # swapped bytes are compared as torch gives them, not in place
    untyped = tmp_path / "be16.pt"  # torch.load does not swap an untyped storage's uint16s
    big_endian(untyped, {"u": torch.arange(4, dtype=torch.int32).to(torch.uint16)})
    read, flat = records(untyped)
    assert "untyped storage" in str(read.problem(flat["u"]))


def tar_with_order(path: Path, order: list[str]) -> None:
    """The legacy tar fixture rewritten with its members in ``order``."""
    with tarfile.open(path) as tar:
        members = {m.name: (m, tar.extractfile(m)) for m in tar.getmembers()}
        data = {name: f.read() for name, (_, f) in members.items() if f is not None}
    with tarfile.open(path, "w:", format=tarfile.PAX_FORMAT) as tar:
        for name in order:
            tar.addfile(members[name][0], io.BytesIO(data[name]))


@pytest.mark.parametrize(
    "order",
    [None, ["pickle", "tensors", "sys_info", "storages"]],
    ids=["as_written", "reordered"],
)
def test_legacy_tar_agrees_with_torch(order: list[str] | None, tmp_path: Path) -> None:
    src = tmp_path / "old.pth.tar"
    gen = torch.Generator().manual_seed(1)
    write_legacy_tar(src, {"fc.weight": torch.randn(4, 3, generator=gen), "fc.bias": torch.ones(4)})
    if order is not None:
        tar_with_order(src, order)
        with tarfile.open(src) as tar:
            assert tar.getnames() == order
    got = assert_agree(src, weights_only=False)  # torch's safe loader refuses tars
    assert sorted(got) == ["fc.bias", "fc.weight"]
    assert records(src)[0].reader == "stdlib pickle + tarfile"
    assert SPANS[src] == set(got)


def test_big_tensors_come_in_bounded_chunks_from_the_map(tmp_path: Path) -> None:
    src = tmp_path / "big.pt"
    big = torch.arange(3 * 2**20, dtype=torch.float32).reshape(1024, 3072)
    torch.save({"big": big, "big_t": big.t()}, src)
    read, flat = records(src)
    sizes = {}
    for name in ("big", "big_t"):
        ref = independent._record_ref(read, flat[name], Pages(src), src)
        chunks = list(ref.chunks())
        sizes[name] = max(len(c) for c in chunks)
        if name == "big":  # contiguous: slices of the file's map, never copied
            assert all(isinstance(c.obj, mmap.mmap) for c in chunks)
        want = big if name == "big" else big.t().contiguous()
        assert b"".join(bytes(c) for c in chunks) == bytes(want.numpy())
    assert max(sizes.values()) <= CHUNK


def test_dtype_tables_match_torch() -> None:
    dtypes = {str(v).removeprefix("torch."): v for v in vars(torch).values()}
    dtypes = {k: v for k, v in dtypes.items() if isinstance(v, torch.dtype)}
    assert {k: v.itemsize for k, v in dtypes.items()} == {k: ITEMSIZES[k] for k in dtypes}
    legacy = torch.storage._dtype_to_storage_type_map()
    assert {name: str(d).removeprefix("torch.") for d, name in legacy.items()} == {
        k: v for k, v in STORAGE_DTYPES.items() if k != "UntypedStorage"
    }


# --- whole modules: their code is never imported ----------------------------------------------

NET_SOURCE = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.head = torch.nn.Sequential(torch.nn.Linear(2, 2))
        self.register_buffer("scale", torch.arange(4.0))
        self.note = "trained"
"""


@pytest.fixture
def pickled_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    """A whole pickled nn.Module of a class whose module is then gone from sys.path and
    sys.modules: nothing can import it any more."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "vanishing_net.py").write_text(textwrap.dedent(NET_SOURCE))
    monkeypatch.syspath_prepend(str(code))
    import vanishing_net  # type: ignore[import-not-found]

    torch.manual_seed(0)
    net = vanishing_net.Net()
    src = tmp_path / "net.pt"
    torch.save(net, src)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    del net, vanishing_net
    sys.modules.pop("vanishing_net")
    sys.path.remove(str(code))
    (code / "vanishing_net.py").unlink()
    return src, state


def test_a_pickled_module_is_read_without_its_code(pickled_module, tmp_path: Path) -> None:
    src, state = pickled_module
    with pytest.raises(ModuleNotFoundError):
        torch.load(src, weights_only=False)
    got = ours(src)
    assert "vanishing_net" not in sys.modules
    assert sorted(got) == sorted(state)
    for name, t in state.items():
        assert got[name][2] == bytes(t.numpy()), name
    tree = read_pickle_file(src).tree
    assert isinstance(tree, StandIn) and tree.pickled_name == "vanishing_net.Net"
    assert tree.note == "trained"  # type: ignore[attr-defined]

    out = tmp_path / "net.safetensors"
    report = ptconvert.convert(src, "safetensors", out, trust=True)
    check = report.weights.verification  # type: ignore[union-attr]
    assert check is not None and check.status == "pass" and check.tensors == len(state)
    assert check.reader == "pickle records (stdlib pickle + zipfile)"
    assert "vanishing_net" not in sys.modules
    assert sorted(read_safetensors(out)) == sorted(state)


# --- nothing runs --------------------------------------------------------------------------------


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _text(s: str) -> bytes:
    data = s.encode()
    return b"X" + len(data).to_bytes(4, "little") + data


def evil_pickle(marker: Path) -> bytes:
    """Protocol 2: {"run": os.system("touch MARKER"), "imported": side_effect.f(),
    "eval": builtins.eval("…")}."""
    return (
        b"\x80\x02}("
        + _text("run")
        + _global("os", "system")
        + _text(f"touch {marker}")
        + b"\x85R"
        + _text("imported")
        + _global("side_effect", "f")
        + b")R"
        + _text("eval")
        + _global("builtins", "eval")
        + _text(f"open({str(marker)!r}, 'w')")
        + b"\x85R"
        + b"u."
    )


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_nothing_a_pickle_names_is_imported_or_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fed straight to the reader, past the scanner: no call runs, no import happens."""
    marker = tmp_path / "MARKER"
    code = tmp_path / "code"
    code.mkdir()
    (code / "side_effect.py").write_text(f"open({str(marker)!r}, 'w').close()\nf = print\n")
    monkeypatch.syspath_prepend(str(code))
    real_import = __import__
    asked: list[str] = []

    def watch(name: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", watch)
    src = tmp_path / "evil.pkl"
    src.write_bytes(evil_pickle(marker))
    from ptconvert.pickles.stdlib_unpickler import RecordUnpickler

    with open(src, "rb") as fh:
        tree = RecordUnpickler(fh).load()
    monkeypatch.setattr("builtins.__import__", real_import)
    assert not marker.exists()
    assert "side_effect" not in sys.modules and not {"os", "side_effect"} & set(asked)
    run = tree["run"]
    assert isinstance(run, StandIn) and type(run).pickled_name == "os.system"
    assert run.pickled_args == ((f"touch {marker}",), {})
    assert isinstance(tree["imported"], StandIn) and isinstance(tree["eval"], StandIn)


def test_trust_never_unpickles_a_weights_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue: with --trust (and the scanner out of the way), verifying a conversion whose
    source torch's safe loader refuses must not fall back to torch.load(weights_only=False)."""
    marker = tmp_path / "MARKER"
    src = tmp_path / "evil.pt"
    torch.save(collections.OrderedDict(w=torch.arange(6.0).reshape(2, 3), hook=_Evil(marker)), src)
    assert not marker.exists()
    real_load = torch.load

    def safe_only(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("weights_only") is not True:
            raise AssertionError("torch.load without weights_only=True")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", safe_only)
    monkeypatch.setattr("ptconvert.convert.engine.refuse_unsafe", lambda *a, **k: None)
    monkeypatch.setattr("ptconvert.convert.engine.guard", lambda *a, **k: [])
    out = tmp_path / "evil.safetensors"
    report = convert_weights(src, "safetensors", out, trust=True)
    assert not marker.exists()
    assert report.weights.verification is not None and report.weights.verification.status == "pass"
    assert report.weights.verification.tensors == 1
    assert sorted(read_safetensors(out)) == ["w"]


class _BuiltTensor:
    """A tensor followed by a BUILD with the pickle's own arguments: torch's restricted
    unpickler runs ``tensor.set_(*state)`` (a gadget when ``set_`` sits in the tensor's
    ``__dict__``); on a record nothing may run, and nothing of it is taken as a tensor."""

    def __reduce__(self) -> tuple[Any, ...]:
        param = (torch.zeros(2), False, collections.OrderedDict())
        return (torch._utils._rebuild_parameter, param, ("/tmp/nowhere",))


def test_a_build_on_a_tensor_record_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "built.pt"
    torch.save({"w": _BuiltTensor()}, src)
    with pytest.raises(pickle.UnpicklingError, match="BUILD on a tensor record"):
        read_pickle_file(src)


def test_a_build_on_the_readers_own_globals_is_refused() -> None:
    """A BUILD on what find_class gives (``collections.defaultdict``, ``torch.Size``) must not
    set attributes on the reader's own class or function for the rest of the process."""
    from ptconvert.pickles.stdlib_unpickler import RecordUnpickler, _DefaultDict, size

    defaults = size.__defaults__
    for head in (b"ccollections\ndefaultdict\n", b"ctorch\nSize\n"):
        evil = b"\x80\x02" + head + b"N}X\x08\x00\x00\x00__init__cbuiltins\nlist\ns\x86b."
        with pytest.raises(pickle.UnpicklingError, match="BUILD on a global"):
            RecordUnpickler(io.BytesIO(evil)).load()
    assert "__init__" in vars(_DefaultDict) and size.__defaults__ == defaults
    benign = pickle.dumps({"d": collections.defaultdict(list, a=[1])}, protocol=2)
    assert RecordUnpickler(io.BytesIO(benign)).load() == {"d": {"a": [1]}}
