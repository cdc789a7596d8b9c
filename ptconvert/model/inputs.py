"""Example inputs: from ``--input`` specs, a file, a transformers model (``hf_inputs.py``), or the
model factory's own ``example_inputs``. Inputs are a function of the batch size, so that a program
can be checked at several sizes with the same recipe (seeded, reproducible).

``--input`` grammar (one argument each)::

    NAME:SHAPE:DTYPE             random: ints from [0, 100), floats N(0, 1), bools 0/1
    NAME:SHAPE:DTYPE:LOW:HIGH    ints drawn from [LOW, HIGH), floats uniform in [LOW, HIGH)
    NAME:SHAPE:DTYPE:=VALUE      a tensor filled with VALUE
    NAME::DTYPE=VALUE            a scalar argument: a plain Python int, float or bool

Dim 0 of a tensor is its batch; scalars are never batched. At the example's own batch every
input has the shape it was given; an input whose dim 0 is not the batch (a lookup table of fixed
rows) keeps it at every batch size once the conversion knows it is not batched (``pinned``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert.errors import MissingRequirementError, UsageError

INT_HIGH = 100  # integer inputs without a range are drawn from [0, INT_HIGH)

GRAMMAR = (
    "--input takes NAME:SHAPE:DTYPE (random), NAME:SHAPE:DTYPE:LOW:HIGH (drawn from "
    "[LOW, HIGH)), NAME:SHAPE:DTYPE:=VALUE (filled with VALUE) or NAME::DTYPE=VALUE (a scalar), "
    "e.g. x:2x3x224x224:float32, input_ids:2x16:int64:0:30522, labels:2:int64:=1, "
    "mask:2x16:bool:=1, sr::int64=16000"
)

Value = bool | int | float | complex

_NAME = re.compile(r"[A-Za-z_]\w*\Z")
_SHAPE = re.compile(r"\d+(?:x\d+)*\Z")
_DTYPE = re.compile(r"(?:torch\.)?[A-Za-z]\w*\Z")


@dataclass(frozen=True)
class InputSpec:
    """One named input. ``shape`` is ``()`` for a scalar (a Python value, needs ``value``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    low: float | None = None  # with ``high``: values drawn from [low, high)
    high: float | None = None
    value: Value | None = None  # a constant tensor's fill, or a scalar's value

    @property
    def scalar(self) -> bool:
        return not self.shape

    @property
    def batched(self) -> bool:
        return bool(self.shape)


def _usage(text: str, what: str) -> UsageError:
    return UsageError(f"--input {text!r}: {what}", hint=GRAMMAR)


def _torch_dtype(name: str, text: str) -> Any:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(
            f"--input {text!r}: unknown dtype {name!r}",
            hint="a torch dtype: float32, float16, bfloat16, float64, int64, int32, int8, "
            "uint8, bool",
        )
    return dtype


def _value(raw: str, dtype: Any, text: str, what: str = "value") -> Value:
    """``raw`` as the Python value of ``dtype``: ints stay ints (no silent truncation)."""
    try:
        if dtype.is_floating_point:
            return float(raw)
        if dtype.is_complex:
            return complex(raw)
        if str(dtype) == "torch.bool":
            flag = {"1": True, "true": True, "0": False, "false": False}.get(raw.lower())
            if flag is None:
                raise ValueError(raw)
            return flag
        return int(raw)
    except ValueError:
        kind = str(dtype).removeprefix("torch.")
        article = "an" if kind[0] in "aeiou" else "a"
        raise _usage(text, f"{what} {raw!r} is not {article} {kind} value") from None


def parse_input(text: str) -> InputSpec:
    """One ``--input`` argument (see the module's grammar)."""
    name, _, rest = text.partition(":")
    shape_text, sep, rest = rest.partition(":")
    if not _NAME.match(name) or not sep:
        raise _usage(text, "not NAME:SHAPE:DTYPE[:LOW:HIGH | :=VALUE] or NAME::DTYPE=VALUE")
    if not shape_text:  # NAME::DTYPE=VALUE: a scalar argument, never batched
        dtype_text, eq, raw = rest.partition("=")
        if not _DTYPE.match(dtype_text):
            raise _usage(text, f"{dtype_text!r} is not a dtype")
        dtype = _torch_dtype(dtype_text, text)
        if not eq or not raw:
            raise _usage(text, f"a scalar needs a value: {name}::{dtype_text}=VALUE")
        return InputSpec(
            name, (), dtype_text.removeprefix("torch."), value=_value(raw, dtype, text)
        )
    if not _SHAPE.match(shape_text):
        raise _usage(text, f"SHAPE {shape_text!r} is not sizes joined by 'x' (e.g. 2x3x224x224)")
    shape = tuple(int(s) for s in shape_text.split("x"))
    dtype_text, *extra = rest.split(":")
    if not _DTYPE.match(dtype_text):
        raise _usage(text, f"{dtype_text!r} is not a dtype")
    dtype = _torch_dtype(dtype_text, text)
    dtype_name = dtype_text.removeprefix("torch.")
    if not extra:
        return InputSpec(name, shape, dtype_name)
    if len(extra) == 1 and extra[0].startswith("=") and len(extra[0]) > 1:
        return InputSpec(name, shape, dtype_name, value=_value(extra[0][1:], dtype, text))
    if len(extra) == 2 and all(extra):
        # a bool range is drawn as integers, then cast: LOW/HIGH are ints for it as well
        kind = _torch_dtype("int64", text) if dtype_name == "bool" else dtype
        low = _value(extra[0], kind, text, "LOW")
        high = _value(extra[1], kind, text, "HIGH")
        if isinstance(low, complex) or isinstance(high, complex):
            raise _usage(text, "a range needs a real dtype")
        if not low < high:
            raise _usage(text, f"LOW {extra[0]} must be below HIGH {extra[1]}")
        return InputSpec(name, shape, dtype_name, low=low, high=high)
    raise _usage(text, "after DTYPE comes nothing, :LOW:HIGH or :=VALUE")


@dataclass
class ExampleInputs:
    """Named inputs, made for any batch size; ``batch`` is the size the recipe was given at."""

    make: Callable[[int], dict[str, Any]]
    batch: int
    source: str

    def at(self, batch: int) -> dict[str, Any]:
        return self.make(batch)


def pinned(inputs: ExampleInputs, names: Collection[str]) -> ExampleInputs:
    """``inputs`` with the tensors ``names`` kept as the example has them at every batch size:
    inputs whose dim 0 is not the batch (a table of fixed rows, a size the model asserts)."""
    example = inputs.at(inputs.batch)
    fixed = {n: example[n] for n in names if n in example}
    if not fixed:
        return inputs

    def make(batch: int) -> dict[str, Any]:
        made = inputs.make(batch)
        return made if batch == inputs.batch else {**made, **fixed}

    return ExampleInputs(make, inputs.batch, inputs.source)


def _check_spec(s: InputSpec, dtype: Any) -> None:
    import torch

    text = f"{s.name}:{'x'.join(map(str, s.shape))}:{s.dtype}"
    if s.scalar and s.value is None:
        raise _usage(f"{s.name}::{s.dtype}", f"a scalar needs a value: {s.name}::{s.dtype}=VALUE")
    if (s.low is None) != (s.high is None):
        raise _usage(text, "a range needs both LOW and HIGH")
    if s.low is not None and s.high is not None:
        if not s.low < s.high:
            raise _usage(text, f"LOW {s.low} must be below HIGH {s.high}")
        if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
            info = torch.iinfo(dtype)
            if s.low < info.min or s.high - 1 > info.max:
                raise _usage(text, f"[{s.low}, {s.high}) does not fit {s.dtype}")


def _python(value: Value, dtype: Any) -> Value:
    """A scalar as the plain Python type of its dtype (an int64 scalar is an ``int``)."""
    import torch

    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    if dtype.is_floating_point:
        return float(value.real if isinstance(value, complex) else value)
    return int(value.real if isinstance(value, complex) else value)


def _tensor(s: InputSpec, dtype: Any, rows: int, gen: Any) -> Any:
    import torch

    shape = (rows, *s.shape[1:])
    if s.value is not None:  # a constant: the same value at every batch size
        return torch.full(shape, _python(s.value, dtype), dtype=dtype)
    if dtype.is_floating_point or dtype.is_complex:
        if s.low is None or s.high is None:
            return torch.randn(shape, generator=gen).to(dtype)
        low, high = float(s.low), float(s.high)
        x = (torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low).to(dtype)
        if dtype.is_floating_point:  # rounding to a narrow dtype can reach HIGH: keep it open
            top = torch.nextafter(torch.tensor(high, dtype=dtype), torch.tensor(low, dtype=dtype))
            x = torch.minimum(x, top)
        return x
    low_i = int(s.low) if s.low is not None else 0
    high_i = int(s.high) if s.high is not None else (2 if dtype == torch.bool else INT_HIGH)
    if dtype == torch.bool:
        return torch.randint(low_i, high_i, shape, generator=gen).bool()
    return torch.randint(low_i, high_i, shape, generator=gen, dtype=dtype)


def from_declared(declared: list[Any], seed: int = 0) -> ExampleInputs | None:
    """Inputs for the shapes and dtypes a file declares (``IOSpec``: dims are ints or symbol
    names): a symbolic dim 0 is the batch (2), other symbolic dims 8; integers are drawn from
    {0, 1} (valid ids and flags). None when a declared input has no shape or dtype."""
    specs = []
    for d in declared:
        if d.shape is None or d.dtype is None or d.dtype in ("string",):
            return None
        shape = tuple(
            n if isinstance(n, int) and n > 0 else (2 if axis == 0 else 8)
            for axis, n in enumerate(d.shape)
        )
        integer = not d.dtype.startswith(("float", "bfloat", "complex"))
        low, high = (0, 2) if integer and d.dtype != "bool" else (None, None)
        specs.append(InputSpec(d.name, shape, d.dtype, low, high))
    return from_specs(specs, seed, source="the inputs the file declares") if specs else None


def from_specs(specs: list[InputSpec], seed: int = 0, source: str = "--input") -> ExampleInputs:
    """Inputs made from specs: seeded by ``seed`` and the batch size, so a batch size always
    gets the same tensors; the recipe's batch is the first batched tensor's dim 0."""
    dtypes = {s.name: _torch_dtype(s.dtype, s.name) for s in specs}
    for s in specs:
        _check_spec(s, dtypes[s.name])
    twice = sorted({s.name for s in specs if [t.name for t in specs].count(s.name) > 1})
    if twice:  # the later one would silently replace the earlier
        raise UsageError(f"--input names {', '.join(twice)} more than once", hint=GRAMMAR)

    example = next((s.shape[0] for s in specs if s.batched), 1)

    def make(batch: int) -> dict[str, Any]:
        import torch

        gen = torch.Generator().manual_seed(seed + batch)
        out: dict[str, Any] = {}
        for s in specs:
            dtype = dtypes[s.name]
            if s.scalar:
                assert s.value is not None
                out[s.name] = _python(s.value, dtype)
            else:  # at the example's batch, the shape given (a table's rows are not a batch)
                out[s.name] = _tensor(s, dtype, s.shape[0] if batch == example else batch, gen)
        return out

    return ExampleInputs(make, example, source)


def from_file(path: Path) -> ExampleInputs:
    """Inputs saved in a safetensors file (or a weights-only torch file): used as they are."""
    from ptconvert.scan.guard import guard
    from ptconvert.weights.read import as_tensors, read_weights

    guard(path)
    tensors = as_tensors(read_weights(path, keep_prefix=True))
    batch = next((t.shape[0] for t in tensors.values() if _dims(t) > 0), 1)

    def make(b: int) -> dict[str, Any]:
        if b == batch:
            return dict(tensors)
        return {k: resize_batch(v, b) for k, v in tensors.items()}

    return ExampleInputs(make, batch, str(path))


def _dims(value: Any) -> int:
    """A tensor's number of dims; 0 for a plain value (a scalar argument)."""
    dim = getattr(value, "dim", None)
    return int(dim()) if callable(dim) else 0


def resize_batch(t: Any, batch: int) -> Any:
    """``t`` with ``batch`` rows: its rows repeated (or cut), for checks at other batch sizes.
    A scalar (0-dim tensor or plain value) is returned unchanged."""
    import torch

    if _dims(t) == 0:
        return t
    reps = -(-batch // t.shape[0])
    return torch.cat([t] * reps)[:batch]


# --- naming missing inputs -----------------------------------------------------------------


class _Required(str):
    """A required argument's name that remembers its annotation, for the ``--input`` hint."""

    annotation: str = ""


def _named(name: str, annotation: Any) -> str:
    arg = _Required(name)
    if annotation is not inspect.Parameter.empty and annotation is not None:
        arg.annotation = getattr(annotation, "__name__", None) or str(annotation)
    return arg


def required_inputs(fn: Any) -> list[str]:
    """The required arguments (no default) of a Python callable, a module's forward, or a
    TorchScript module's ``forward.schema`` (after ``self``), in order. The names are ``str``s
    that also carry their annotation, for ``check_provided``'s hint."""
    schema = getattr(getattr(fn, "forward", None), "schema", None) or getattr(fn, "schema", None)
    if schema is not None and hasattr(schema, "arguments"):  # TorchScript
        args = list(schema.arguments)
        if args and args[0].name == "self":
            args = args[1:]
        return [_named(a.name, str(a.type)) for a in args if not a.has_default_value()]
    target = getattr(fn, "forward", fn) if not inspect.isroutine(fn) else fn
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: nothing known
        return []
    if params and params[0].name == "self":  # an unbound method
        params = params[1:]
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        _named(p.name, p.annotation)
        for p in params
        if p.kind not in skip and p.default is inspect.Parameter.empty
    ]


_SCALARS = {"int": "int64", "float": "float32", "bool": "bool"}


def input_line(name: str) -> str:
    """The ``--input`` line for a required argument: a scalar for an int/float/bool annotation
    (``NAME::int64=VALUE``), else a tensor (``NAME:SHAPE:DTYPE``)."""
    annotation = getattr(name, "annotation", "").removeprefix("builtins.")
    dtype = _SCALARS.get(annotation)
    return f"{name}::{dtype}=VALUE" if dtype else f"{name}:SHAPE:DTYPE"


def check_provided(required: list[str], provided: dict[str, Any], where: Path | None) -> None:
    """Raise MissingRequirementError naming each required argument ``provided`` lacks."""
    missing = [n for n in required if n not in provided]
    if not missing:
        return
    names = ", ".join(repr(str(n)) for n in missing)
    have = ", ".join(map(repr, provided)) or "none"
    raise MissingRequirementError(
        f"the model needs the input{'s' if len(missing) > 1 else ''} {names}, which the example "
        f"inputs do not provide (they have {have})",
        path=where,
        hint="pass " + " ".join(f"--input {input_line(n)}" for n in missing),
    )
