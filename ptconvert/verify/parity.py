"""Program parity: a candidate runtime against the eager reference, judged like PyTorch's own
benchmark harness (``torch._dynamo.utils.same``).

For every input set (several batch sizes, seeded): eager runs twice first — if it disagrees with
itself the verdict is ``eager_nondeterministic``, not a converter failure. The candidate is then
compared leaf by leaf (tuples, dicts, Hugging Face ModelOutput flattened by path): names, shapes
and dtypes first, then ``allclose`` at the dtype's tolerance; when that fails, the RMSE-ratio rule
decides: with an fp64 run of the eager model as ground truth, the candidate passes if its error
against fp64 is at most ``multiplier × eager's own error + tol / 10``. So precision noise is told
apart from a broken conversion. Cosine similarity is reported as a secondary measure.

The reference's calls go through ``run_model``: when the model itself raises on the example
inputs (ids beyond its vocabulary …) that is a ``ModelRaisedError`` naming the inputs, not a
verdict on the candidate. A model that changes its own state on every call (a counter buffer, a
hidden state kept in an attribute) is found by ``model_state.state_changes`` and run through
``model_state.fresh_each_call``, so that both sides start every call from the same (saved) state.
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ptconvert import _compat, progress
from ptconvert.errors import ModelRaisedError, PtconvertError
from ptconvert.memory import FP64_BUDGET_BYTES
from ptconvert.model.wrappers import output_leaves
from ptconvert.report import ParityStatus, Report
from ptconvert.verify.closeness import flat_cosine, judged_by_accuracy

# dtype → tolerance used as both atol and rtol (PyTorch's harness: fp32 1e-4, half types 1e-3…1e-2)
TOLERANCES: dict[str, float] = {
    "float64": 1e-7,
    "float32": 1e-4,
    "float16": 1e-3,
    "bfloat16": 1e-2,
}
STATUSES: tuple[ParityStatus, ...] = get_args(ParityStatus)
COMPARED = ("pass", "fail_accuracy", "fail_shape")  # sizes where the outputs were compared


@dataclass
class OutputResult(Report):
    name: str
    status: ParityStatus
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    rmse_vs_fp64: float | None = None  # the candidate's
    eager_rmse_vs_fp64: float | None = None  # eager's own, the yardstick
    outside_tolerance: float = 0.0  # share of elements outside allclose
    cosine: float | None = None
    detail: str = ""


@dataclass
class SizeResult(Report):
    batch: int
    status: ParityStatus
    outputs: list[OutputResult] = field(default_factory=list)
    detail: str = ""


@dataclass
class ParityReport(Report):
    status: ParityStatus
    sizes: list[SizeResult] = field(default_factory=list)
    fp64_reference: bool = True
    tolerance: dict[str, float] = field(default_factory=dict)
    compared: int = 0  # batch sizes at which the candidate's outputs were compared

    @property
    def failed(self) -> list[SizeResult]:
        return [s for s in self.sizes if s.status not in ("pass", "skipped")]

    @property
    def skipped(self) -> list[SizeResult]:
        """The sizes the eager model itself raised at (none compared there)."""
        return [s for s in self.sizes if s.status == "skipped"]

    def skipped_note(self) -> str | None:
        """The report's note for the sizes skipped, or None."""
        if not self.skipped:
            return None
        sizes = [s.batch for s in self.skipped]
        return (
            f"batch sizes {sizes} not compared: the eager model itself raised there "
            f"({self.skipped[0].detail}), which says nothing of the program"
        )


VARIED_BATCHES = [1, 2, 3, 5, 7]  # 1, 2, primes in the middle: sizes a frozen shape misses

# how often eager runs twice on one input (the determinism check): at every size, at the first
# size only (or the first whose outputs are known), or never (already seen to agree with itself)
Determinism = Literal["each", "once", "done"]


