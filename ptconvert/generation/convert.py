"""A generation export from start to end: the directory's model loaded for the task, exported
with its cache, written atomically, checked by generating before it is put in place."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert import progress
from ptconvert.generation.check import FEATURE_INPUTS, NEW_TOKENS, PROMPT_LENGTHS, GenerationCheck
from ptconvert.generation.static_cache import BATCHES, cache_batch
from ptconvert.options import GENERATION_TASKS, Options
from ptconvert.report import Report


@dataclass
class GenerationReport(Report):
    source: str
    output: str
    target_format: str
    task: str
    model_class: str
    # the cache the artifact carries: {"kind": "static", "batch_size", "length"} (pt2) or
    # {"kind": "inputs", "layers", "inputs", "outputs"} (ONNX past/present)
    cache: dict[str, Any]
    interface: dict[str, Any]
    check: str  # "generation" (generated against transformers) or "none" (--no-verify)
    seconds: float
    generation: GenerationCheck | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class GenerationPlan(Report):
    source: str
    target_format: str
    task: str
    kind: str  # decoder | seq2seq | speech-seq2seq
    steps: list[str]
    runnable: bool = True
    missing: dict[str, str] = field(default_factory=dict)


def plan(src: str | Path, to: str, opts: Options) -> GenerationPlan:
    """What ``convert`` would do for a generation task, after the checks it makes first."""
    from ptconvert.formats import detect
    from ptconvert.generation.loading import read_config
    from ptconvert.generation.seq2seq_folder import FILES
    from ptconvert.generation.tasks import FOLDER_KINDS, check_task
    from ptconvert.scan.guard import refuse_unsafe

    assert opts.task is not None
    opts.validate()
    refuse_unsafe(src)
    detect(src)
    kind = check_task(opts.task, to, read_config(Path(src)), src)
    batch = cache_batch(opts.batch_sizes)
    length = opts.cache_length or "the config's positions (at most 1024)"
    cache = (
        f"static cache, batch {batch}, length {length}"
        # aoti: the program compiled by AOTInductor (aoti_cache.py), pte: lowered by ExecuTorch
        if to in ("pt2", "aoti", "pte")
        else "past_key_values.N.key|value in, present.N.key|value out"
        if kind == "decoder"
        else "past_key_values.N.decoder|encoder.key|value in, present.N.… out"
    )
    if kind in FOLDER_KINDS:
        files = ", ".join(FILES[to])
        steps = [
            "load the directory with transformers (cache on)",
            f"export the encoder, and the decoder with its cache ({cache})",
            f"write a folder: {files}, config.json, generation_config.json",
        ]
    else:
        steps = [
            "load the directory with transformers (cache on)",
            f"export with its cache ({cache})",
            f"write {to}",
        ]
    if opts.verify:
        inputs = (
            f"{len(FEATURE_INPUTS)} different input_features (the decoder from its start token)"
            if kind == "speech-seq2seq"
            else f"prompt lengths {PROMPT_LENGTHS[0]}, {PROMPT_LENGTHS[1]}"
        )
        steps.append(
            f"generate {NEW_TOKENS} greedy tokens at batch "
            f"{', '.join(map(str, opts.batch_sizes or BATCHES))} and {inputs}; compare tokens "
            "and logits with transformers' generate"
        )
    return GenerationPlan(str(src), to, opts.task, kind, steps)


def convert(src: str | Path, to: str, output: str | Path | None, opts: Options) -> GenerationReport:
    """Export ``src`` (a Hugging Face directory) for ``opts.task`` to ``to``, checked by
    generating with the written file before it is put in place."""
    from ptconvert.atomic import atomic_path, check_output
    from ptconvert.convert.output_naming import default_output
    from ptconvert.generation.loading import load_model
    from ptconvert.generation.tasks import FOLDER_KINDS
    from ptconvert.scan.guard import refuse_unsafe

    assert opts.task in GENERATION_TASKS
    started = time.perf_counter()
    src = Path(src)
    refuse_unsafe(src)
    folder = GENERATION_TASKS[opts.task] in FOLDER_KINDS  # an encoder and a decoder: a folder
    out = (
        Path(output) if output else (folder_output(src, to) if folder else default_output(src, to))
    )
    check_output(out, [src], opts.force)
    if to == "pte":  # said before the model loads
        from ptconvert.deps import require_installed

        require_installed("executorch")
    with progress.step(f"loading {src.name} for {opts.task}"):
        loaded = load_model(src, opts.task, to, opts)
    model, notes = loaded.model, list(loaded.notes)
    with atomic_path(out, directory=folder, replace=opts.force) as tmp:
        if folder:
            cache, interface = _seq2seq(model, tmp, to, opts, notes)
        elif to == "pt2":
            cache, interface = _pt2_decoder(model, tmp, opts, notes)
        elif to == "aoti":  # the static-cache program compiled by AOTInductor
            from ptconvert.generation.aoti_cache import export_package

            cache, interface = export_package(model, src, tmp, out, opts, notes)
        elif to == "pte":  # the static-cache program lowered by ExecuTorch
            from ptconvert.generation.pte_cache import export_program

            cache, interface = export_program(model, tmp, opts, notes)
        else:
            cache, interface = _onnx_decoder(model, tmp, opts, notes)
        checked = _check(model, tmp, opts) if opts.verify else None
    if checked is not None:
        notes.extend(checked.notes)
    return GenerationReport(
        str(src),
        str(out),
        to,
        opts.task,
        type(model).__name__,
        cache,
        interface,
        "generation" if checked is not None else "none",
        round(time.perf_counter() - started, 3),
        checked,
        notes,
    )


def folder_output(src: Path, to: str) -> Path:
    """Where a seq2seq export goes without ``-o``: a folder ``NAME-pt2`` / ``NAME-onnx`` beside
    the source directory."""
    return src.with_name(f"{src.name.split('.')[0]}-{to}")


def _seq2seq(
    model: Any, tmp: Path, to: str, opts: Options, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The encoder and the decoder into the folder ``tmp``, with the model's configs."""
    from ptconvert.generation import seq2seq
    from ptconvert.generation.seq2seq_folder import (
        CONFIGS,
        DECODER_ONNX,
        DECODER_PT2,
        ENCODER_ONNX,
        ENCODER_PT2,
        WITH_PAST_ONNX,
    )

    start = seq2seq.start_token(model)
    if seq2seq.is_speech(model):
        mels, frames = seq2seq.feature_shape(model)
        source = f"input_features[batch, {mels}, {frames}]"
    else:
        source = "input_ids, attention_mask"
    if to == "pt2":
        from ptconvert.generation.static_cache import cache_length, static_meta

        batch = cache_batch(opts.batch_sizes)
        length = cache_length(model, opts.cache_length)
        meta = static_meta(
            model, opts, batch, length, decoder_start_token_id=start, **seq2seq.encoder_meta(model)
        )
        with progress.step(
            f"exporting the encoder and the decoder with a static cache (batch {batch}, "
            f"{length} positions)"
        ):
            seq2seq.export_pt2(model, tmp, batch, length, meta)
        notes.append(
            f"decoder's static cache of {batch} row(s) × {length} positions inside "
            f"{DECODER_PT2} (mutated buffers; the cross-attention keys and values are "
            "computed from the encoder's states in every call); a smaller batch runs padded "
            "with copies of its last row (ptconvert.generate does it)"
        )
        cache = {"kind": "static", "batch_size": batch, "length": length}
        mask = "" if seq2seq.is_speech(model) else "encoder_attention_mask, "
        interface = {
            "call": f"{ENCODER_PT2}({source}) → last_hidden_state h "
            f"once; {DECODER_PT2}(decoder_input_ids=ids[batch, n], "
            f"encoder_hidden_states=h, {mask}cache_position=arange(pos, pos + "
            f"n)) → logits, from decoder_start_token_id {start}",
            "files": [ENCODER_PT2, DECODER_PT2, *CONFIGS],
            "decoder_start_token_id": start,
        }
    else:
        from ptconvert.generation.seq2seq_onnx import PAST, PRESENT, export_seq2seq_onnx

        with progress.step("exporting the encoder and the decoders to ONNX"):
            notes.extend(export_seq2seq_onnx(model, tmp, opts))
        import onnx

        graphs: dict[str, Any] = {}
        for name in (ENCODER_ONNX, DECODER_ONNX, WITH_PAST_ONNX):
            graph = onnx.load(str(tmp / name), load_external_data=False).graph
            graphs[name] = {"inputs": [i.name for i in graph.input],
                            "outputs": [o.name for o in graph.output]}  # fmt: skip
        layers = sum(1 for n in graphs[WITH_PAST_ONNX]["inputs"] if n.startswith("past")) // 4
        interface = {
            "call": f"{ENCODER_ONNX}({source}) once, {DECODER_ONNX} on decoder_start_token_id "
            f"{start}, "
            f"{WITH_PAST_ONNX} a token a step (its present.N.decoder fed back as past, the "
            "first step's present.N.encoder as they are)",
            "files": {**graphs, **{name: {} for name in CONFIGS}},
            "decoder_start_token_id": start,
        }
        cache = {"kind": "inputs", "layers": layers,
                 "past": PAST.format("N", "decoder|encoder", "key|value"),
                 "present": PRESENT.format("N", "decoder|encoder", "key|value")}  # fmt: skip
    seq2seq.write_configs(model, tmp)
    return cache, interface


