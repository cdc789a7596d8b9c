"""onnxruntime, as the ONNX target's program runs in its own process (``isolated.Load``)."""

from __future__ import annotations

from typing import Any


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


def load(path: str, device: str) -> tuple[Any, list[str], list[str]]:
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
