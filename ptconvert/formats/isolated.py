"""Runtimes that may leak memory or crash (onnxruntime, AOTInductor, ExecuTorch) run in a
spawned process; each target's package says how its runtime loads a file (``Load``).

The child loads the artifact and answers calls over a pipe: named input arrays in, output arrays
out (numpy arrays we made ourselves, never a file's pickle). The child's end of the pipe is
closed in the parent, so a child that dies is seen at once (end of file), not after a timeout:
loading fails with ``RuntimeDiedError``, a call with the exit code. The parent is unharmed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from ptconvert import _compat
from ptconvert.errors import RuntimeDiedError
from ptconvert.spawn import die_with_parent, without_main

_TIMEOUT_S = 600  # a call that runs this long without answering is given up
_POLL_S = 0.5


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


# a target's runtime: (path, device) → (run on named arrays, the input names it takes or None,
# where it runs); a module-level function of the target's package (the child imports it)
Run = Callable[[dict[str, Any]], list[Any]]
Load = Callable[[str, str], tuple[Run, list[str] | None, list[str]]]


def _serve(kind: str, load: Load, path: str, device: str, conn: Any, parent: int) -> None:
    """Child process: load the runtime, then answer calls until told to stop (or killed with
    its parent, ``parent``: a runtime spinning in a load or a call is never left behind)."""
    die_with_parent(parent)
    sink = _captured_stderr()
    try:
        run, accepted, where = load(path, device)
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
                run(_from_wire(message[1]))
                conn.send(("ok", (time.perf_counter() - started) * 1000))
                continue
            conn.send(("ok", [_array(o) for o in run(_from_wire(message))]))
        except Exception as exc:  # reported to the parent as a failed call
            said = _said(sink)
            conn.send(("error", f"{type(exc).__name__}: {exc}{f' ({said})' if said else ''}"[:500]))
        else:
            _said(sink)


class IsolatedRuntime:
    """A callable on named tensors, backed by a spawned process that holds the runtime."""

    def __init__(
        self, kind: str, path: str, device: str = "cpu", *, load: Load, flat: bool = False
    ) -> None:
        """``kind``: the target's name, in messages; ``load``: its runtime (``Load``); ``flat``:
        nested inputs are fed flattened, as torch.onnx names them (``flat_inputs``)."""
        import multiprocessing as mp  # here: the registry imports this module (scan's start-up)

        self.kind, self.path, self.flat = kind, path, flat
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(kind, load, path, device, child, os.getpid()), daemon=True
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
        if not self._proc.is_alive():
            raise RuntimeError(f"the {self.kind} runtime's process has died")
        self._conn.send(self._feeds(kwargs))
        return tuple(_tensor(a) for a in self._expect("running"))

    def timed(self, **kwargs: Any) -> float:
        """One call timed inside the runtime's process (ms): the pipe is not the runtime's."""
        self._conn.send(("time", self._feeds(kwargs)))
        return float(self._expect("running"))

    def _feeds(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arrays sent to the runtime (nested inputs flattened for one that takes them so)."""
        flat = flat_inputs(kwargs) if self.flat else kwargs
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
    pytree = _compat.torch_api.pytree()
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if not isinstance(value, (list, tuple, dict)):
            out[name] = value
            continue
        for path, leaf in pytree.tree_flatten_with_path(value)[0]:
            keys = (getattr(k, "key", getattr(k, "idx", k)) for k in path)
            out["_".join([name, *map(str, keys)])] = leaf
    return out


# numpy has no bfloat16: such a tensor crosses the pipe as its bits, an int16 array, tagged
_BF16 = "bfloat16"


def _array(value: Any) -> Any:
    """A tensor as a numpy array (a bfloat16 one as ``(_BF16, its bits)``); Python scalars as
    0-d arrays of their own type."""
    import numpy as np

    if hasattr(value, "detach"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            return (_BF16, tensor.view(torch.int16).numpy())
        return tensor.numpy()
    return np.asarray(value)


def _tensor(value: Any) -> Any:
    """What ``_array`` made, as a torch tensor again."""
    import torch

    if isinstance(value, tuple) and value[0] == _BF16:
        return torch.from_numpy(value[1]).view(torch.bfloat16)
    return torch.from_numpy(value)


def _from_wire(message: dict[str, Any]) -> dict[str, Any]:
    """The child's feeds: numpy arrays as they came; bfloat16 ones as torch tensors (the
    runtimes that take them, AOTI's and ExecuTorch's, take ``torch.as_tensor`` of either)."""
    if not any(isinstance(v, tuple) and v[:1] == (_BF16,) for v in message.values()):
        return message
    return {
        k: _tensor(v) if isinstance(v, tuple) and v[:1] == (_BF16,) else v
        for k, v in message.items()
    }
