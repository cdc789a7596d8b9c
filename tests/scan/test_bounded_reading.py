"""Hostile pickles against the readers themselves (a security review: a pickle of a few hundred
bytes hung ``info``; a deeply nested one made it exit 1 with a RecursionError). Over every sample
of ``fixtures/hostile_reading.py``, as a plain pickle and as a torch zip's ``data.pkl``, each
command finishes within ``LIMIT`` seconds: ``info`` describes the file and says where it stopped
(or refuses it as unreadable, exit 3), never an internal error; ``scan`` grades what no reader
walks in bounded time "error", never "clean"; a conversion refuses with the named error of its
exit code and writes nothing.

Each command runs ``run_cli`` in a forked child, killed after ``LIMIT`` seconds: a hang inside C
code (the ``repr`` or ``hash`` of a tuple shared 2**40 ways) never returns to a signal handler.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from fixtures.hostile_reading import SAMPLES, torch_zip
from ptconvert.cli import main
from tests.conftest import run_cli

LIMIT = 30.0  # seconds per command; each takes about one

# What ``info`` says of where it stopped, the scan's verdict, the conversion's exit code.
NESTED = "nested deeper than 100 levels"
SHARED = "shared so often that naming them"
EXPECTED: dict[str, tuple[str | None, str, int]] = {
    "shared_tuples": (SHARED, "error", 3),  # hashing it: any unpickler hangs
    "shared_lists": (SHARED, "clean", 4),  # lists are not hashed: torch.load reads it at once
    "shared_tensor": (SHARED, "clean", 4),  # 262,144 names of one tensor: too many to convert
    "shared_key": (None, "error", 3),
    "shared_pid": ("not a reference to a stored storage", "error", 3),
    "shared_list_index": ("SETITEM on a list with key", "error", 3),  # info: unreadable (3)
    "shared_state_key": (None, "dangerous", 10),  # BUILD sets attributes no name spells
    "junk_shared_key": (None, "error", 3),
    "junk_shared_pid": ("not a reference to a stored storage", "error", 3),
    "deep_lists": (NESTED, "error", 3),
    "deep_tuples": (NESTED, "error", 3),
    "deep_dicts": (NESTED, "error", 3),
    "deep_key": (None, "error", 3),
    "deep_slot_state": (NESTED, "error", 3),
    "long_int": ("int of 33220 bits", "clean", 3),  # no tensors
    "wide_dim": ("does not fit in 64 bits", "clean", 4),
}
SCAN_EXIT = {"clean": 0, "error": 3, "dangerous": 10}


def bounded(argv: list[str], capsys: pytest.CaptureFixture[str], as_json: bool = True) -> Any:
    """``run_cli(argv)`` (or ``main`` without ``--json``: the table) in a forked child killed
    after ``LIMIT`` seconds: (exit code, output, end of stderr), or why there is none."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            if as_json:
                code, body, err = run_cli(argv, capsys)
            else:
                code = main(argv)
                body, err = capsys.readouterr()
        except BaseException as exc:  # what the CLI lets through
            code, body, err = -1, None, f"{type(exc).__name__}: {exc}"
        send.send((code, body, err[-2000:]))

    process = context.Process(target=child)
    process.start()
    send.close()  # the child's copy is the only one left: its death is an EOF here
    try:
        if not receive.poll(LIMIT):
            return f"still running after {LIMIT:.0f} s"
        return receive.recv()
    except EOFError:
        return f"died without a word (exit {process.exitcode})"
    finally:
        process.kill()
        process.join()


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    for name, make in SAMPLES.items():
        (root / f"{name}.pkl").write_bytes(make())
        (root / f"{name}.pt").write_bytes(torch_zip(make()))
    return root


def test_every_sample_has_its_expectations() -> None:
    assert set(EXPECTED) == set(SAMPLES)


def _why(got: Any) -> str:
    if isinstance(got, str):
        return got
    code, body, err = got
    return f"exit {code}: {err[-300:] if err.strip() else str(body)[:300]}"


@pytest.mark.parametrize("suffix", [".pkl", ".pt"], ids=["pickle", "zip"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_command_ends_and_says_why(
    samples: Path, name: str, suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(samples / f"{name}{suffix}")
    said, verdict, refused = EXPECTED[name]
    out = tmp_path / "out"
    out.mkdir()
    wrong: dict[str, str] = {}

    got = bounded(["info", src], capsys)
    if isinstance(got, str) or got[0] not in (0, 3):
        wrong["info --json"] = _why(got)
    elif said is not None and said not in json.dumps(got[1]):
        wrong["info --json"] = f"does not say {said!r}: {json.dumps(got[1])[-300:]}"

    got = bounded(["info", src], capsys, as_json=False)  # the table: rich wraps every note
    if isinstance(got, str) or got[0] not in (0, 3):
        wrong["info"] = _why(got)

    got = bounded(["scan", src], capsys)
    if isinstance(got, str) or (got[0], got[1].get("verdict")) != (SCAN_EXIT[verdict], verdict):
        wrong["scan"] = _why(got)

    got = bounded([src, "--to", "safetensors", "-o", str(out / "o.safetensors")], capsys)
    if isinstance(got, str) or got[0] != refused:
        wrong["--to safetensors"] = _why(got)
    elif got[1]["error"]["kind"] == "internal":
        wrong["--to safetensors"] = f"an internal error: {got[1]['error']}"

    written = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert wrong == {} and written == [], (wrong, written)
