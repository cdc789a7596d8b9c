"""Weights routes' steps: any format whose weights can be read (pickle checkpoints,
safetensors, sharded sets, HF directories, the weights of programs, GGUF…) into any format that
writes them. ``read_weights`` reads the source through its format (byte ranges where exact,
tensors rebuilt otherwise), ``write_weights`` writes the target through its format (one file, or
a folder: shards, a directory's kept files, the files its reading made), and the engine checks
what was written bitwise against the source's independent reading (``check_written``).
"""

from __future__ import annotations

from pathlib import Path

from ptconvert import atomic, progress
from ptconvert.convert.conversion_report import WeightsWritten
from ptconvert.convert.output_naming import keep_source_files
from ptconvert.convert.state import RunState
from ptconvert.errors import NoWeightsError, UnsupportedConversionError
from ptconvert.formats import FORMATS, FORMATS_BY_NAME, detect
from ptconvert.formats.safetensors import parse_size
from ptconvert.formats.weightset import WeightSet
from ptconvert.model.build import source_weights
from ptconvert.options import Options
from ptconvert.verify.weights import WeightsCheck, verify_weights


def read_source(state: RunState, opts: Options) -> None:
    """The ``read_weights`` step: the source scanned (the scan kept for the check: a program's
    own loader runs on it only when it is clean), then its weights read through its format,
    symbolically; what the reading noted joins the conversion's notes."""
    writes = FORMATS_BY_NAME.get(state.target)
    for_model = writes is None or not writes.writes_weights  # weights files need tensors
    state.weights, state.scans = source_weights(state.src, opts, state.scans, for_model=for_model)
    state.notes += state.weights.notes
    state.weights.notes = []


def write_target(state: RunState, opts: Options) -> None:
    """The ``write_weights`` step: the weights written as the format the step leads to writes
    them — one file, or a folder (shards; a source's kept files and the files its reading
    made) when the conversion writes one (``state.folder``)."""
    ws, to = state.weights, state.leads_to
    assert ws is not None and state.output is not None
    fit_target(ws, to, opts.skip_unsupported, state.src)
    if opts.dtype:
        from ptconvert.weights.cast import cast_weights

        with progress.step(f"casting to {opts.dtype}"):
            state.notes.append(cast_weights(ws, opts.dtype))
    if ws.skipped:
        state.notes.append(f"left out {len(ws.skipped)} tensors (--skip-unsupported): {ws.skipped}")
    if ws.companions and not state.folder:
        state.notes.append(
            f"{', '.join(sorted(ws.companions))} not written: -o names one file "
            "(-o FOLDER/ writes the folder)"
        )
    shards = parse_size(opts.max_shard_size) if opts.max_shard_size else None
    state.written = _write(
        ws, state.src, to, state.output, state.folder, shards, opts.metadata, opts.dtype
    )
    atomic.start_writeback(state.written)  # to disk while the check reads them back


def check_written(state: RunState, opts: Options) -> WeightsCheck:
    """The weights written, read back and compared bitwise with the source's independent
    reading (its format's ``reference``)."""
    assert state.weights is not None and state.output is not None
    with progress.step("verifying every tensor bitwise"):
        target = _verify_target(state.output, state.written, state.folder)
        return verify_weights(
            state.weights,
            target,
            scans=state.scans,
            trust=opts.trust,
            load_timeout=opts.load_timeout,
            cast_to=opts.dtype,
        )


def weights_written(
    state: RunState, out: Path, check: WeightsCheck | None
) -> WeightsWritten | None:
    """What the report says of the weights a conversion read from its source and wrote (none
    for weights a model built in memory gave: the program route's report says what ran)."""
    ws = state.weights
    if not state.written or ws is None or ws.origin is None:
        return None
    return WeightsWritten(
        ws.path,
        len(ws.entries),
        len(ws.stored),
        sum(e.nbytes for e in ws.stored),
        [str(out / f.name) if state.folder else str(out) for f in state.written],
        ws.unwrapped,
        ws.stripped_prefix,
        {e.name: e.alias_of for e in ws.entries if e.alias_of is not None},
        ws.other_contents,
        check,
        ws.skipped,
        ws.cast_to,
    )


def weights_route(steps: list[str]) -> bool:
    """A route (its steps) that reads weights from the source and writes them: what fails in
    it is the file's (or the target's) problem, which another route would only hide."""
    return steps == ["read_weights", "write_weights"]


def refuse_shards(to: str, max_shard_size: str | None, src: Path) -> None:
    """--max-shard-size that is no size, or for a target that writes no shards, said before any
    work."""
    if max_shard_size:
        parse_size(max_shard_size)
    if max_shard_size and not FORMATS_BY_NAME[to].writes_shards:
        raise UnsupportedConversionError(
            f"--max-shard-size writes {' or '.join(_shard_writers())} shards only", path=src
        )


def fit_target(ws: WeightSet, to: str, skip_unsupported: bool, src: Path) -> None:
    """With ``skip_unsupported``, tensors whose dtype the target cannot hold are left out with
    their aliases and reported; without it the writer names each of them in its error."""
    target = FORMATS_BY_NAME[to]
    if not skip_unsupported:
        return
    bad = {e.name: e.dtype for e in ws.entries if not target.holds_dtype(e.dtype)}
    for name, dtype in bad.items():
        ws.skipped[name] = f"dtype {dtype}, which {to} cannot hold"
    ws.entries = [e for e in ws.entries if e.name not in bad and e.alias_of not in bad]
    if not ws.entries:
        listed = ", ".join(f"{n!r} ({dt})" for n, dt in list(bad.items())[:10])
        raise NoWeightsError(
            f"no tensors left once those {to} cannot hold are left out: {listed}", path=src
        )


def _write(
    ws: WeightSet,
    src: Path,
    to: str,
    tmp: Path,
    as_directory: bool,
    shard_bytes: int | None,
    metadata: dict[str, str],
    dtype: str | None = None,
) -> list[Path]:
    target = FORMATS_BY_NAME[to]
    if not as_directory:
        return target.write_weights(ws, tmp, metadata=metadata)
    # a folder: the source's files kept beside its weights, the files made from it, the weights
    keep_source_files(detect(src), tmp)
    for name, data in ws.companions.items():
        (tmp / name).write_bytes(data)
    config = tmp / "config.json"
    if dtype and config.is_file():  # transformers loads the weights in the dtype it names
        from ptconvert.weights.cast import config_with_dtype

        config.write_text(config_with_dtype(config.read_text(), dtype))
    if shard_bytes is not None:
        return target.write_weights(ws, tmp, max_shard_size=shard_bytes, metadata=metadata)
    return target.write_weights(ws, tmp / target.folder_file, metadata=metadata)


def _shard_writers() -> list[str]:
    return [f.name for f in FORMATS if f.writes_shards]


def _verify_target(tmp: Path, files: list[Path], as_directory: bool) -> Path:
    if not as_directory:
        return tmp
    index = next((f for f in files if f.name.endswith(".index.json")), None)
    return index or files[0]
