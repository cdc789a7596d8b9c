"""A runtime for every file: something to call on named example inputs.

- weights formats with a model spec (or a Hugging Face directory): the eager module;
- program formats: the format's own ``open`` (``torch.jit.load``, ``torch.export.load``, an
  AOTInductor package or an onnxruntime session in a spawned process); a pt2's own sample
  inputs serve as example inputs;
- weights without a model spec: no runtime, compared bitwise instead.
Every file goes through the scanner first (native code needs ``--trust``). Every runtime says
which inputs it accepts (its ``Signature``): verify feeds both sides exactly the inputs the
candidate takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert.formats import detect
from ptconvert.formats.program import Signature, module_signature
from ptconvert.model.inputs import ExampleInputs
from ptconvert.options import Options
from ptconvert.scan.guard import guard

__all__ = ["Runtime", "Signature", "open_runtime"]


@dataclass
class Runtime:
    path: Path
    format: str
    call: Callable[..., Any] | None  # None: a weights file without a model
    module: Any = None  # an nn.Module when there is one (the fp64 reference needs it)
    inputs: ExampleInputs | None = None
    dynamic: bool = True  # accepts other batch sizes than its example
    max_batch: int | None = None  # the upper end of a bounded dynamic batch dimension
    signature: Signature | None = None  # None: not known (fed every example input)
    # how a copy of ``module`` becomes a call: a stateful model is run on a fresh copy each time
    call_of: Callable[[Any], Callable[..., Any]] | None = None
    exported: Any = None  # a pt2's ExportedProgram: its dynamic dims are checked at their ends
    isolated: bool = False  # runs in its own process, on the device it was opened for

    def close(self) -> None:
        """Stop the process an isolated runtime runs in."""
        close = getattr(self.call, "close", None)
        if close is not None:
            close()

    @property
    def input_names(self) -> list[str] | None:
        """The names of the inputs it accepts; None when it takes any name (or is unknown)."""
        if self.signature is None or self.signature.any_name:
            return None
        return list(self.signature.names)


def _same(module: Any) -> Any:
    return module


def open_runtime(path: str | Path, opts: Options) -> Runtime:
    from ptconvert.model import build

    path = Path(path)
    d = detect(path)
    fmt = d.handler
    if fmt.kind == "weights":
        eager = build.eager_runtime(path, d.format, opts)
        if eager is None:
            return Runtime(path, d.format, None)
        return Runtime(
            path,
            d.format,
            eager.reference,
            eager.reference,
            eager.inputs,
            # the model's own forward says what it accepts (not a named-outputs wrapper's)
            signature=module_signature(eager.module),
            call_of=_same,
        )
    guard(path, trust=opts.trust if fmt.runs_native_code else False)
    fmt.load_in_time(path, opts.load_timeout)  # code that runs at load: tried first, bounded
    program = fmt.open(path, opts.device)  # a runtime in its own process runs there
    inputs = build.user_inputs(opts)
    if inputs is None and program.exported is not None and program.exported.example_inputs:
        inputs = build.program_sample_inputs(program.exported)
    if inputs is None and program.input_specs:
        from ptconvert.model.inputs import from_declared

        inputs = from_declared(program.input_specs, opts.seed)
    return Runtime(
        path,
        d.format,
        program.call,
        program.module,
        inputs,
        program.dynamic,
        program.max_batch,
        program.signature,
        program.call_of,
        program.exported,
        fmt.isolated,
    )
