"""Runtimes that may leak memory or crash (onnxruntime, AOTInductor, ExecuTorch) run in a
spawned process.

The child loads the artifact and answers calls over a pipe: named input arrays in, output arrays
out (numpy arrays we made ourselves, never a file's pickle). The child's end of the pipe is
closed in the parent, so a child that dies is seen at once (end of file), not after a timeout:
loading fails with ``RuntimeDiedError``, a call with the exit code. The parent is unharmed.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

from ptconvert.errors import RuntimeDiedError
from ptconvert.spawn import die_with_parent, without_main

_TIMEOUT_S = 600  # a call that runs this long without answering is given up
_POLL_S = 0.5


def session_options() -> Any:
    """The isolated runtime's onnxruntime options: errors only in its log (its warnings would
    join an error), and threads that sleep between calls instead of spinning: spinning, they
    shared the cores with eager in the parent while both were timed (bench, --to all), and
    eager came out far slower than measured alone."""
    import onnxruntime as ort

    from ptconvert.quiet import onnxruntime_quiet

    options = onnxruntime_quiet(ort.SessionOptions())
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def _onnx_runner(path: str, device: str) -> tuple[Any, list[str], list[str]]:
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(
                "onnxruntime has no CUDA provider here (the onnx extra installs the CPU "
                "build; install onnxruntime-gpu for --device cuda)"
            )
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(path, sess_options=session_options(), providers=providers)
    names = [i.name for i in session.get_inputs()]

    def run(feeds: dict[str, Any]) -> list[Any]:
        if feeds and not set(feeds) & set(names):  # named otherwise (TS2EP's x_1): by order
            return list(session.run(None, dict(zip(names, feeds.values(), strict=False))))
        return list(session.run(None, {n: feeds[n] for n in names if n in feeds}))

    return run, names, session.get_providers()


def _aoti_runner(path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    import torch
    from torch.utils import _pytree as pytree

    runner = torch._inductor.aoti_load_package(path)
    in_spec = pytree.treespec_loads(runner.loader.get_call_spec()[0])
    kwargs_spec = in_spec.children()[1] if in_spec.num_children == 2 else None
    keywords = list(getattr(kwargs_spec, "context", None) or [])

    def run(feeds: dict[str, Any]) -> list[Any]:
        tensors = {k: torch.from_numpy(v).to(device) for k, v in feeds.items()}
        if keywords:  # exported by keyword: the package binds the names itself
            out = runner(**{k: v for k, v in tensors.items() if k in keywords})
        else:
            out = runner(*tensors.values())
        return [o.detach().cpu().numpy() for o in pytree.tree_leaves(out)]

    return run, keywords or None, [device]


def _pte_runner(path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    """ExecuTorch's runtime: ``forward`` takes its inputs as one flat list, in the order of the
    exporter's pytree spec (by keyword: the spec's names; positionally: as given)."""
    import torch
    from executorch.runtime import Runtime

    from ptconvert.formats.pte_flatbuffer import forward_of, read_program

    names = forward_of(read_program(Path(path))).input_names
    method = Runtime.get().load_program(path).load_method("forward")
    if method is None:
        raise RuntimeError("the program has no forward method")

    def run(feeds: dict[str, Any]) -> list[Any]:
        order = [feeds[n] for n in names if n in feeds] if names else list(feeds.values())
        out = method.execute([torch.from_numpy(v) for v in order])
        return [o.detach().numpy() if isinstance(o, torch.Tensor) else o for o in out]

    return run, names, ["cpu"]


_RUNNERS = {"onnx": _onnx_runner, "aoti": _aoti_runner, "pte": _pte_runner}


def _captured_stderr() -> Any:
    """The child's fd 2 into a file of its own: a native runtime prints its reason there (AOTI:
    "input_handles[0]: dim value is too small …") before it throws a bare error; that reason
    goes into the error the parent gets, and nothing is printed on the user's terminal."""
    import os
    import tempfile

    sink = tempfile.TemporaryFile()  # noqa: SIM115 (open for the child's lifetime)
    os.dup2(sink.fileno(), 2)
    return sink


def _said(sink: Any) -> str:
    """The last line the runtime printed since the previous call, then forgotten."""
    sink.seek(0)
    lines = sink.read().decode(errors="replace").strip().splitlines()
    sink.seek(0)
    sink.truncate()
    return lines[-1].strip() if lines else ""


