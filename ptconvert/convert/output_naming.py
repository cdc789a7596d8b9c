"""Where a conversion writes: the default output beside the source, a folder given as ``-o``,
the suffix a program's loader needs (``program_suffixed``: the API and ``optimize`` use it), and
the folder a program's client loads (``client_file``): the program under its format's
``folder_file`` (ONNX: ``model.onnx``, as optimum's ``ORTModelFor<Task>.from_pretrained`` reads
it) beside the source directory's kept files (config.json, generation_config.json, tokenizer and
preprocessor files). The graph engine and the generation route both write it so; ``-o x.onnx``
writes one file and says what a client misses (``one_file_note``). A weights folder keeps the
same files (``keep_source_files``)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from ptconvert.errors import PtconvertError
from ptconvert.formats import FORMATS, FORMATS_BY_NAME, Detection, detect
from ptconvert.options import Options


def _suffix(fmt: str) -> str:
    known = FORMATS_BY_NAME.get(fmt)
    return known.suffix if known else f".{fmt}"


def beside(src: Path, name: str | None = None) -> Path:
    """``name`` (else ``src``'s own) beside ``src``, where a default output goes; for a folder of
    the Hugging Face Hub cache (a snapshot, or a file in one) in the current folder instead,
    the snapshot named after its repository (``./tiny-gpt2-safetensors``): the cache is
    huggingface_hub's, a store of downloads ptconvert does not write into."""
    from ptconvert.hub import snapshot_of

    name = name or src.name
    found = snapshot_of(src)
    if found is None:
        return src.with_name(name)
    snapshot, repo = found
    if Path(os.path.abspath(src)) == snapshot and name.startswith(snapshot.name):
        name = repo + name[len(snapshot.name) :]
    return Path(name)


def default_output(src: Path, to: str) -> Path:
    return beside(src, src.name.split(".")[0] + _suffix(to))


def weight_targets() -> list[str]:
    """The formats weights can be written as."""
    return [f.name for f in FORMATS if f.writes_weights]


def weights_output(d: Detection, fmt: str, as_directory: bool) -> Path:
    """A folder beside a source written as a folder (a directory's, shards, a config made from
    the source), named after it; else a file named after the source, or after the folder that
    holds it and its parts (a shard index)."""
    src = d.path
    if as_directory:
        return folder_output(src, fmt)
    container = d.handler.named_after(src)
    if container != src:
        return beside(container, f"{container.name}-{fmt}")
    return beside(src, src.with_suffix(FORMATS_BY_NAME[fmt].suffix).name)


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
    if client_file(d, to):
        return folder_output(src, to)
    return default_output(src, to)


def folder_output(src: Path, to: str) -> Path:
    """A folder written beside ``src`` without ``-o`` (a directory's weights, a client's folder,
    a seq2seq export): ``NAME-safetensors``, ``NAME-onnx``, …"""
    return beside(src, f"{src.name.split('.')[0]}-{to}")


def names_folder(output: str | Path) -> bool:
    """``-o`` names a folder: one that exists, or a name ending in ``/`` (docs/outputs.md: the
    output takes its default name inside it)."""
    return str(output).endswith(os.sep) or Path(output).is_dir()


def program_suffixed(out: Path, to: str, *, chosen: bool = False) -> tuple[Path, list[str]]:
    """``-o``'s rule for a program (docs/outputs.md): a file name without a
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


def client_file(d: Detection, to: str) -> str:
    """The program's name in the folder its client loads (the target's ``folder_file``: ONNX's
    ``model.onnx``, as optimum's ``ORTModelFor<Task>.from_pretrained`` reads it) when the
    source has files that folder keeps (a Hugging Face directory's config.json, tokenizer);
    "" where a program of ``to`` from ``d`` is one file."""
    target = FORMATS_BY_NAME.get(to)
    if target is None or target.kind != "program" or not target.folder_file:
        return ""
    return target.folder_file if d.handler.kept_files(d.path) else ""


def writes_client_folder(name: str, output: str | Path | None) -> bool:
    """Whether the program named ``name`` in its client's folder (``client_file``) is written
    as that folder: unless ``-o`` names a file of its format (``-o x.onnx``: one file)."""
    if not name:
        return False
    if output is None or names_folder(output):
        return True
    return Path(output).suffix.lower() != Path(name).suffix


def one_file_note(to: str, name: str, client: str) -> str:
    """What ``-o x.onnx`` (one file where a client loads a folder) leaves a client without."""
    return (
        f"one {to} file, as -o names it: {client or 'its client'} loads a folder ({name} "
        "beside config.json): -o DIR/ writes it"
    )


def keep_source_files(d: Detection, folder: Path) -> list[Path]:
    """Copy the source's kept files (a directory's config.json, generation_config.json,
    tokenizer and preprocessor files: everything but its weights) into ``folder``; returns them."""
    kept = d.handler.kept_files(d.path)
    for path in kept:
        shutil.copy2(path, folder / path.name)
    return kept


def fill_client_folder(d: Detection, folder: Path, name: str) -> str:
    """The source's kept files beside the program ``name`` in ``folder``, as its client loads
    them; the note saying so."""
    kept = keep_source_files(d, folder)
    return f"a folder as its client loads it: {name} beside " + ", ".join(p.name for p in kept)


def client_options(opts: Options, client: str) -> tuple[Options, list[str]]:
    """A client's folder is fed other batch sizes and sequence lengths than the example's
    (optimum exports those axes dynamic): ``--dynamic-batch`` is implied (a Hugging Face
    model's sequence axes with it) unless dynamic dims were asked for; the note saying so."""
    if not client or opts.dynamic_batch or opts.dynamic:
        return opts, []
    note = (
        f"--dynamic-batch implied: {client} in its client's folder takes other batch sizes "
        "and sequence lengths, as optimum exports them"
    )
    return dataclasses.replace(opts, dynamic_batch=True), [note]