@dataclass
class EagerRuns:
    """Eager's outputs already computed, with the inputs they came from, by the key the
    comparison's ``make_inputs`` takes (a batch size). A conversion's checks share one: the model
    runs once per size, and the determinism check once per conversion."""

    made_by: Any = None  # the inputs' maker these keys belong to
    inputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    threads: dict[int, int] = field(default_factory=dict)  # torch's threads when each ran
    deterministic: bool = False  # eager has given the same outputs twice on one input

    def put(self, key: int, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        import torch

        self.inputs[key], self.outputs[key] = inputs, outputs
        self.threads[key] = torch.get_num_threads()


def _to_fp64(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, dict):
        return {k: _to_fp64(v) for k, v in value.items()}
    return value


# The fp64 ground truth is a float64 copy of the model: twice an fp32 model's memory, and slow on
# a CPU. Above this size the reference is the eager model run twice (the determinism check),
# which the report says (``ParityReport.fp64_reference``).
_FP64: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def fp64_bytes(reference: Any) -> int:
    """The size of the model's float64 copy (its parameters and buffers at 8 bytes each)."""
    tensors = [*getattr(reference, "parameters", list)(), *getattr(reference, "buffers", list)()]
    return 8 * sum(t.numel() for t in tensors if t.is_floating_point())


def _weights_key(reference: Any) -> tuple[Any, ...]:
    """What the fp64 copy was made from: each tensor's storage and in-place version, and the
    mode. A model whose weights changed since gets a new copy."""
    tensors = [*getattr(reference, "parameters", list)(), *getattr(reference, "buffers", list)()]
    return (
        getattr(reference, "training", None),
        tuple((t.data_ptr(), _compat.torch_api.tensor_version(t)) for t in tensors),
    )


def fp64_model(reference: Any) -> Any | None:
    """A float64 copy of the eager model, made once per model and state of its weights; None
    when it cannot be made (dtypes, copying) or would exceed ``FP64_BUDGET_BYTES``."""
    key = _weights_key(reference)
    try:
        cached = _FP64.get(reference)
    except TypeError:  # not weak-referenceable: no cache
        cached = None
    if cached is not None and cached[0] == key:
        return cached[1]
    if fp64_bytes(reference) > FP64_BUDGET_BYTES:  # memory.py estimates with the same budget
        return None
    try:
        made = copy.deepcopy(reference).double()
    except Exception:  # some modules cannot be copied or cast; parity then goes without fp64
        return None
    with contextlib.suppress(TypeError):  # not weak-referenceable: made again next time
        _FP64[reference] = (key, made)
    return made


def describe_inputs(inputs: dict[str, Any]) -> str:
    """``ids int64[2,16] in [0, 99], scale=0.5``: name, dtype, shape and value range of each."""
    import torch

    parts = []
    for name, v in inputs.items():
        if not isinstance(v, torch.Tensor):
            parts.append(f"{name}={v!r}"[:60])
            continue
        text = f"{name} {str(v.dtype).removeprefix('torch.')}[{','.join(map(str, v.shape))}]"
        if v.numel() and not v.is_complex():
            lo, hi = v.min().item(), v.max().item()
            if isinstance(lo, float):
                text += f" in [{lo:.4g}, {hi:.4g}]"
            else:
                text += f" in [{lo}, {hi}]"
        parts.append(text)
    return ", ".join(parts) or "none"


def run_model(fn: Callable[..., Any], inputs: dict[str, Any], who: str) -> Any:
    """``fn(**inputs)``; when the model raises, a ModelRaisedError that names ``who`` (the
    reference model, the candidate), the exception and the inputs it was given."""
    try:
        return fn(**inputs)
    except PtconvertError:
        raise
    except Exception as exc:  # the model's own failure, told apart from ptconvert's bugs
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ModelRaisedError(
            f"{who} raised {type(exc).__name__} on the example inputs"
            + (f": {first}" if first else "")
            + f" (inputs: {describe_inputs(inputs)})",
            hint="the inputs may lie outside what the model takes (ids beyond its vocabulary, a "
            "shape it rejects): give each input its shape and range with --input "
            "NAME:SHAPE:DTYPE:LOW:HIGH (values in [LOW, HIGH)), or pass --example-inputs FILE",
        ) from exc


def compare(
    reference: Any,
    candidate: Callable[..., Any],
    make_inputs: Callable[[int], dict[str, Any]],
    batches: list[int],
    *,
    tolerances: dict[str, float] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    determinism: Determinism = "each",
    eager: EagerRuns | None = None,
    accuracy: tuple[float, float] | None = None,
) -> ParityReport:
    """Run eager (twice), eager in fp64 and the candidate on ``make_inputs(b)`` for every ``b``.
    ``determinism="once"``: eager runs twice at one size only (``_twice_at``: a conversion's
    checks; whether the model is deterministic does not depend on the size, and a large model's
    runs are what verification costs), both calls at one thread count; ``"done"``: not at
    all. ``eager``: outputs known already (used, not run again) and filled with those run.
    ``accuracy`` (min cosine, max error): floating outputs judged by ``judged_by_accuracy``."""

    tols = {**TOLERANCES, **(tolerances or {})}
    ref64 = fp64_model(reference)
    runs = eager if eager is not None else EagerRuns()
    if determinism == "once" and runs.deterministic:
        determinism = "done"
    for hook in list(_BETWEEN):
        hook()
    twice_at = _twice_at(batches, runs)
    done: dict[int, SizeResult] = {}
    # the size eager runs twice at goes first, at the thread count it was chosen for (the sizes
    # before it in ``batches`` ran already: no size raises earlier than it would in order)
    order = sorted(dict.fromkeys(batches), key=lambda b: b != twice_at)
    raised: ModelRaisedError | None = None
    with progress.bar("batch sizes compared", len(order)) as advance:
        for i, b in enumerate(order):
            for hook in list(_BETWEEN) if i else []:
                hook()
            known = runs.inputs.get(b)
            inputs = known if known is not None else make_inputs(b)
            again = determinism == "each" or (determinism == "once" and b == twice_at)
            try:
                done[b] = _compare_size(
                    b, inputs, reference, candidate, ref64, tols, atol, rtol, again, runs, accuracy
                )
            except ModelRaisedError as exc:
                # eager rejects this size (an assert on it, an input that must agree with a
                # default): nothing to compare the program with there, no verdict on it
                raised = raised or exc
                done[b] = SizeResult(b, "skipped", detail=_raised(exc))
            advance()
    if raised is not None and all(s.status == "skipped" for s in done.values()):
        raise raised  # at no size: the model's own failure is the news
    return summarised([done[b] for b in batches], ref64 is not None, tols)


def _raised(exc: ModelRaisedError) -> str:
    """What the model raised (``AssertionError: 1 is greater than 2``), without the words on
    the example inputs: it raised on inputs resized for the check."""
    cause = exc.__cause__
    if cause is None:
        return exc.message.split(" (inputs: ")[0][:200]
    first = (str(cause).strip().splitlines() or [""])[0][:200]
    return type(cause).__name__ + (f": {first}" if first else "")


_BETWEEN: list[Callable[[], None]] = []  # run before each size, never within one


@contextlib.contextmanager
def between_sizes(hook: Callable[[], None]) -> Iterator[None]:
    """``hook`` runs before each size any comparison makes while this lasts: a conversion's
    check gives this process its threads back there once the fresh interpreter beside it has
    ended (a size's eager runs, twice for the determinism check, share one thread count)."""
    _BETWEEN.append(hook)
    try:
        yield
    finally:
        _BETWEEN.remove(hook)


def _twice_at(batches: list[int], runs: EagerRuns) -> int | None:
    """Where eager runs twice: at a size whose outputs are known from this thread count (one
    more call), else at one not run yet (its first call is needed anyway), else the first."""
    import torch

    threads = torch.get_num_threads()
    known = [b for b in batches if b in runs.outputs]
    same = (b for b in known if runs.threads.get(b) == threads)
    new = (b for b in batches if b not in runs.outputs)
    return next(same, next(new, batches[0] if batches else None))


def summarised(
    sizes: list[SizeResult], fp64_reference: bool, tolerance: dict[str, float]
) -> ParityReport:
    """The verdict over ``sizes``: the first that did not pass, or a pass (never one without
    any size compared)."""
    compared = sum(1 for s in sizes if s.status in COMPARED)
    judged = [s for s in sizes if s.status != "skipped"]
    status: ParityStatus = next((s.status for s in judged if s.status != "pass"), "pass")
    if not judged:  # no evidence: never a pass
        status = "nothing_compared"
    return ParityReport(status, sizes, fp64_reference, dict(tolerance), compared)


def _compare_size(
    b: int,
    inputs: dict[str, Any],
    reference: Any,
    candidate: Callable[..., Any],
    ref64: Any,
    tols: dict[str, float],
    atol: float | None,
    rtol: float | None,
    again: bool,
    runs: EagerRuns,
    accuracy: tuple[float, float] | None = None,
) -> SizeResult:
    """One batch size of ``compare``."""
    import torch

    with torch.no_grad():
        who = "the reference model"
        first = runs.outputs.get(b)
        if first is None:
            first = output_leaves(run_model(reference, copy.deepcopy(inputs), who))
            runs.put(b, inputs, first)
        base, second = first, first
        if again:
            # judged at one thread count: kernels split their sums by thread, so outputs made
            # with another count (before a fresh process took some cores) may differ in bits
            if runs.threads.get(b) != torch.get_num_threads():
                base = output_leaves(run_model(reference, copy.deepcopy(inputs), who))
            second = output_leaves(run_model(reference, copy.deepcopy(inputs), who))
        if base.keys() != second.keys() or not all(torch.equal(base[k], second[k]) for k in base):
            return SizeResult(b, "eager_nondeterministic", detail="eager ran twice and differed")
        runs.deterministic = runs.deterministic or again
        gold = None
        if ref64 is not None:
            try:
                gold = output_leaves(ref64(**_to_fp64(copy.deepcopy(inputs))))
            except Exception:  # an fp64 run can fail (dtype-strict ops); then no RMSE rule
                gold = None
        try:
            got = output_leaves(candidate(**copy.deepcopy(inputs)))
        except Exception as exc:  # the artifact may reject a size: that is the finding
            return SizeResult(b, "fail_to_run", detail=f"{type(exc).__name__}: {exc}"[:300])
    return _compare_leaves(b, first, got, gold, tols, atol, rtol, accuracy)


def _compare_leaves(
    batch: int,
    ref: dict[str, Any],
    got: dict[str, Any],
    gold: dict[str, Any] | None,
    tols: dict[str, float],
    atol: float | None,
    rtol: float | None,
    accuracy: tuple[float, float] | None = None,
) -> SizeResult:
    if len(ref) != len(got):
        return SizeResult(batch, "fail_shape", detail=f"{len(ref)} outputs became {len(got)}")
    golds = list(gold.values()) if gold is not None and len(gold) == len(ref) else [None] * len(ref)
    results = [
        _compare_one(name, a, b, g, tols, atol, rtol, accuracy)
        for (name, a), b, g in zip(ref.items(), got.values(), golds, strict=True)
    ]
    status: ParityStatus = next((r.status for r in results if r.status != "pass"), "pass")
    bad = next((r for r in results if r.status != "pass"), None)
    return SizeResult(batch, status, results, bad.detail if bad else "")


def _rmse(x: Any, y: Any) -> float:
    return float(((x.double() - y.double()) ** 2).mean().sqrt()) if x.numel() else 0.0


def _compare_one(
    name: str,
    a: Any,
    b: Any,
    gold: Any,
    tols: dict[str, float],
    atol: float | None,
    rtol: float | None,
    accuracy: tuple[float, float] | None = None,
) -> OutputResult:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return OutputResult(
            name,
            "fail_shape",
            detail=f"{name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}",
        )
    if not a.is_floating_point():
        equal = torch.equal(a, b)
        share = float((a != b).float().mean()) if a.numel() else 0.0
        return OutputResult(
            name,
            "pass" if equal else "fail_accuracy",
            outside_tolerance=share,
            detail="" if equal else f"{name}: {share:.1%} of the values differ",
        )
    dtype = str(a.dtype).removeprefix("torch.")
    tol = tols.get(dtype, 1e-4)
    at, rt = (atol if atol is not None else tol), (rtol if rtol is not None else tol)
    max_abs = max_rel = outside = 0.0
    # a large output (a vocabulary's logits) is many MiB, compared at every size: nothing more
    # is computed when both sides hold the same bits, one fp64 buffer is reused, and isclose
    # (the slowest part) only runs when some difference is above atol
    a64 = a.double().flatten()
    b64 = a64 if torch.equal(a, b) else b.double().flatten()
    cosine = flat_cosine(a64, b64) if a.numel() > 1 else None
    close = None  # None: every element close
    if b64 is not a64:
        diff = b64.sub(a64).abs_()
        max_abs = float(diff.max()) if a.numel() else 0.0
        max_rel = float(diff.div_(a64.abs().clamp_min_(1e-12)).max()) if a.numel() else 0.0
        if not max_abs <= at:  # within atol everywhere (no NaN either): all close
            close = torch.isclose(a, b, rtol=rt, atol=at, equal_nan=True)
            outside = float((~close).float().mean()) if a.numel() else 0.0
    result = OutputResult(name, "pass", max_abs, max_rel, outside_tolerance=outside, cosine=cosine)
    if accuracy is not None:  # a quantized program: its cosine and error judge it, no tolerance
        return judged_by_accuracy(result, a64, accuracy)
    if gold is not None and gold.shape == a.shape:
        result.rmse_vs_fp64 = _rmse(gold, b)
        result.eager_rmse_vs_fp64 = _rmse(gold, a)
    if close is None or bool(close.all()):
        return result
    if result.rmse_vs_fp64 is not None and result.eager_rmse_vs_fp64 is not None:
        multiplier = 3.0 if dtype in ("float16", "bfloat16") or a.numel() < 1000 else 2.0
        limit = multiplier * result.eager_rmse_vs_fp64 + tol / 10
        if result.rmse_vs_fp64 <= limit and not math.isnan(result.rmse_vs_fp64):
            result.detail = f"{name}: outside allclose but within {multiplier}× eager's fp64 error"
            return result
    result.status = "fail_accuracy"
    result.detail = (
        f"{name}: max abs error {max_abs:.3g}, {outside:.1%} of elements outside tolerance "
        f"(atol {at:g}, rtol {rt:g})"
        + (
            f", RMSE vs fp64 {result.rmse_vs_fp64:.3g} "
            f"against eager's {result.eager_rmse_vs_fp64:.3g}"
            if result.rmse_vs_fp64 is not None
            else ""
        )
    )
    return result
