"""module → ExportedProgram with torch.export, routing around the known traps.

- Non-strict first, strict as the fallback (``--strict strict`` / ``non-strict`` pin one).
- ``--dynamic-batch``: dim 0 of every batched input is ``Dim.DYNAMIC``; an example at batch 1 is
  re-traced at batch 2, because tracing specialises sizes 0 and 1 (the program still accepts
  batch 1 at run time). ``--dynamic NAME:AXIS[:MIN:MAX]`` adds other dims.
- ``--dynamic-batch`` on a Hugging Face model also makes the axes its family varies dynamic
  (``model.axes``: text and decoder sequences, a waveform's samples, an image's height and
  width, as optimum names them, each up to the config's limit); ``--static-sequence`` keeps
  them fixed, and axes the model's export fixes are given up (those the error names first, else
  the last) and exported at the example's size (a note says so).
- A Hugging Face model exports with ``use_cache=False`` (cache objects are not pytrees).
- ``state.bounds`` (the range verification found to hold, where the first program ran wrong
  outside it) become the dims' min/max; a minimum of 2 also becomes a guard, since torch lets
  sizes 0 and 1 through a minimum of 2 at run time.
Each repair is written to the run's notes.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ptconvert import _compat
from ptconvert.convert.state import Bounds, RunState
from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.model.axes import Axis
from ptconvert.model.inputs import ExampleInputs
from ptconvert.model.wrappers import named_outputs, positional_names
from ptconvert.options import DYNAMIC_SPEC, ExportMode, Options
from ptconvert.quiet import quiet_torch

AXES_NOTE = "dynamic with --dynamic-batch: "


def family_axes(module: Any, opts: Options, sample: dict[str, Any]) -> list[Axis]:
    """The axes made dynamic with ``--dynamic-batch``: those of a transformers model's family
    (``model.axes``), unless ``--static-sequence``; an axis one of the user's own ``--dynamic``
    names, or whose example is longer than the config allows (the user's choice), is left out."""
    from ptconvert.model.axes import model_axes

    if not opts.dynamic_batch or opts.static_sequence:
        return []
    named = {m["name"] for m in map(DYNAMIC_SPEC.match, opts.dynamic) if m is not None}
    return [
        a
        for a in model_axes(module, sample)
        if a.dims
        and not named & {n for n, _ in a.dims}
        and all(a.low <= sample[n].shape[d] <= (a.high or sample[n].shape[d]) for n, d in a.dims)
    ]


def _hint(axis: Axis) -> Any:
    from torch.export import Dim

    # min 1 for a bounded text axis: torch keeps 2 as the range's floor, and verification runs
    # 1 (``probed_at_one``); a floor above 2 (a waveform's shortest) is the model's own
    if axis.high:
        return Dim.DYNAMIC(min=axis.low, max=axis.high)
    return Dim.DYNAMIC(min=axis.low) if axis.low > 2 else Dim.DYNAMIC


def dynamic_shapes(
    opts: Options,
    sample: dict[str, Any],
    bounds: Bounds | None = None,
    axes: Sequence[Axis] = (),
    fixed_rows: Collection[str] = (),
) -> dict[str, Any] | None:
    """The ``dynamic_shapes`` of an export of ``sample`` (None: static). ``fixed_rows``: inputs
    whose dim 0 ``--dynamic-batch`` leaves as given (the model fixes their rows: a table it
    asserts; ``export_module`` finds them), unless ``--dynamic`` names it."""
    from torch.export import Dim

    if not opts.dynamic_batch and not opts.dynamic:
        return None
    shapes: dict[str, Any] = {name: None for name in sample}
    if opts.dynamic_batch:
        for name, t in sample.items():
            if getattr(t, "dim", lambda: 0)() > 0 and name not in fixed_rows:
                shapes[name] = {0: Dim.DYNAMIC}
    for family in axes:
        hint = _hint(family)
        for name, dim in family.dims:
            shapes[name] = {**(shapes[name] or {}), dim: hint}
    tied = _tied_batch(opts, sample, axes, bounds or {})
    for name in tied:
        if name not in fixed_rows:
            shapes[name] = {**(shapes[name] or {}), 0: tied[name]}
    for spec in opts.dynamic:
        m = DYNAMIC_SPEC.match(spec)
        if m is None or m["name"] not in sample:
            raise UsageError(
                f"--dynamic {spec!r} is not NAME:AXIS[:MIN:MAX] of a known input",
                hint=f"the inputs are {', '.join(sample)}",
            )
        axis = int(m["axis"])
        rank = getattr(sample[m["name"]], "dim", lambda: 0)()
        if axis >= rank:
            raise UsageError(f"--dynamic {spec!r}: {m['name']} has {rank} dims (axes 0–{rank - 1})")
        if m["min"] and int(m["min"]) > int(m["max"]):
            raise UsageError(f"--dynamic {spec!r}: MIN is larger than MAX")
        size = sample[m["name"]].shape[axis]
        if m["min"] and not int(m["min"]) <= size <= int(m["max"]):
            raise UsageError(
                f"--dynamic {spec!r}: the example's {m['name']} dim {axis} is {size}, outside "
                f"{m['min']}–{m['max']}",
                hint="give an example inside the range (--input), or widen the range",
            )
        # DYNAMIC (not a named Dim): torch works out which dims must be equal (a sequence
        # length shared by input_ids and attention_mask) and fails if one gets specialised
        dim = Dim.DYNAMIC(min=int(m["min"]), max=int(m["max"])) if m["min"] else Dim.DYNAMIC
        shapes[m["name"]] = {**(shapes[m["name"]] or {}), axis: dim}
    for (name, axis), (low, high) in (bounds or {}).items():
        if name in shapes and not (axis == 0 and name in tied):
            shapes[name] = {**(shapes[name] or {}), axis: Dim.DYNAMIC(min=low, max=high)}
    return shapes


def _where(axis: Axis) -> str:
    name, dim = axis.dims[0]
    return f"{name} dim {dim}"


def _tied_batch(
    opts: Options, sample: dict[str, Any], axes: Sequence[Axis], bounds: Bounds
) -> dict[str, Any]:
    """One ``batch_size`` for a transformers model's token inputs (encoder's and decoder's), as
    optimum exports them: torch otherwise gives a mask its own batch symbol where the model
    does not force it equal (Llama, T5), and an AOTInductor package then took a mask of one row
    for two rows of ids and aborted the process inside its attention kernel."""
    from torch.export import Dim

    if not opts.dynamic_batch:
        return {}
    names = [
        n
        for a in axes
        if a.name in ("sequence_length", "decoder_sequence_length")
        for n, _ in a.dims
        if getattr(sample.get(n), "dim", lambda: 0)() > 1
    ]
    if len(names) < 2:
        return {}
    known = [bounds[(n, 0)] for n in names if (n, 0) in bounds]
    low, high = known[0] if known else (1, None)  # a named Dim's floor is 0 otherwise
    batch = Dim("batch_size", min=low, max=high)  # one symbol: the program checks they agree
    return dict.fromkeys(names, batch)


# ``--export-mode``: the ``strict`` flags tried, in order, until one exports
EXPORT_MODES: dict[ExportMode, tuple[bool, ...]] = {
    "auto": (False, True),
    "strict": (True,),
    "non-strict": (False,),
}


class ExportFailed(Exception):
    """Every mode of an ``--export-mode`` failed (``export_in_mode``): the message names each
    mode's first line, ``non-strict: TypeError: …; strict: Unsupported: …``."""


def export_once(
    module: Any,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    shapes: Any = None,
    *,
    strict: bool,
) -> Any:
    """``module`` exported once, strict or not: ptconvert's one call of ``torch.export.export``
    (every route's export comes here, so ``--export-mode`` reaches them all)."""
    import torch

    with quiet_torch():
        return torch.export.export(
            module, tuple(args), kwargs, dynamic_shapes=shapes, strict=strict
        )


def export_in_mode(
    module: Any, args: Sequence[Any], kwargs: dict[str, Any] | None, shapes: Any, mode: ExportMode
) -> Any:
    """``module`` exported in each mode of ``mode`` (``EXPORT_MODES``) until one succeeds. The
    failure of a single mode is raised as torch raised it; that of several as ``ExportFailed``
    naming each, as ``export_module`` words them."""
    failures: list[Exception] = []
    for strict in EXPORT_MODES[mode]:
        try:
            return export_once(module, args, kwargs, shapes, strict=strict)
        except Exception as exc:  # torch raises many kinds here; the caller words them
            failures.append(exc)
    if len(failures) == 1:
        raise failures[0]
    raise ExportFailed(
        "; ".join(
            f"{_mode_word(strict)}: {_first_line(exc)}"
            for strict, exc in zip(EXPORT_MODES[mode], failures, strict=True)
        )
    ) from None


def wrapper_mode(mode: ExportMode) -> ExportMode:
    """The mode of a generation export (transformers' static-cache and seq2seq wrappers, the
    decoders with past): ``auto`` is non-strict only. A strict export of a wrapper non-strict
    refused can succeed and then fail when run (OPT's static cache: a runtime assertion on its
    positions), so auto does not fall back to it; ``--export-mode strict`` still asks for it."""
    return "non-strict" if mode == "auto" else mode


def _mode_word(strict: bool) -> str:
    return "strict" if strict else "non-strict"


def export_module(state: RunState, opts: Options, inputs: ExampleInputs) -> Any:
    module, wrapped = state.module, hasattr(state.module, "config")
    # A program takes its inputs either positionally or by keyword, not both. A model whose
    # forward takes them as its leading parameters is exported positionally, as it is called;
    # a transformers model by keyword, as it is called (``model(**tokenizer(text))``).
    names = positional_names(module, list(inputs.at(1)))
    if wrapped:  # transformers: plain dict outputs, no cache objects
        module = named_outputs(module, names or list(inputs.at(1)))
        names = None
        state.notes.append(
            "exported a wrapper: outputs a dict of tensors (loads without transformers)"
            + (", use_cache=False (caches are not pytrees)" if module.no_cache else "")
            + ", inputs by keyword"
        )
    batch = inputs.batch
    if opts.dynamic_batch and batch < 2:
        batch = 2
        state.notes.append(
            "the example has batch 1, which torch.export specialises: traced at batch 2 with a "
            "dynamic batch dimension (batch 1 still runs)"
        )
    inputs = away_from_the_minimum(state, opts, inputs)
    sample = inputs.at(batch)
    axes = family_axes(state.module, opts, sample) if wrapped and not state.static_axes else []
    fixed_rows: list[str] = []  # inputs whose rows the model fixes, found by the export
    shapes: Any = dynamic_shapes(opts, sample, state.bounds, axes)
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = sample
    if names is not None:  # forward(x, …): export positionally, as users will call it
        args, kwargs = tuple(sample[n] for n in names), None
        shapes = tuple(shapes[n] for n in names) if shapes is not None else None
        state.positional = names
    modes = EXPORT_MODES[opts.strict]
    errors: list[str] = []
    said: list[str] = []  # the errors' whole texts: torch names an input past the first line
    where: str | None = None
    attempts = [(strict, False) for strict in modes]
    while attempts:
        strict, cloned = attempts.pop(0)
        try:
            with _time_limited(AXES_SECONDS if axes else None):
                ep = export_once(module, args, kwargs, shapes, strict=strict)
        except (Exception, _TooLong) as exc:  # torch raises many kinds here; each is reported
            if isinstance(exc, _TooLong):  # every mode would reason over the same axes
                attempts = []
            why = str(exc) if isinstance(exc, _TooLong) else _first_line(exc)
            errors.append(f"{_mode_word(strict)}: {why}")
            said.append(str(exc))
            where = where or _source_line(str(exc))
            if not cloned and _FROZEN.search(str(exc)):
                # the model writes into an input whose storage is frozen (an inference tensor,
                # an expanded view): retry with the inputs cloned, for eager as well
                inputs = _cloned(inputs)
                state.inputs = inputs
                sample = inputs.at(batch)
                if names is not None:
                    args = tuple(sample[n] for n in names)
                else:
                    kwargs = sample
                state.notes.append(
                    "the model writes into an input in place"
                    + (f" (at {where})" if where else "")
                    + " and the example inputs were frozen (inference tensors or shared "
                    "storage): retried with the inputs cloned"
                )
                attempts = [(s, True) for s in modes]
                continue
            rows = _fixed_rows(" ".join(said), sample, opts, fixed_rows) if not attempts else []
            if rows:
                # --dynamic-batch made every input's dim 0 the batch; torch says the model fixes
                # these inputs' rows (a table it asserts): exported with them as given
                state.notes.append(
                    "--dynamic-batch: "
                    + ", ".join(f"{n} ({_rows(sample[n].shape[0])})" for n in rows)
                    + " not batched: torch.export found the rows fixed by the model (a size it "
                    "asserts, a row it broadcasts): exported with them as given"
                )
                fixed_rows += rows
                errors, said, where = [], [], None
                shapes = dynamic_shapes(opts, sample, state.bounds, axes, fixed_rows)
                if names is not None and shapes is not None:
                    shapes = tuple(shapes[n] for n in names)
                attempts = [(s, cloned) for s in modes]
                continue
            if axes and not attempts:
                # the family's axes were made dynamic by default, not asked for: the model
                # fixes one (a size it asserts, a position table); exported at the example's
                # size on that axis (the one the error names, else the last)
                fixed = _fixed_axes(axes, " ".join(errors))
                state.notes.append(
                    f"{' and '.join(a.name for a in fixed)} could not be dynamic "
                    f"({'; '.join(errors)[:300]}): exported at the example's "
                    + ", ".join(
                        f"{n} dim {d} = {sample[n].shape[d]}" for a in fixed for n, d in a.dims
                    )
                    + " (--static-sequence says so up front)"
                )
                axes = [a for a in axes if a not in fixed]
                errors, said, where = [], [], None
                shapes = dynamic_shapes(opts, sample, state.bounds, axes, fixed_rows)
                if names is not None and shapes is not None:
                    shapes = tuple(shapes[n] for n in names)
                attempts = [(s, cloned) for s in modes]
            continue
        if errors and strict and not cloned:
            state.notes.append(f"non-strict export failed, strict export succeeded ({errors[0]})")
        _refuse_below_two(ep, state.bounds)
        state.dynamic_range = dynamic_range_words(ep)
        state.family_axes = list(axes)
        if axes:  # the sizes the program takes, which torch may have narrowed from those asked
            state.notes.append(
                AXES_NOTE
                + "; ".join(a.words(state.dynamic_range.get(_where(a))) for a in axes)
                + "; --static-sequence keeps the example's sizes"
            )
        return ep
    draft = _draft_report(module, args, kwargs, shapes)
    raise UnsupportedConversionError(
        "torch.export failed"
        + (f" at {where}" if where else "")
        + ": "
        + "; ".join(errors)
        + (f"; draft_export: {draft}" if draft else ""),
        path=state.src,
        hint=_fix_for(errors, opts),
    )


def away_from_the_minimum(state: RunState, opts: Options, inputs: ExampleInputs) -> ExampleInputs:
    """An example at the minimum of a ``--dynamic`` range is traced at a size inside it: at the
    smallest image a network's last feature map is often 1 wide, and torch.export fixes such a
    size, so the program would take that one size only. The range check after the conversion
    says which sizes run (the minimum itself may not)."""
    from ptconvert.verify.probes import resize

    sample = inputs.at(inputs.batch)
    sizes: dict[tuple[str, int], int] = {}
    for spec in opts.dynamic:
        m = DYNAMIC_SPEC.match(spec)
        if m is None or not m["min"] or m["name"] not in sample:
            continue
        axis, low, high = int(m["axis"]), int(m["min"]), int(m["max"])
        t = sample[m["name"]]
        if getattr(t, "dim", lambda: 0)() > axis and t.shape[axis] == low and high > low:
            sizes[(m["name"], axis)] = min(high, max(low + 1, round((low * high) ** 0.5)) | 1)
    if not sizes:
        return inputs
    state.notes.append(
        "the example is at the minimum of a --dynamic range, where a trace fixes sizes "
        "that come out as 1: traced at "
        + ", ".join(f"{n} dim {a} = {v}" for (n, a), v in sizes.items())
    )
    batch, others = inputs.batch, sizes
    rows = {v for (_, axis), v in sizes.items() if axis == 0}
    if len(rows) == 1:  # the batch itself moved: the example's batch is that size, and every
        # other batch size stays itself (resizing dim 0 too would make them all one shape)
        (batch,) = rows
        others = {k: v for k, v in sizes.items() if k[1] != 0}
    moved = ExampleInputs(
        lambda b: resize(inputs.make(b), others), batch, f"{inputs.source} (resized)"
    )
    state.inputs = moved
    return moved


# the family's axes (made dynamic by default, not asked for) are given up when torch.export's
# reasoning over them takes longer: SAM2's height and width kept sympy busy for over 15 minutes
# where its export with a dynamic batch alone takes seconds
AXES_SECONDS = 180.0


class _TooLong(BaseException):
    """Past the time limit: a BaseException, so that no ``except Exception`` in torch's
    tracing swallows it (the timer fires again every second until the block ends)."""


@contextmanager
def _time_limited(seconds: float | None) -> Iterator[None]:
    """Raise ``_TooLong`` in the block once ``seconds`` have passed (SIGALRM: the main thread
    of a POSIX process only, with no other timer set; elsewhere, or with None, no limit)."""
    import signal
    import threading

    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not seconds or not usable or signal.getitimer(signal.ITIMER_REAL)[0]:
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise _TooLong(
            f"torch.export's shape reasoning over the family's axes ran past {seconds:.0f} s"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _refuse_below_two(ep: Any, bounds: Bounds) -> None:
    """A dim bounded at 2 refuses 0 and 1: torch checks a minimum of 2 nowhere (it lets those
    sizes through at run time, its 0/1 specialisation), so the program gets a guard of its own,
    which ``torch.export.save`` keeps and ``.module()`` asserts on every call (AOTInductor's
    input checks read the minimum itself)."""
    for (name, axis), (low, _high) in bounds.items():
        if low == 2:
            _compat.torch_api.add_guard(ep, f"L[{name!r}].size()[{axis}] >= 2")


_FROZEN = re.compile(r"[Ii]nference tensor|single memory location|refers to a single memory")


def _cloned(inputs: ExampleInputs) -> ExampleInputs:
    def make(b: int) -> dict[str, Any]:
        return {k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.make(b).items()}

    return ExampleInputs(make, inputs.batch, f"{inputs.source} (cloned)")


_SOURCE = re.compile(
    r"File:? \"?(?P<file>[^\s\",]+)\"?(?::|, line )(?P<line>\d+)[^\n]*?code: (?P<code>[^\n]+)"
)


def _source_line(text: str) -> str | None:
    """The user's source line torch blames (``file.py:56 (if x.mean() > 0:)``), if it says."""
    m = _SOURCE.search(text)
    return f"{m['file']}:{m['line']} ({m['code'].strip()})" if m else None


def _draft_report(module: Any, args: Any, kwargs: Any, shapes: Any) -> str | None:
    """torch.export.draft_export lists every issue at once: the first lines of its report."""
    import torch

    try:
        with quiet_torch():
            ep = torch.export.draft_export(module, args, kwargs, dynamic_shapes=shapes)
    except Exception as exc:  # draft export can fail too; then there is no report to attach
        return _first_line(exc)
    report = _compat.torch_api.draft_report(ep)
    if report is None or not getattr(report, "failures", None):
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(report))  # drop terminal colours
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("#")]
    return " | ".join(lines[:6])[:600]


