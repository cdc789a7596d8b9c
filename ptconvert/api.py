"""The public API: every command of the CLI is one of these calls (and the CLI calls only these).

Each takes the options of its command as keywords (the fields of ``Options``), or an ``Options``
object; each result is a dataclass with ``to_dict()`` and ``to_json()``, the CLI's ``--json``.
Errors are the classes in ``ptconvert.errors`` (each with the CLI's exit code): a failure of the
machine (no space, a read-only or missing folder, no permission, a symbolic link loop, out of
memory) is one of them too, never a bare ``OSError`` or ``MemoryError``.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ptconvert.errors import UsageError, named_error
from ptconvert.options import GENERATION_TASKS, BenchKeywords, VerifyKeywords, split_keywords
from ptconvert.plugins import load_plugins
from ptconvert.quiet import quiet_libraries

if TYPE_CHECKING:
    from ptconvert.convert.batch import BatchReport
    from ptconvert.convert.cache_store import CacheCleared, CacheInfo
    from ptconvert.convert.conversion_report import ConversionReport
    from ptconvert.convert.every import EveryFormatReport
    from ptconvert.convert.graph import Plan
    from ptconvert.convert.optimize import OptimizeReport
    from ptconvert.formats import Detection, FileInfo
    from ptconvert.generation.runner import Generated
    from ptconvert.options import Options
    from ptconvert.scan.scanner import ScanReport
    from ptconvert.verify.bench import BenchReport
    from ptconvert.verify.check import VerifyReport


F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _named_errors(fn: F) -> F:
    """The call's environment failures as named errors: an ``OSError`` names the file the
    system named, running out of memory names the call's first argument (the input). The call
    runs as quiet as the CLI (``quiet.quiet_libraries``: the libraries' warnings, transformers'
    logs and bars, all as they were after); ``PTCONVERT_VERBOSE=1`` lets them through."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with quiet_libraries():
                return fn(*args, **kwargs)
        except (OSError, MemoryError) as exc:
            oom = not isinstance(exc, OSError) or exc.errno == errno.ENOMEM
            named = named_error(exc, args[0] if oom and args else None)
            if named is None:
                raise
            raise named from exc

    return call  # type: ignore[return-value]


def _shows_keywords(cls: type[VerifyKeywords | BenchKeywords]) -> Callable[[F], F]:
    """``help()`` and ``inspect.signature`` show the function's own keywords, the fields of
    ``cls`` (declared there once), keyword-only before ``**overrides`` (the Options fields)."""

    def show(fn: F) -> F:
        signature = inspect.signature(fn)
        *params, rest = signature.parameters.values()
        own = [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
            )
            for f in dataclasses.fields(cls)
        ]
        fn.__signature__ = signature.replace(parameters=[*params, *own, rest])  # type: ignore[attr-defined]
        return fn

    return show


def _source(
    src: str | Path, revision: str | None = None, cache_dir: str | Path | None = None
) -> tuple[str | Path, list[str]]:
    """Where every command's source enters: a Hugging Face Hub id (``owner/name``,
    ``hf://owner/name``) resolved to its snapshot in the Hub cache (``hub.resolve``: a local
    path always wins), with the note its report carries; anything else as it was given."""
    from ptconvert.hub import resolve

    found = resolve(src, revision, cache_dir)
    return (src, []) if found is None else (found.snapshot, [found.note])


def _target(to: str) -> str:
    from ptconvert.convert.graph import target_name

    return target_name(to)


def _noted(report: T, notes: list[str]) -> T:
    """``report`` with ``notes`` (where the source came from) first among its own."""
    if notes:
        report.notes[:0] = notes  # type: ignore[attr-defined]
    return report


