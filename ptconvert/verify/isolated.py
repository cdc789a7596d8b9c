"""Runtimes that may leak memory or crash (onnxruntime, AOTInductor) run in a spawned process.

The child loads the artifact and answers calls over a pipe: named input arrays in, output arrays
out (numpy arrays we made ourselves, never a file's pickle). If the child dies, the call fails
with what is known; the parent is unharmed.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from typing import Any

_TIMEOUT_S = 600


def _serve(kind: str, path: str, conn: Any) -> None:
    """Child process: load the runtime, then answer calls until told to stop."""
    import numpy as np

    if kind == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run(feeds: dict[str, Any]) -> list[Any]:
            return list(session.run(None, {n: feeds[n] for n in names}))

        accepted: list[str] | None = names
    else:
        import torch

        runner = torch._inductor.aoti_load_package(path)

        def run(feeds: dict[str, Any]) -> list[Any]:
            out = runner(*[torch.from_numpy(v) for v in feeds.values()])
            outs = out if isinstance(out, (list, tuple)) else [out]
            return [o.detach().cpu().numpy() for o in outs]

        accepted = None  # the package's call spec does not name its positional inputs

    conn.send(("ready", accepted))
    while True:
        message = conn.recv()
        if message is None:
            break
        try:
            conn.send(("ok", [np.asarray(o) for o in run(message)]))
        except Exception as exc:  # reported to the parent as a failed call
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:500]))


class IsolatedRuntime:
    """A callable on named tensors, backed by a spawned process that holds the runtime."""

    def __init__(self, kind: str, path: str) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(kind, path, child), daemon=True)
        self._proc.start()
        # the names of the inputs the runtime takes (ONNX: the session's); None when unknown
        self.input_names: list[str] | None = self._expect("ready")

    def _expect(self, what: str) -> Any:
        if not self._conn.poll(_TIMEOUT_S):
            raise RuntimeError(
                f"the isolated runtime did not answer (exit code {self._proc.exitcode})"
            )
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(
                f"the isolated runtime died (exit code {self._proc.exitcode})"
            ) from None
        if status == "error":
            raise RuntimeError(value)
        if what == "ready" and status != "ready":
            raise RuntimeError("the isolated runtime did not start")
        return value

    def __call__(self, **kwargs: Any) -> tuple[Any, ...]:
        import torch

        self._conn.send({k: v.detach().cpu().numpy() for k, v in kwargs.items()})
        return tuple(torch.from_numpy(a) for a in self._expect("ok"))

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(None)
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown there is nothing to clean
            self.close()