# torch.export's words for a dim 0 it was told is dynamic and found fixed: "Constraints
# violated (L['table'].size()[0])"; "0/1 specialized due to hint of 1 for dimension
# inputs['pos'].shape[0]" (a row broadcast over the batch)
_VIOLATED_ROWS = re.compile(
    r"L\['(?:kwargs'\]\[')?(\w+)'\]\.size\(\)\[0\]|inputs\['(\w+)'\]\.shape\[0\]"
)
_FIXED_WORDS = ("Constraints violated", "specialized due to hint of 1")


def _fixed_rows(
    error: str, sample: dict[str, Any], opts: Options, fixed: Collection[str]
) -> list[str]:
    """The inputs whose dim 0 ``--dynamic-batch`` made dynamic and the export found fixed by
    the model (named in torch's constraint violation); not one ``--dynamic NAME:0`` asks for."""
    if not opts.dynamic_batch or not any(w in error for w in _FIXED_WORDS):
        return []
    asked = {m["name"] for m in map(DYNAMIC_SPEC.match, opts.dynamic) if m and m["axis"] == "0"}
    found = dict.fromkeys(a or b for a, b in _VIOLATED_ROWS.findall(error))
    return [
        n
        for n in found
        if n in sample and n not in fixed and n not in asked
        and getattr(sample[n], "dim", lambda: 0)() > 0
    ]  # fmt: skip


