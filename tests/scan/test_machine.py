"""The symbolic pickle machine: resolves imports like the real unpickler, never runs them."""

from __future__ import annotations

import os
import pickle
import pickletools
from pathlib import Path

import pytest

from ptconvert.pickles.allowlist import classify
from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.records import Call, Global
from ptconvert.pickles.torch_streams import run_torch_pickles


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_never_executes_a_payload(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps({"x": _Payload(marker)}, protocol=2)
    run = run_pickle(data)
    assert run.error is None
    call = run.root.items[0][1]
    assert isinstance(call, Call) and isinstance(call.func, Global)
    assert (call.func.module, call.func.name) == ("posix", "system")
    assert classify("posix", "system") == "dangerous"
    assert not marker.exists()


def test_stack_global_through_the_memo() -> None:
    # module and name memoised first, fetched back with BINGET before STACK_GLOBAL
    body = (
        b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94"  # PROTO 4, 'os' MEMOIZE, 'system' MEMOIZE
        b"0"  # POP ('system' stays in the memo)
        b"0"  # POP
        b"h\x00h\x01\x93\x8c\x04echo\x85R."  # BINGET 0, BINGET 1, STACK_GLOBAL, args, REDUCE
    )
    pickletools.dis(body)  # a valid pickle
    run = run_pickle(body)
    assert [(g.module, g.name) for g in run.imports] == [("os", "system")]


def test_non_constant_stack_global_is_unresolved() -> None:
    body = b"\x80\x04K\x01\x8c\x06system\x93."  # module is an int
    run = run_pickle(body)
    (g,) = run.imports
    assert g.module is None and g.reason and "not a constant string" in g.reason


def test_missing_memo_slot_is_unknown() -> None:
    run = run_pickle(b"\x80\x02h\x07.")
    assert any(e.kind == "unknown" and "memo slot 7" in e.detail for e in run.events)


def test_every_concatenated_pickle_is_read() -> None:
    data = pickle.dumps(1, protocol=2) + pickle.dumps({"a": 1}, protocol=4)
    runs = run_torch_pickles(data)
    assert len(runs) == 2 and runs[0].root == 1 and runs[1].root.items == [("a", 1)]


@pytest.mark.parametrize("protocol", range(6))
def test_all_protocols_parse(protocol: int) -> None:
    import collections

    data = pickle.dumps(collections.OrderedDict(a=[1, 2.5, "x", b"y", (None, True)]), protocol)
    run = run_pickle(data)
    assert run.error is None
    assert classify(*next((g.module or "", g.name or "") for g in run.imports)) == "safe"


def test_truncated_pickle_is_reported_not_raised() -> None:
    run = run_pickle(pickle.dumps(list(range(50)), protocol=2)[:-5])
    assert run.error and run.truncated


def test_dotted_names_are_checked_per_component() -> None:
    assert classify("pathlib", "os.system") == "dangerous"
    assert classify("__builtin__", "eval") == "dangerous"
    assert classify("mypkg.models", "Net") == "needs-code"


def test_setitem_on_a_list_is_what_cpython_does() -> None:
    # [1, 2] then SETITEM 0 = 'x' (list.__setitem__), then a payload the machine must still see
    body = b"(K\x01K\x02lK\x00\x8c\x01xs0cos\nsystem\n\x8c\x04echo\x85R."
    assert pickle.loads(body[: body.index(b"0")] + b".") == ["x", 2]
    run = run_pickle(body)
    assert run.error is None
    assert [(g.module, g.name) for g in run.imports] == [("os", "system")]
    # an index out of range fails where CPython fails
    assert "SETITEM on a list" in (run_pickle(b"(K\x01lK\x05K\x00s.").error or "")


@pytest.mark.parametrize(
    ("value", "dotted"),
    [(range(3), "builtins.range"), (int, "builtins.int"), (str, "builtins.str")],
)
def test_protocol_2_python2_names_are_mapped_like_cpython(value: object, dotted: str) -> None:
    run = run_pickle(pickle.dumps(value, protocol=2))
    assert dotted in [g.dotted for g in run.imports]
    assert all(classify(g.module or "", g.name or "") == "safe" for g in run.imports)


def test_torch_runs_five_legacy_pickles_whatever_their_framing() -> None:
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf, _use_new_zipfile_serialization=False, pickle_protocol=4)
    runs = run_torch_pickles(buf.getvalue())
    assert len(runs) == 5 and all(r.error is None for r in runs)
    # a plain pickle followed by bytes that are not a pickle: one run, the rest never parsed
    runs = run_torch_pickles(pickle.dumps({"a": 1}, protocol=0) + b"\x00\x01garbage")
    assert len(runs) == 1
    # a protocol-0 pickle after a protocol-2 one is read, as a pickle.load loop would
    runs = run_torch_pickles(pickle.dumps(1, protocol=2) + b"cos\nsystem\n(Vx\ntR.")
    assert [g.dotted for g in runs[1].imports] == ["os.system"]


@pytest.mark.parametrize(
    ("text", "value"),
    [(b"I0x10\n.", 16), (b"I010\n.", 8), (b"I12\x00junk\n.", 12), (b"L0x1fL\n.", 31)],
)
def test_text_numbers_are_read_as_cpythons_unpickler_reads_them(text: bytes, value: int) -> None:
    assert pickle.loads(text) == value  # pickletools.genops refuses the first three
    run = run_pickle(text)
    assert run.error is None and run.root == value