def _serve(kind: str, path: str, device: str, conn: Any, parent: int) -> None:
    """Child process: load the runtime, then answer calls until told to stop (or killed with
    its parent, ``parent``: a runtime spinning in a load or a call is never left behind)."""
    die_with_parent(parent)
    import numpy as np

    sink = _captured_stderr()
    try:
        run, accepted, where = _RUNNERS[kind](path, device)
    except Exception as exc:  # reported to the parent as a failed load
        said = _said(sink)
        conn.send(("error", f"{type(exc).__name__}: {exc}{f' ({said})' if said else ''}"[:1000]))
        return
    _said(sink)
    conn.send(("ready", (accepted, where)))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent went away
            break
        if message is None:
            break
        try:
            if isinstance(message, tuple):  # ("time", feeds): one call timed here, in ms
                started = time.perf_counter()
                run(message[1])
                conn.send(("ok", (time.perf_counter() - started) * 1000))
                continue
            conn.send(("ok", [np.asarray(o) for o in run(message)]))
        except Exception as exc:  # reported to the parent as a failed call
            said = _said(sink)
            conn.send(("error", f"{type(exc).__name__}: {exc}{f' ({said})' if said else ''}"[:500]))
        else:
            _said(sink)


class IsolatedRuntime:
    """A callable on named tensors, backed by a spawned process that holds the runtime."""

    def __init__(self, kind: str, path: str, device: str = "cpu") -> None:
        self.kind, self.path = kind, path
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(kind, path, device, child, os.getpid()), daemon=True
        )
        with without_main():  # the child runs ptconvert's code, never the caller's script
            self._proc.start()
        child.close()  # only the child holds its end: its death is an end of file here
        try:
            accepted, _where = self._expect("loading")
        except RuntimeError as exc:
            self.close()
            raise RuntimeDiedError(f"the {kind} runtime cannot load it: {exc}", path=path) from None
        # the names of the inputs the runtime takes (ONNX: the session's); None when unknown
        self.input_names: list[str] | None = accepted

    def _expect(self, doing: str) -> Any:
        waited = 0.0
        while not self._conn.poll(_POLL_S):
            waited += _POLL_S
            if not self._proc.is_alive() and not self._conn.poll():
                raise RuntimeError(f"its process died {doing} (exit code {self._proc.exitcode})")
            if waited >= _TIMEOUT_S:  # its late answer must not be read as the next one's
                self._proc.kill()
                raise RuntimeError(f"no answer after {_TIMEOUT_S} s {doing}")
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._proc.join(5)
            raise RuntimeError(
                f"its process died {doing} (exit code {self._proc.exitcode})"
            ) from None
        if status == "error":
            raise RuntimeError(value)
        return value

    def __call__(self, **kwargs: Any) -> tuple[Any, ...]:
        import torch

        if not self._proc.is_alive():
            raise RuntimeError(f"the {self.kind} runtime's process has died")
        self._conn.send(self._feeds(kwargs))
        return tuple(torch.from_numpy(a) for a in self._expect("running"))

    def timed(self, **kwargs: Any) -> float:
        """One call timed inside the runtime's process (ms): the pipe is not the runtime's."""
        self._conn.send(("time", self._feeds(kwargs)))
        return float(self._expect("running"))

    def _feeds(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arrays sent to the runtime: an ONNX graph takes nested inputs flattened."""
        flat = flat_inputs(kwargs) if self.kind == "onnx" else kwargs
        return {k: _array(v) for k, v in flat.items()}

    def __deepcopy__(self, memo: dict[int, Any]) -> IsolatedRuntime:
        # one process, one pipe: a copy would share the pipe's descriptor and close it when
        # collected (the "Bad file descriptor" of a second call); copies are this runtime
        return self

    def __copy__(self) -> IsolatedRuntime:
        return self

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(None)
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        with contextlib.suppress(OSError):
            self._conn.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown there is nothing to clean
            self.close()


def flat_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Nested inputs (a list, tuple or dict of tensors) flattened as torch.onnx flattens them:
    pytree order, each leaf named by its path (``feats_image``, ``extra_0``). A graph that
    names them otherwise (TorchScript's converter: ``extra_1_0``) is fed them in this order."""
    from torch.utils import _pytree as pytree

    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if not isinstance(value, (list, tuple, dict)):
            out[name] = value
            continue
        for path, leaf in pytree.tree_flatten_with_path(value)[0]:
            keys = (getattr(k, "key", getattr(k, "idx", k)) for k in path)
            out["_".join([name, *map(str, keys)])] = leaf
    return out


def _array(value: Any) -> Any:
    """A tensor as a numpy array; Python scalars as 0-d arrays of their own type."""
    import numpy as np

    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)