def _pt2_decoder(
    model: Any, tmp: Path, opts: Options, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    from ptconvert.generation.static_cache import (
        cache_length,
        export_decoder,
        save_program,
        static_meta,
    )

    batch = cache_batch(opts.batch_sizes)
    length = cache_length(model, opts.cache_length)
    with progress.step(f"exporting with a static cache (batch {batch}, {length} positions)"):
        ep = export_decoder(model, batch, length)
    meta = static_meta(model, opts, batch, length)
    with progress.step(f"writing {tmp.name}"):
        save_program(ep, tmp, meta)
    notes.append(
        f"static cache of {batch} row(s) × {length} positions inside the program (mutated "
        "buffers); a smaller batch runs padded with copies of its last row "
        "(ptconvert.generate does it)"
    )
    cache = {"kind": "static", "batch_size": batch, "length": length}
    interface = {
        "call": "prog(input_ids=ids[batch, n], cache_position=arange(pos, pos + n)) → logits",
        "inputs": ["input_ids", "cache_position"],
        "outputs": ["logits"],
    }
    return cache, interface


def _onnx_decoder(
    model: Any, tmp: Path, opts: Options, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    from ptconvert.generation.onnx_past import export_decoder_onnx

    with progress.step("exporting to ONNX with past_key_values inputs"):
        notes.extend(export_decoder_onnx(model, tmp, opts))
    import onnx

    graph = onnx.load(str(tmp), load_external_data=False).graph
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    layers = sum(1 for n in inputs if n.startswith("past_key_values.")) // 2
    cache = {"kind": "inputs", "layers": layers, "past": "past_key_values.N.key|value",
             "present": "present.N.key|value"}  # fmt: skip
    return cache, {"inputs": inputs, "outputs": outputs}


def _check(model: Any, tmp: Path, opts: Options) -> GenerationCheck:
    from ptconvert.generation.check import check_generation, features, prompts
    from ptconvert.generation.runner import open_stepper
    from ptconvert.generation.seq2seq import feature_shape, is_speech

    vocab = int(model.config.get_text_config().vocab_size)

    def make_inputs(batch: int, length: int) -> tuple[Any, dict[str, Any]]:
        import torch

        ids = prompts(vocab, batch, length, opts.seed)
        return ids, {"attention_mask": torch.ones_like(ids)}

    def make_features(batch: int, which: int) -> tuple[Any, dict[str, Any]]:
        return features(feature_shape(model), batch, which, opts.seed), {}

    speech = is_speech(model)
    with progress.step("generating with the result and with transformers"):
        return check_generation(
            model,
            open_stepper(tmp, trust=True),  # our own output (an AOTI package: native code)
            make_inputs=make_features if speech else make_inputs,
            batches=opts.batch_sizes or BATCHES,
            prompt_lengths=FEATURE_INPUTS if speech else PROMPT_LENGTHS,
            path=tmp,
            prompt_label="feature input" if speech else "prompt length",
        )
