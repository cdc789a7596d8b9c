"""A generation export from start to end: the directory's model loaded for the task, exported
with its cache, written atomically, checked by generating before it is put in place. Its plan
is the graph's ``Plan`` and its result the one ``ConversionReport`` (its ``generation``
section: the task, the cache, the check by generating)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ptconvert import progress
from ptconvert.convert.conversion_report import ConversionReport, GenerationResult
from ptconvert.convert.graph import Plan
from ptconvert.convert.state import StepRecord
from ptconvert.generation.check import FEATURE_INPUTS, NEW_TOKENS, PROMPT_LENGTHS, GenerationCheck
from ptconvert.generation.static_cache import cache_batch
from ptconvert.options import GENERATION_TASKS, Options


def plan(src: str | Path, to: str, opts: Options) -> Plan:
    """What ``convert`` would do for a generation task, after the checks it makes first: the
    model loaded with its cache, exported with it, and the check by generating."""
    from ptconvert.convert.graph import Edge
    from ptconvert.formats import detect
    from ptconvert.generation.loading import read_config
    from ptconvert.generation.targets import targets
    from ptconvert.generation.tasks import (
        FOLDER_KINDS,
        check_task,
        refuse_precision,
        refuse_trace_exporter,
    )
    from ptconvert.scan.guard import refuse_unsafe

    assert opts.task is not None
    opts.validate()
    refuse_precision(opts, src)
    refuse_trace_exporter(opts, src)
    refuse_unsafe(src)
    source_format = detect(src).format
    kind = check_task(opts.task, to, read_config(Path(src)), src)
    target = targets("seq2seq" if kind in FOLDER_KINDS else "decoder")[to]
    batch = cache_batch(opts.batch_sizes, target.batches)
    length = opts.cache_length or "the config's positions (at most 1024)"
    cache = (
        f"static cache, batch {batch}, length {length}"
        if target.static
        else "past_key_values.N.key|value in, present.N.key|value out"
        if kind == "decoder"
        else "past_key_values.N.decoder|encoder.key|value in, present.N.… out"
    )
    load = Edge(
        source_format,
        "module",
        "load_for_task",
        1,
        label=f"load the directory with transformers, cache on (a {kind} model)",
    )
    if kind in FOLDER_KINDS:
        files = ", ".join((*target.files, *target.extra_files))
        what = (
            f"export the encoder, and the decoder with its cache ({cache}); write a folder: "
            f"{files}, config.json, generation_config.json"
        )
    else:
        what = f"export with its cache ({cache}), write {to}"
    export = Edge("module", to, "export_with_cache", 1, label=what)
    check = ""
    if opts.verify:
        inputs = (
            f"{len(FEATURE_INPUTS)} different input_features (the decoder from its start token)"
            if kind == "speech-seq2seq"
            else f"prompt lengths {PROMPT_LENGTHS[0]}, {PROMPT_LENGTHS[1]}"
        )
        check = (
            f"generate {NEW_TOKENS} greedy tokens at batch "
            f"{', '.join(map(str, opts.batch_sizes or target.batches))} and {inputs}; compare "
            "tokens and logits with transformers' generate"
        )
    return Plan(source_format, to, [load, export], source=str(src), task=opts.task, check=check)


def convert(src: str | Path, to: str, output: str | Path | None, opts: Options) -> ConversionReport:
    """Export ``src`` (a Hugging Face directory) for ``opts.task`` to ``to``, checked by
    generating with the written file before it is put in place."""
    from ptconvert.atomic import atomic_path, check_output
    from ptconvert.convert.output_naming import (
        client_file,
        default_output,
        fill_client_folder,
        folder_output,
        one_file_note,
        writes_client_folder,
    )
    from ptconvert.formats import detect
    from ptconvert.generation.loading import load_model
    from ptconvert.generation.targets import targets
    from ptconvert.generation.tasks import FOLDER_KINDS, refuse_precision, refuse_trace_exporter
    from ptconvert.scan.guard import refuse_unsafe

    assert opts.task in GENERATION_TASKS
    started = time.perf_counter()
    src = Path(src)
    refuse_precision(opts, src)
    refuse_trace_exporter(opts, src)
    refuse_unsafe(src)
    seq2seq = GENERATION_TASKS[opts.task] in FOLDER_KINDS  # an encoder and a decoder: a folder
    target = targets("seq2seq" if seq2seq else "decoder").get(to)  # None: the task refuses it
    # a decoder its client loads from a folder (optimum's ORTModelForCausalLM: model.onnx
    # beside config.json) is written as one, unless -o names a file of its format
    d = detect(src)
    name = "" if seq2seq or target is None else client_file(d, to)
    client_folder = writes_client_folder(name, output)
    folder = seq2seq or client_folder
    out = (
        Path(output) if output else (folder_output(src, to) if folder else default_output(src, to))
    )
    check_output(out, [src], opts.force)
    if target is not None and target.requires:  # said before the model loads
        from ptconvert.deps import require_installed

        require_installed(target.requires)
    t0 = time.perf_counter()
    with progress.step(f"loading {src.name} for {opts.task}"):
        loaded = load_model(src, opts.task, to, opts)
    assert target is not None  # load_model let only a target of the task through
    model, notes = loaded.model, list(loaded.notes)
    source_format = d.format
    steps = [_record("load_for_task", f"{source_format} → module", t0, list(loaded.notes))]
    with atomic_path(out, directory=folder, replace=opts.force) as tmp:
        t0 = time.perf_counter()
        if client_folder:
            cache, interface = target.export(model, src, tmp / name, out / name, opts, notes)
            notes.append(fill_client_folder(d, tmp, name))
        else:
            cache, interface = target.export(model, src, tmp, out, opts, notes)
            if name:
                notes.append(one_file_note(to, name, target.client))
        steps.append(_record("export_with_cache", f"module → {to}", t0, notes[len(loaded.notes) :]))
        checked = _check(model, tmp, opts, target.batches) if opts.verify else None
        if checked is not None and target.client_check is not None:
            written = tmp / name if client_folder else tmp
            checked.notes.append(target.client_check(model, written, src, opts))
    if checked is not None:
        notes.extend(checked.notes)
    return ConversionReport(
        str(src),
        source_format,
        str(out),
        to,
        [s.route for s in steps],
        steps,
        round(time.perf_counter() - started, 3),
        notes,
        interface=interface,
        check="generation" if checked is not None else "none",
        generation=GenerationResult(opts.task, type(model).__name__, cache, checked),
    )


def _record(step: str, route: str, started: float, notes: list[str]) -> StepRecord:
    return StepRecord(step, route, round(time.perf_counter() - started, 3), "ok", list(notes))


def _check(model: Any, tmp: Path, opts: Options, batches: tuple[int, ...]) -> GenerationCheck:
    from ptconvert.generation.check import check_generation, features, prompts
    from ptconvert.generation.seq2seq import feature_shape, is_speech
    from ptconvert.generation.targets import open_stepper

    vocab = int(model.config.get_text_config().vocab_size)

    def make_inputs(batch: int, length: int) -> tuple[Any, dict[str, Any]]:
        import torch

        ids = prompts(vocab, batch, length, opts.seed)
        return ids, {"attention_mask": torch.ones_like(ids)}

    def make_features(batch: int, which: int) -> tuple[Any, dict[str, Any]]:
        return features(feature_shape(model), batch, which, opts.seed), {}

    speech = is_speech(model)
    stepper: Any = open_stepper(tmp, trust=True)  # our own output (an AOTI package: native code)
    if hasattr(stepper, "cross_check"):
        # parts that must agree (an ONNX folder's merged decoder and its split ones): each step
        # of one checked against the other's
        stepper.cross_check = True
    with progress.step("generating with the result and with transformers"):
        checked = check_generation(
            model,
            stepper,
            make_inputs=make_features if speech else make_inputs,
            batches=opts.batch_sizes or batches,
            prompt_lengths=FEATURE_INPUTS if speech else PROMPT_LENGTHS,
            path=tmp,
            prompt_label="feature input" if speech else "prompt length",
        )
    note = stepper.cross_note() if hasattr(stepper, "cross_note") else None
    checked.notes.extend([note] if note else [])
    return checked