@_named_errors
def options(base: Options | None = None, **overrides: Any) -> Options:
    """``base`` (or the defaults) with ``overrides`` applied: Options fields, and a target's own
    options (``Format.options_class``: ``opset=17``), kept in ``target_options``; an unknown
    name is a UsageError.

    >>> options(dynamic_batch=True, inputs=["x:2x8:float32"]).dynamic_batch
    True
    """
    from ptconvert.formats import target_options
    from ptconvert.options import Options, check_choices

    own = target_options()  # a target's options (--opset …), kept in Options.target_options
    known = {f.name for f in dataclasses.fields(Options)} - {"target_options"} | set(own)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UsageError(f"unknown option(s) {unknown}", hint=f"known: {', '.join(sorted(known))}")
    given = {k: overrides.pop(k) for k in list(overrides) if k in own}
    opts = dataclasses.replace(base or Options(), **overrides)
    if given:
        opts.target_options = {**opts.target_options, **given}
    if opts.example_inputs is not None:
        opts.example_inputs = Path(opts.example_inputs)
    if opts.cache_dir is not None:
        opts.cache_dir = Path(opts.cache_dir)
    for name in ("inputs", "dynamic", "allow"):  # one spec as a string, as one CLI flag gives it
        value = getattr(opts, name)
        if isinstance(value, (str, tuple)):
            setattr(opts, name, [value] if isinstance(value, str) else list(value))
    opts.validate()
    for cls in dict.fromkeys(own.values()):
        values: Any = opts.of(cls)
        check_choices(values)
        if hasattr(values, "validate"):
            values.validate()
    return opts


@_named_errors
def convert(
    src: str | Path | None,
    to: str,
    output: str | Path | None = None,
    opts: Options | None = None,
    **overrides: Any,
) -> ConversionReport:
    """Convert ``src`` to the format ``to``, scanned first and checked after: weights bitwise
    against an independent reading of the source, programs by running them against the eager
    model (``result.check`` says which check ran). The output is written atomically.
    ``src=None`` with ``model=`` converts a model from code alone (its factory's own weights).
    A generation task (``task="text-generation-with-past"``) exports the model with its cache
    and checks it by generating (``check == "generation"``; the task, the cache and the
    generation check in ``result.generation``).

    >>> report = ptconvert.convert("model.bin", "pt2", model="mypkg.nets:make",
    ...                            inputs=["x:2x8:float32"], dynamic_batch=True)
    >>> report.check, report.output
    ('parity', 'model.pt2')
    """
    from ptconvert.convert.engine import convert as run
    from ptconvert.convert.output_naming import names_folder, program_suffixed

    load_plugins()
    to = _target(to)
    checked = options(opts, **overrides)
    hub: list[str] = []
    if src is not None:
        src, hub = _source(src, checked.revision, checked.cache_dir)
    if checked.task in GENERATION_TASKS and src is not None:  # with its cache, by generating
        from ptconvert.generation.convert import convert as export_for_generation

        return _noted(export_for_generation(src, to, output, checked), hub)
    if src is None:  # code alone: no default name, but the suffix rule holds
        said: list[str] = []
        if output is not None and not names_folder(output):
            output, said = program_suffixed(Path(output), to)
        report = run(src, to, output, checked)
        report.notes[:0] = said
        return report
    src, output, said = _output_name(src, to, output, checked)
    return _noted(run(src, to, output, checked), [*hub, *said])


def _output_name(
    src: str | Path, to: str, output: str | Path | None, opts: Options
) -> tuple[Path, Path | None, list[str]]:
    """Where ``-o`` puts the output (docs/outputs.md): an existing folder or a
    name ending in ``/`` takes the output under its default name (a file output; a folder
    output, a Hugging Face directory's weights or the folder a program's client loads, is that
    folder); a program's file name without
    a suffix of its format gets one (torch's loaders want ``.pt2``); a Hugging Face
    directory's weights to a name with the target's suffix (``-o model.safetensors``) are that
    one file, its weights file converted. Returns the source, the output and notes saying
    what the rule did."""
    from ptconvert.convert.output_naming import (
        byte_copy,
        client_file,
        names_folder,
        output_for,
        program_suffixed,
        writes_client_folder,
        writes_directory,
    )
    from ptconvert.errors import PtconvertError
    from ptconvert.formats import FORMATS_BY_NAME, detect

    src = Path(src)
    target = FORMATS_BY_NAME.get(to)
    if output is None or target is None:
        return src, Path(output) if output is not None else None, []
    try:
        d = detect(src)
    except PtconvertError:  # the conversion says what is wrong with it
        return src, Path(output), []
    out = Path(output)
    named_folder = names_folder(output)
    folder = byte_copy(d.format, to) and writes_directory(d, to, opts.max_shard_size)
    suffixes = target.suffixes or (target.suffix,)
    if folder:
        inner = d.handler.weights_file(src)
        if named_folder or inner is None or opts.max_shard_size or not out.name.endswith(suffixes):
            return src, out, []
        return (
            inner,
            out,
            [
                f"-o {out.name} names one file: {src.name}'s weights ({inner.name}) written "
                "alone, without config.json and the tokenizer (-o FOLDER/ for a directory)"
            ],
        )
    if writes_client_folder(client_file(d, to), output):
        return src, out, []  # the folder its client loads (model.onnx beside config.json)
    if named_folder:
        return src, out / output_for(src, to, opts).name, []
    named, said = program_suffixed(out, to)  # weights: any name loads
    return src, named, said


