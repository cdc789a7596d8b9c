"""Where a conversion writes: the default output beside the source, a folder given as ``-o``,
and the suffix a program's loader needs (``program_suffixed``: the API and ``optimize`` use it)."""

from __future__ import annotations

import os
from pathlib import Path

from ptconvert.errors import PtconvertError
from ptconvert.formats import FORMATS, FORMATS_BY_NAME, Detection, detect
from ptconvert.options import Options


def _suffix(fmt: str) -> str:
    known = FORMATS_BY_NAME.get(fmt)
    return known.suffix if known else f".{fmt}"


def default_output(src: Path, to: str) -> Path:
    return src.with_name(src.name.split(".")[0] + _suffix(to))


def weight_targets() -> list[str]:
    """The formats weights can be written as."""
    return [f.name for f in FORMATS if f.writes_weights]


def weights_output(d: Detection, fmt: str, as_directory: bool) -> Path:
    """A folder beside a source written as a folder (a directory's, shards, a config made from
    the source), named after it; else a file named after the source, or after the folder that
    holds it and its parts (a shard index)."""
    src = d.path
    if as_directory:
        return src.parent / f"{src.name.split('.')[0]}-{fmt}"
    container = d.handler.named_after(src)
    if container != src:
        return container.parent / f"{container.name}-{fmt}"
    return src.with_suffix(FORMATS_BY_NAME[fmt].suffix)


def writes_directory(
    d: Detection, to: str, max_shard_size: str | None, output: str | Path | None = None
) -> bool:
    """Whether the conversion writes a folder: shards, or a source whose format keeps files
    beside its weights (a directory's config and tokenizer, a config made from metadata) —
    unless it keeps none of its own and ``output`` names one file of the target format."""
    if max_shard_size:
        return True
    if not d.handler.output_is_directory(d.path, d.layout):
        return False
    target = FORMATS_BY_NAME[to]
    one_file = (
        output is not None
        and not names_folder(output)
        and str(output).endswith(target.suffixes or (target.suffix,))
    )
    return not (one_file and not d.handler.kept_files(d.path))


def byte_copy(src_format: str, to: str) -> bool:
    """Whether ``convert`` takes the weights path (byte copies checked bitwise), not the graph."""
    from ptconvert.weights.read import weight_sources

    return to in weight_targets() and src_format in weight_sources()


def output_for(src: Path, to: str, opts: Options) -> Path:
    """Where ``convert`` writes ``src`` converted to ``to`` when no output is given."""
    try:
        d = detect(src)
    except PtconvertError:
        return default_output(src, to)  # the conversion will say what is wrong with it
    if byte_copy(d.format, to):
        return weights_output(d, to, writes_directory(d, to, opts.max_shard_size))
    return default_output(src, to)


def names_folder(output: str | Path) -> bool:
    """``-o`` names a folder: one that exists, or a name ending in ``/`` (README, "Outputs and
    failures": the output takes its default name inside it)."""
    return str(output).endswith(os.sep) or Path(output).is_dir()


def program_suffixed(out: Path, to: str, *, chosen: bool = False) -> tuple[Path, list[str]]:
    """``-o``'s rule for a program (README, "Outputs and failures"): a file name without a
    suffix of the target format gets its first one where the format's loader refuses it
    otherwise (torch.export.load and aoti_load_package want ``.pt2``), and for any program
    format ptconvert ``chosen`` (``--optimize``: the user could not name it); weights, other
    names the user gave, and a name with the suffix are kept. Returns the name and the note
    saying what the rule did. ``api._output_name`` and ``--optimize`` both apply it."""
    target = FORMATS_BY_NAME.get(to)
    if target is None or target.kind != "program":
        return out, []
    if not (chosen or target.loader_needs_suffix):
        return out, []
    suffixes = target.suffixes or (target.suffix,)
    if out.name.endswith(suffixes):
        return out, []
    named = out.with_name(out.name + suffixes[0])
    return named, [f"-o {out.name} lacks the {to} suffix {suffixes[0]}: written as {named}"]