def _rows(n: int) -> str:
    return f"{n} row" + ("s" if n != 1 else "")


def _fixed_axes(axes: list[Axis], error: str) -> list[Axis]:
    """The axes an export error blames: those whose inputs it names (``L['pixel_values']``),
    else the last one tried (the order of ``model_axes``: the least usual first to go); all of
    them when the export ran past ``AXES_SECONDS``."""
    if "shape reasoning over the family's axes ran past" in error:
        return list(axes)
    named = [a for a in axes if any(f"'{n}'" in error for n, _ in a.dims)]
    # height and width go together: an image model that fixes one fixes both
    if any(a.name in ("height", "width") for a in named):
        named += [a for a in axes if a.name in ("height", "width") and a not in named]
    return named or [axes[-1]] + [
        a for a in axes[:-1] if {axes[-1].name, a.name} == {"height", "width"}
    ]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def dims_hint(opts: Options, what: str) -> str:
    """How to change the dynamic dims, naming only the options the user passed: with none,
    the dims are the route's own (TorchScript's converter keeps sizes symbolic)."""
    passed = [
        f for f, on in (("--dynamic-batch", opts.dynamic_batch), ("--dynamic", opts.dynamic)) if on
    ]
    if not passed:
        return (
            f"no --dynamic option was passed: the route made {what} dynamic itself "
            "(TorchScript's converter keeps sizes symbolic); another route may hold"
        )
    return f"drop {'/'.join(passed)} for {what}, or bound it: --dynamic NAME:AXIS:MIN:MAX"


def _fix_for(errors: list[str], opts: Options) -> str:
    joined = " ".join(errors)
    if "data-dependent" in joined or "GuardOnDataDependent" in joined:
        return (
            "data-dependent control flow: rewrite the branch with torch.cond, or convert through "
            "TorchScript (--to torchscript keeps both branches)"
        )
    if "Constraints violated" in joined or "specialized" in joined:
        return "a dimension marked dynamic is fixed by the model: " + dims_hint(opts, "it")
    return "see the error above; torch.export.draft_export can list every issue at once"


def dynamic_range_words(ep: Any) -> dict[str, str]:
    """The dynamic dims of ``ep`` and the sizes torch guarantees for each, in words."""
    from ptconvert.verify.dims import describe, dynamic_dims

    dims = dynamic_dims(ep)
    return {d.where: describe(d, dims) for d in dims}