@_named_errors
def convert_many(
    src_dir: str | Path,
    to: str,
    out_dir: str | Path,
    opts: Options | None = None,
    *,
    jobs: int = 1,
    keep_going: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    **overrides: Any,
) -> BatchReport:
    """Convert every model under ``src_dir`` (files ptconvert recognises, Hugging Face
    directories as one model) to ``to`` into ``out_dir`` at the same relative places, each as
    ``convert`` does it, in ``jobs`` local processes or, with ``executor="ray"``, as Ray tasks
    (``ray_address`` or ``RAY_ADDRESS``; a local Ray otherwise). A failure is reported in its
    item (``report.exit_code`` is the first one's); without ``keep_going`` nothing new starts
    after it. A re-run skips the outputs already complete and verified.

    >>> r = ptconvert.convert_many("zoo/", "safetensors", "out/", jobs=2, keep_going=True)
    >>> r.counts, r.exit_code
    ({'converted': 2, 'skipped': 0, 'failed': 1, 'not-run': 0}, 3)
    """
    from ptconvert.convert.batch import convert_many as run

    load_plugins()
    return run(
        src_dir,
        _target(to),
        out_dir,
        options(opts, **overrides),
        jobs=jobs,
        keep_going=keep_going,
        executor=executor,  # type: ignore[arg-type]  # checked there (a UsageError)
        ray_address=ray_address,
        convert=convert,
    )


@_named_errors
def convert_every(
    src: str | Path,
    out_dir: str | Path,
    opts: Options | None = None,
    *,
    batch_sizes: list[int] | None = None,
    repeats: int = 10,
    warmup: int = 2,
    **overrides: Any,
) -> EveryFormatReport:
    """Convert ``src`` to every format the converter graph reaches from it, each into
    ``out_dir`` and verified as ``convert`` verifies it (a target whose route needs what is
    not here is skipped, saying what), and time the programs that passed beside eager and
    ``torch.compile`` on the same inputs: the CLI's ``--to all``.

    >>> r = ptconvert.convert_every("model.bin", "every/", model="mypkg.nets:make",
    ...                             inputs=["x:2x8:float32"], dynamic_batch=True)  # doctest: +SKIP
    >>> [(row.format, row.status, row.check, row.vs_eager) for row in r.rows]  # doctest: +SKIP
    [('safetensors', 'ok', 'bitwise', None), ('pt2', 'ok', 'parity', 1.1), ...]
    """
    from ptconvert.convert.every import convert_every as run

    load_plugins()
    checked = options(opts, **overrides)
    src, hub = _source(src, checked.revision, checked.cache_dir)
    report = run(src, out_dir, checked, batch_sizes=batch_sizes, repeats=repeats, warmup=warmup)
    return _noted(report, hub)


@_named_errors
def optimize(
    src: str | Path,
    output: str | Path | None = None,
    opts: Options | None = None,
    *,
    batch_sizes: list[int] | None = None,
    repeats: int = 20,
    warmup: int = 3,
    **overrides: Any,
) -> OptimizeReport:
    """Convert ``src`` to every runnable program target (pt2, AOTInductor, ONNX), verify each,
    time those that pass beside eager and ``torch.compile``, and keep the fastest verified one
    as ``output``; every candidate says why it was kept or dropped.

    >>> r = ptconvert.optimize("model.bin", model="mypkg.nets:make",
    ...                        inputs=["x:2x8:float32"], dynamic_batch=True)  # doctest: +SKIP
    >>> r.kept, [(c.runtime, c.outcome, c.vs_eager) for c in r.candidates]  # doctest: +SKIP
    ('aoti', [('pt2', 'dropped', 1.02), ('aoti', 'kept', 2.4), ...])
    """
    from ptconvert.convert.optimize import optimize as run

    load_plugins()
    checked = options(opts, **overrides)
    src, hub = _source(src, checked.revision, checked.cache_dir)
    report = run(src, output, checked, batch_sizes=batch_sizes, repeats=repeats, warmup=warmup)
    return _noted(report, hub)


@_named_errors
def plan(src: str | Path, to: str, opts: Options | None = None, **overrides: Any) -> Plan:
    """The route ``convert`` would take from ``src`` to ``to``, and what it lacks.

    >>> p = ptconvert.plan("model.bin", "pt2")
    >>> p.runnable, p.missing
    (False, {'model_spec': 'pass --model pkg.module:factory ...', ...})
    """
    from ptconvert.convert.planning import plan_for

    load_plugins()
    to = _target(to)
    checked = options(opts, **overrides)
    src, hub = _source(src, checked.revision, checked.cache_dir)
    if checked.task in GENERATION_TASKS:
        from ptconvert.generation.convert import plan as generation_plan

        return _noted(generation_plan(src, to, checked), hub)
    return _noted(plan_for(src, to, checked), hub)


@_named_errors
def scan(
    paths: str | Path | Iterable[str | Path],
    *,
    allow: Sequence[str] = (),
    jobs: int = 1,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> ScanReport:
    """Scan pickle-based files (and directories, recursively: the files ``include`` and
    ``exclude`` globs select) without executing them; a Hugging Face Hub id scans its snapshot
    in the Hub cache (``revision``, ``cache_dir``). A directory's files that no loader reads
    (logs, READMEs, plain configs: decided by their content) are listed in ``skipped``.

    >>> report = ptconvert.scan("model.bin")
    >>> report.verdict            # "clean" | "needs-code" | "dangerous" | "error"
    'clean'
    """
    from ptconvert.scan.scanner import scan as run

    load_plugins()
    items, hub = [], []
    for item in [paths] if isinstance(paths, (str, Path)) else list(paths):
        path, said = _source(item, revision, cache_dir)
        items.append(path)
        hub += said
    report = run(items, allow=allow, jobs=jobs, include=include, exclude=exclude)
    return _noted(report, hub)


@_shows_keywords(VerifyKeywords)
@_named_errors
def verify(
    reference: str | Path, candidate: str | Path, opts: Options | None = None, **overrides: Any
) -> VerifyReport:
    """Check that ``candidate`` computes (or holds) what ``reference`` does; raises
    ``VerificationError`` unless they agree (or ``warn_only``).

    Its own keywords are the fields of ``options.VerifyKeywords``; the others override
    ``opts``' fields.

    >>> ptconvert.verify("model.bin", "model.pt2", model="mypkg.nets:make").status
    'pass'
    """
    from ptconvert.verify.check import verify as run

    load_plugins()
    own, overrides = split_keywords(VerifyKeywords, overrides)
    device = own["device"]
    checked = options(opts, **overrides, **({"device": device} if device else {}))
    reference, hub = _source(reference, checked.revision, checked.cache_dir)
    return _noted(run(reference, candidate, checked, **{**own, "device": checked.device}), hub)


@_shows_keywords(BenchKeywords)
@_named_errors
def bench(artifact: str | Path, opts: Options | None = None, **overrides: Any) -> BenchReport:
    """Time ``artifact`` against eager (``reference``) and ``torch.compile`` on the same inputs.

    Its own keywords are the fields of ``options.BenchKeywords``; the others override
    ``opts``' fields.

    >>> r = ptconvert.bench("model.pt2", reference="model.bin",
    ...                     model="mypkg.nets:make")  # doctest: +SKIP
    >>> [(t.runtime, t.batch, t.median_ms) for t in r.timings]  # doctest: +SKIP

    A generation export (``--task …-with-past``) is timed generating: time to the first token
    and per token, against transformers' ``generate`` on ``reference`` (its Hugging Face
    directory, required) eager and ``torch.compile``d, ``new_tokens`` greedy tokens after a
    prompt of ``prompt_length`` (a ``GenerationBenchReport``: ``tokens``, ``ratios``).

    >>> r = ptconvert.bench("llama.pt2", reference="llama-dir", new_tokens=32)  # doctest: +SKIP
    >>> [(t.runtime, t.batch, t.per_token_ms) for t in r.tokens]  # doctest: +SKIP
    """
    from ptconvert.generation.bench import bench_generation, generation_export
    from ptconvert.verify.bench import bench_artifact

    load_plugins()
    own, overrides = split_keywords(BenchKeywords, overrides)
    device = own["device"]
    checked = options(opts, **overrides, **({"device": device} if device else {}))
    hub: list[str] = []
    if own["reference"] is not None:  # the eager source: a Hub id too
        own["reference"], hub = _source(own["reference"], checked.revision, checked.cache_dir)
    keywords = BenchKeywords(**{**own, "device": checked.device})
    export = generation_export(Path(artifact))
    if export is not None:  # the verify layer cannot import generation/: dispatched here
        return _noted(bench_generation(str(artifact), checked, keywords, export=export), hub)
    if keywords.prompt_length is not None or keywords.new_tokens is not None:
        raise UsageError(
            "--prompt-length and --new-tokens time a generation export (--task …-with-past)",
            path=artifact,
        )
    return _noted(bench_artifact(str(artifact), checked, keywords), hub)


@_named_errors
def format_names() -> list[str]:
    """The names of the formats ptconvert knows (the values ``to`` takes are among them)."""
    from ptconvert.formats import FORMATS

    load_plugins()
    return [f.name for f in FORMATS]


@_named_errors
def detect(
    path: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> Detection:
    """Recognise ``path`` from its content (plugins' formats included), reading nothing else;
    a Hugging Face Hub id, its snapshot in the Hub cache.

    >>> ptconvert.detect("pytorch_model.bin")
    Detection(path=PosixPath('pytorch_model.bin'), format='pt', layout='zip')
    """
    from ptconvert import formats

    load_plugins()
    return formats.detect(_source(path, revision, cache_dir)[0])


@_named_errors
def describe(
    path: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None
) -> FileInfo:
    """What ``path`` holds (tensors, signature, what loading it would import), without
    executing anything in it: the ``info`` command. A Hugging Face Hub id (``owner/name``)
    describes its snapshot in the Hub cache (``revision``, ``cache_dir``; a note names it).

    >>> ptconvert.describe("model.pt2").metadata["call"]
    'prog(x) → a tensor'
    """
    from ptconvert import formats

    load_plugins()
    path, hub = _source(path, revision, cache_dir)
    info = formats.describe(path)
    from ptconvert.generation.tasks import describe_task

    describe_task(info)
    return _noted(info, hub)


@_named_errors
def generate(
    artifact: str | Path,
    input_ids: Any,
    max_new_tokens: int = 16,
    *,
    eos_token_id: int | None = None,
    trust: bool = False,
) -> Generated:
    """Greedy generation with a generation export (``--task text-generation-with-past``): a pt2
    with a static cache or an ONNX decoder with past inputs; or the folder of a seq2seq one
    (``--task text2text-generation-with-past``), whose sequences are the decoder's (the start
    token, then the new ones). ``input_ids`` is batch × prompt length (no padding); the result
    holds the sequences, each step's logits and the timings.
    The check after such a conversion runs this loop.

    >>> out = ptconvert.generate("llama.pt2", [[5, 17, 42]], max_new_tokens=16)  # doctest: +SKIP
    >>> out.sequences.shape, out.per_token_s  # doctest: +SKIP
    (torch.Size([1, 19]), 0.0021)
    """
    from ptconvert.generation.runner import generate as run

    # trust: an AOTI package (--to aoti) runs native code, refused without it (exit 11)
    return run(artifact, input_ids, max_new_tokens, eos_token_id=eos_token_id, trust=trust)


@_named_errors
def cache_info() -> CacheInfo:
    """The cache of verified programs ``convert`` reuses (``PTCONVERT_CACHE``, else the user's
    cache directory): its root, entries (target, source, size, when) and total size, read
    without writing anything; ``problem`` says why a conversion would refuse it (exit 12).

    >>> info = ptconvert.cache_info()
    >>> len(info.entries), info.total_bytes > 0, info.problem
    (1, True, None)
    """
    from ptconvert.convert.cache_store import info

    return info()


@_named_errors
def cache_clear() -> CacheCleared:
    """Remove every cache entry, each under its lock; an entry another process is filling or
    copying is left (``busy``). Raises ``CacheError`` for a directory that is not the user's.

    >>> ptconvert.cache_clear().freed_bytes > 0
    True
    """
    from ptconvert.convert.cache_store import clear

    return clear()
