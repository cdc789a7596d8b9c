"""Human rendering of reports with rich (the CLI's default; ``--json`` bypasses this module).

Which rows and lines each report shows; the table they are laid out in, and the text of sizes and
errors, are ``render_table.py``'s; the progress display while a command runs is
``render_progress.py``'s.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ptconvert.render_table import Grid, error_text, leaf_name, size_text

if TYPE_CHECKING:  # the format registry is not needed to render a scan
    from ptconvert.formats.base import FileInfo, IOSpec


def _spec(s: IOSpec) -> str:
    shape = "[" + ", ".join(str(d) for d in s.shape) + "]" if s.shape is not None else ""
    return f"{s.name}: {s.dtype or '?'}{shape}"


def _dtype_words(dtype: str, h: dict[str, int]) -> str:
    """``float16 ×120 (12,582,912 el., 24.0 MiB)``: tensors, elements, bytes where known."""
    stored = f", {size_text(h['bytes'])}" if "bytes" in h else ""
    return f"{dtype} ×{h['tensors']} ({h['elements']:,} el.{stored})"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} ×{n}" for name, n in counts.items())


def render_info(info: FileInfo, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")  # a long path folds, never cut
    add_row = t.add_row

    def row(key: str, value: str) -> None:  # values are data, never rich markup
        add_row(escape(key), escape(value))

    t.add_row = row  # type: ignore[method-assign,assignment]
    t.add_row("path", info.path)
    t.add_row("format", f"{info.format} ({info.layout})")
    t.add_row("size", f"{size_text(info.size_bytes)} in {max(len(info.files), 1)} file(s)")
    if info.tensors is not None:
        t.add_row("tensors", f"{info.tensors:,}")
        t.add_row("parameters", f"{info.parameters or 0:,}")
    if info.dtypes:
        t.add_row("dtypes", ", ".join(_dtype_words(d, h) for d, h in info.dtypes.items()))
    if info.quantized is not None:
        q = info.quantized
        words = [f"ops: {_counts(q.ops)}"] if q.ops else []
        words += [f"weights: {_counts(q.weights)}"] if q.weights else []
        t.add_row("quantized", "\n".join(words))
    if info.largest:
        t.add_row(
            "largest",
            "\n".join(f"{e.name} {e.dtype}{e.shape}" for e in info.largest),
        )
    if info.inputs is not None:
        t.add_row("inputs", "\n".join(_spec(s) for s in info.inputs) or "-")
    if info.outputs is not None:
        t.add_row("outputs", "\n".join(_spec(s) for s in info.outputs) or "-")
    if info.opset:
        t.add_row("opset", ", ".join(f"{k} {v}" for k, v in info.opset.items()))
    if info.shards:
        t.add_row("shards", "\n".join(info.shards))
    for key, value in info.metadata.items():
        t.add_row(f"meta: {key}", _short(value))
    if info.contents and set(info.contents) != {e.name for e in info.largest}:
        t.add_row("contents", "\n".join(f"{k}: {v}" for k, v in list(info.contents.items())[:20]))
    needs = ", ".join(info.needs_code) or "no Python classes"
    if info.native_code:  # the scan's verdict for it is needs-code too
        needs += "; yes: native code runs on load (--trust)"
    elif not info.needs_code:
        needs = "no (loads without Python classes)"
    t.add_row("needs code", needs)
    if info.native_code:
        t.add_row("native code", "\n".join(info.native_code))
    for note in info.notes:
        t.add_row("note", note)
    console.print(t)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def render_formats(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console()
    t = Grid("format", "suffixes", "holds")
    for r in rows:
        t.add_row(r["name"], " ".join(r["suffixes"]) or "(directory)", r["holds"])
    console.print(t)


_BATCH_STYLE = {"converted": "green", "skipped": "cyan", "failed": "red", "not-run": "yellow"}


def render_batch(report: Any, console: Console | None = None) -> None:
    """A folder converted: one row per model, then the errors in full."""
    from pathlib import Path

    console = console or Console()
    t = Grid("model", "status", "check", "size", "seconds", "output", fixed=(1, 3, 4))
    for item in report.items:
        style = _BATCH_STYLE[item.status]
        out = Path(item.output)
        shown = out.relative_to(report.out_dir) if out.is_relative_to(report.out_dir) else out
        t.add_row(
            escape(item.src),
            f"[{style}]{item.status}[/{style}]",
            "-" if item.status in ("failed", "not-run") else item.check,
            size_text(item.size),
            f"{item.seconds:.1f}",
            "-" if item.status in ("failed", "not-run") else escape(str(shown)),
        )
    console.print(t)
    errors = Console(stderr=True)  # errors on stderr: -q keeps them, pipes get them apart
    for item in report.items:
        if item.error:
            errors.print(f"[red]{escape(item.src)}[/red]: {escape(item.error['message'])}")
    if report.counts.get("not-run"):
        console.print("not-run: not started after a failure (--keep-going goes on)")
    counts = ", ".join(f"{n} {k}" for k, n in report.counts.items() if n)
    console.print(
        f"{len(report.items)} models under {escape(report.src)} → {report.to} in "
        f"{escape(report.out_dir)}: "
        f"{counts or 'none found'} ({report.seconds:.1f} s, {report.executor}, -j {report.jobs})"
    )


def _path_of(route: list[str]) -> str:
    """["pt → weights", "weights → module"] as "pt → weights → module"."""
    return " → ".join([route[0].split(" → ")[0], *(step.split(" → ")[-1] for step in route)])


def render_every(report: Any, console: Console | None = None) -> None:
    """``--to all``: one row per format (size, check, median latency per batch size, against
    eager and torch.compile) under the two baselines; then each format's route, and why any
    was skipped or failed. Narrow enough for 80 columns."""
    from ptconvert.convert.optimize import speedup

    console = console or Console()
    sizes = report.batch_sizes
    label = f"ms @ {'/'.join(str(b) for b in sizes)}" if sizes else "ms"
    t = Grid("format", "size", "check", label, "× eager", "× compile", fixed=(1, 3, 4, 5))

    def ms(medians: dict[Any, float]) -> str:
        return " / ".join(f"{medians[b]:.3f}" if b in medians else "-" for b in sizes) or "-"

    def ratio(value: float | None) -> str:
        return f"{value:.2f}" if value is not None else "-"

    eager = report.baselines.get("eager", {})
    for name, medians in report.baselines.items():
        t.add_row(f"[dim]{name}[/dim]", "-", "-", ms(medians), ratio(speedup(eager, medians)), "-")
    for r in report.rows:
        style = {"ok": "", "failed": "red", "skipped": "yellow"}[r.status]
        t.add_row(
            f"[{style}]{r.format}[/{style}]" if style else r.format,
            size_text(r.size) if r.size is not None else "-",
            r.check if r.status == "ok" else r.status,
            ms(r.median_ms) if r.median_ms else "-",
            ratio(r.vs_eager),
            ratio(r.vs_compile),
        )
    console.print(t)
    kept = [r.format for r in report.rows if r.status == "ok" and not r.route]
    if kept:  # an interrupted run's finished formats (its manifest): their routes ran then
        console.print(f"kept from an earlier run, complete and verified: {', '.join(kept)}")
    for r in report.rows:
        if r.status == "ok" and r.route:
            console.print(f"{r.format}: {escape(_path_of(r.route))}")
        elif r.status != "ok":
            console.print(f"{r.format}: {r.status}: {escape(r.reason)}")
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    done = sum(1 for r in report.rows if r.status == "ok")
    console.print(
        f"{escape(report.source)} ({report.source_format}) → {done} formats in "
        f"{escape(report.out_dir)} ({report.seconds:.1f} s); weights formats run as eager does"
    )


_VERDICT_STYLE = {
    "clean": "green",
    "needs-code": "yellow",
    "error": "magenta",
    "dangerous": "bold red",
}


def render_scan(report: Any, console: Console | None = None) -> None:
    """One table of the files a loader reads, then each finding of the files that are not
    clean under its file (lines that wrap at spaces), then the verdict with what was skipped."""
    from rich.padding import Padding
    from rich.text import Text

    console = console or Console()
    t = Grid("file", "verdict", "pickles", "findings", fixed=(1, 2, 3), keys=0, paths=(0,))
    for f in report.files:
        style = _VERDICT_STYLE[f.verdict]
        t.add_row(
            escape(f.path), f"[{style}]{f.verdict}[/{style}]", str(f.pickles), str(len(f.findings))
        )
    if report.files:
        console.print(t)
    shown = 0
    for f in report.files:
        if not f.findings or shown >= _FINDINGS_SHOWN:
            continue
        console.print(Text(f"{f.path}: {f.verdict}", style=_VERDICT_STYLE[f.verdict]))
        for x in f.findings[: _FINDINGS_SHOWN - shown]:
            member = (
                x.member[len(f.path) :].lstrip(":") if x.member.startswith(f.path) else x.member
            )
            op = f"{x.opcode} @ {x.offset}" if x.opcode.isupper() else ""  # a pickle's opcode
            where = " in ".join(w for w in (op, member) if w)
            what = f"{x.global_name}: {x.reason}" if x.global_name else x.reason
            line = f"{x.severity}: {what}" + (f" ({where})" if where else "")
            console.print(Padding(Text(line), (0, 0, 0, 2)))
            shown += 1
    hidden = sum(len(f.findings) for f in report.files) - shown
    if hidden:
        console.print(f"… {hidden} more findings (--json lists every one)")
    for f in report.files:
        for note in f.notes:
            console.print(f"note: {escape(f.path)}: {escape(note)}")
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    counts = ", ".join(f"{n} {k}" for k, n in report.counts.items() if n)
    skipped = len(report.skipped)
    if skipped:
        counts += f"{', ' if counts else ''}{skipped} skipped: no loader reads them"
    console.print(f"verdict: {report.verdict} ({counts or 'no files'})")


_FINDINGS_SHOWN = 200


def render_conversion(report: Any, console: Console | None = None) -> None:
    """A conversion: for a program the route, each step, the notes and the parity per batch
    size; for weights what was written, how, and the bitwise check's verdict."""
    console = console or Console()
    if report.weights is not None:
        _render_weights(report, console)
        return
    if report.generation is not None:
        _render_generation(report, console)
        return
    console.print(  # paths whole (soft-wrapped): one line to copy
        f"[bold]{escape(report.source)}[/bold] ({report.source_format}) → "
        f"{report.target_format} in {report.seconds:.1f} s",
        soft_wrap=True,
    )
    steps = " → ".join(s.step for s in report.steps)
    if report.cached:  # its steps ran when the entry was filled (its note says): not timed here
        console.print(f"route: {steps}")
    else:
        t = Grid("step", "route", "status", "seconds", fixed=(2, 3))
        for s in report.steps:
            t.add_row(s.step, s.route, s.status, f"{s.seconds:.2f}")
        console.print(t)
    errors = [f"{s.step}: {s.error}" for s in report.steps if s.error]
    notes = [*(n for s in report.steps for n in s.notes or []), *errors, *report.notes]
    for note in dict.fromkeys(notes):  # each once
        console.print(f"note: {escape(note)}")
    if report.interface:
        outputs = report.interface["outputs"]
        console.print(f"load: {escape(report.interface['load'])}")
        console.print(
            f"call: {escape(report.interface['call'])}"
            + (f" → {', '.join(outputs)}" if outputs else "")
        )
        for line in report.interface["accepts"]:
            console.print(f"accepts: {escape(line)}")
    if report.dynamic_range and not report.interface:
        for where, words in report.dynamic_range.items():
            console.print(f"dynamic: {escape(where)}: {escape(words)}")
    if report.parity is not None:
        console.print(parity_table(report.parity))
    if report.accuracy is not None:
        console.print(f"accuracy: {escape(report.accuracy.summary())}")
    if report.quantized is not None:
        console.print(f"quantized: {escape(report.quantized.summary())}")
    console.print(f"output: [bold]{escape(report.output)}[/bold]", soft_wrap=True)  # last: seen


def _render_generation(report: Any, console: Console) -> None:
    """A generation export: the cache it carries, how to call it, the check by generating."""
    gen = report.generation
    cache = gen.cache
    said = (
        f"static, batch {cache['batch_size']}, {cache['length']} positions"
        if cache["kind"] == "static"
        else f"{cache['layers']} layers of {cache['past']} in, {cache['present']} out"
    )
    lines = [
        f"[bold]{escape(report.source)}[/bold] → [bold]{escape(report.output)}[/bold] "
        f"({report.target_format}, {gen.task}, {gen.model_class}) in {report.seconds:.1f} s",
        f"  cache: {escape(said)}",
        "  call: " + escape(report.interface.get("call") or ", ".join(report.interface["inputs"])),
    ]
    check = gen.check
    if check is None:
        lines.append("  check: none (--no-verify)")
    else:
        lines.append(
            f"  check: generation {check.status}: greedy tokens and each step's logits "
            f"(tolerance {check.tolerance:g}) against transformers' generate"
        )
        lines += [
            f"    batch {run.batch}, prompt {run.prompt_length}: {run.new_tokens} tokens "
            f"{run.status}, max abs error {run.max_abs_error:.2g}, {run.distinct_tokens} distinct"
            for run in check.runs
        ]
    lines += [f"  note: {escape(note)}" for note in report.notes]
    console.print("\n".join(lines), highlight=False, soft_wrap=True)


def render_plan(payload: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    t = Grid("#", "from", "to", "step", "needs", fixed=(0, 1, 2))
    for i, s in enumerate(payload["steps"], 1):
        t.add_row(
            str(i), s["from"], s["to"], escape(s["what"] or s["step"]), ", ".join(s["needs"]) or "-"
        )
    console.print(t)
    for need, hint in payload["missing"].items():
        console.print(f"[bold red]missing[/bold red] {need}: {escape(hint)}")
    if payload["runnable"]:
        console.print("runnable: every need is met")
    if payload.get("task"):
        console.print(f"task: {escape(payload['task'])} (exported with its cache)")
    if payload.get("check"):
        console.print(f"check: {escape(payload['check'])}")
    for note in payload.get("notes", []):
        console.print(f"note: {escape(note)}")
    for what, words in payload.get("dynamic", {}).items():
        console.print(f"dynamic: {escape(what)}: {escape(words)}")
    need, free = payload.get("memory_estimate_bytes"), payload.get("memory_available_bytes")
    if need is not None:
        console.print(
            f"memory: about {need / 2**30:.1f} GiB at its peak"
            + (f" ({free / 2**30:.1f} GiB available)" if free is not None else "")
        )


def render_edges(edges: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console()
    t = Grid("from", "to", "converter", "cost", "needs", fixed=(0, 1, 3))
    for e in edges:
        t.add_row(e["from"], e["to"], e["step"], str(e["cost"]), ", ".join(e["needs"]) or "-")
    console.print(t)


def render_cache(info: Any, console: Console | None = None) -> None:
    """``cache info``: the root, then one row per entry (oldest first)."""
    console = console or Console()
    incomplete = f", {info.incomplete} incomplete (refilled when next asked for)"
    console.print(
        f"[bold]{escape(info.root)}[/bold]: {len(info.entries)} entries, "
        f"{size_text(info.total_bytes)}{incomplete if info.incomplete else ''}"
    )
    if info.problem:
        console.print(f"[bold red]unusable[/bold red]: {escape(info.problem)}")
    if info.entries:
        t = Grid("key", "target", "source", "size", "created (UTC)", fixed=(0, 1, 3, 4))
        for e in info.entries:
            t.add_row(e.key[:12], e.target, escape(e.source), size_text(e.bytes), e.created)
        console.print(t)


def render_verify(report: Any, console: Console | None = None) -> None:
    """Verdict, then per batch size and output: errors against eager and against fp64."""
    console = console or Console()
    console.print(
        f"[bold]{report.status}[/bold]: {escape(report.candidate)} vs {escape(report.reference)}"
    )
    if report.weights is not None:
        w = report.weights
        console.print(f"{w.tensors} tensors bitwise equal ({size_text(w.bytes_compared)})")
        return
    # what both sides were fed: the candidate's inputs, by the reference's names (→ renamed)
    fed = [
        f"{r} → {report.input_map[r]}" if r in report.input_map else r for r in report.inputs_fed
    ]
    line = f"inputs fed to both: {', '.join(fed) or 'none'}"
    if report.inputs_left_out:
        line += f" (left out: {', '.join(report.inputs_left_out)})"
    console.print(escape(line))
    for where, words in getattr(report, "ranges", {}).items():
        console.print(f"dynamic: {escape(where)}: {escape(words)}")
    for note in report.notes:
        style = "bold red" if note.startswith("nothing was compared") else "bold"
        console.print(f"[{style}]note[/{style}]: {escape(note)}")
    t = parity_table(report.parity)
    console.print(t)
    env = report.environment
    console.print(f"torch {env.get('torch')}, {env.get('threads')} threads, CUDA {env.get('cuda')}")


def render_bench(report: Any, console: Console | None = None) -> None:
    """Latency per runtime and batch size (median, p25–p75, first call), then the speedups."""
    console = console or Console()
    t = Grid(
        "batch", "runtime", "median ms", "p25–p75 ms", "first call s", fixed=(0, 2, 3, 4), keys=2
    )
    for x in report.timings:
        t.add_row(
            str(x.batch),
            x.runtime,
            f"{x.median_ms:.3f}",
            f"{x.p25_ms:.3f}–{x.p75_ms:.3f}",
            f"{x.first_call_s:.3f}",
        )
    console.print(t)
    for row in report.speedups:
        parts = [_speedup_words(row, other) for other in ("eager", "torch.compile")]
        if any(parts):
            console.print(f"batch {row['batch']}: artifact vs " + "; ".join(p for p in parts if p))
    for name, why in report.skipped.items():
        console.print(f"not timed: {name} ({escape(why)})")
    for note in getattr(report, "notes", []):
        console.print(f"note: {escape(note)}")
    console.print(
        f"{report.threads} threads, {report.repeats} interleaved rounds, "
        f"peak RSS {report.peak_rss_mib:.0f} MiB"
    )


def _speedup_words(row: dict[str, Any], other: str) -> str:
    """``eager 2.31× faster (1.9–2.7×)``, or ``eager 1.05×, within noise (0.80–1.31×)``: a
    speedup is said only when the spread of the timings keeps it away from 1."""
    ratio = row.get(f"artifact_vs_{other}")
    if ratio is None:
        return ""
    low, high = row.get(f"artifact_vs_{other}_range") or (ratio, ratio)
    spread = f"{low:.2f}–{high:.2f}×"
    if low <= 1 <= high:
        return f"{other} {ratio:.2f}×, within noise ({spread})"
    return f"{other} {ratio:.2f}× {'faster' if ratio > 1 else 'slower'} ({spread})"


def parity_table(parity: Any) -> Grid:
    """Errors against eager and against the fp64 run, per output (named by its path,
    ``past.0``): the sizes that passed in one row an output, their worst errors; a size that
    did not pass in rows of its own. "outside" and "detail" only when some row has one."""
    passed = [s for s in parity.sizes if s.status == "pass" and s.outputs]
    worst: dict[str, list[Any]] = {}
    for s in passed:
        for o in s.outputs:
            worst.setdefault(o.name, []).append(o)
    batches = ",".join(str(s.batch) for s in passed)
    rows = [(batches, "pass", _worst(results), "") for results in worst.values()]
    for s in (s for s in parity.sizes if s not in passed):
        rows += [(str(s.batch), o.status, o, o.detail) for o in s.outputs]
        rows += [] if s.outputs else [(str(s.batch), s.status, None, s.detail)]
    outside = any(r is not None and r.outside_tolerance for _, _, r, _ in rows)
    detail = any(d for *_, d in rows)
    headers = ["batch", "output", "status", "max abs", "max rel", "RMSE vs fp64", "eager RMSE"]
    headers += ["outside"] * outside + ["detail"] * detail
    t = Grid(*headers, fixed=(2, 3, 4, 5, 6, 7) if outside else (2, 3, 4, 5, 6), keys=2)
    for size, status, r, words in rows:
        cells = ["-", status, "", "", "", ""] + [""] * outside
        if r is not None:
            rm = "-" if r.rmse_vs_fp64 is None else error_text(r.rmse_vs_fp64)
            em = "-" if r.eager_rmse_vs_fp64 is None else error_text(r.eager_rmse_vs_fp64)
            cells = [escape(leaf_name(r.name)), status, error_text(r.max_abs_error)]
            cells += [error_text(r.max_rel_error), rm, em]
            cells += [f"{r.outside_tolerance:.1%}"] * outside
        t.add_row(size, *cells, *[escape(words)] * detail)
    return t


def _worst(results: list[Any]) -> Any:
    """One output's largest errors over the sizes that passed (eager's RMSE: at the same size
    as the candidate's largest)."""
    top = max(results, key=lambda o: o.rmse_vs_fp64 or 0.0)
    return dataclasses.replace(
        top,
        max_abs_error=max(o.max_abs_error for o in results),
        max_rel_error=max(o.max_rel_error for o in results),
        outside_tolerance=max(o.outside_tolerance for o in results),
    )


def render_optimize(report: Any, console: Console | None = None) -> None:
    """``--optimize``: every candidate, its latency per batch size and why it was kept or not."""
    console = console or Console()
    console.print(
        f"[bold]{escape(report.source)}[/bold] → "
        + (
            f"[bold]{escape(report.output)}[/bold] ({report.kept})"
            if report.output
            else "no artifact kept"
        )
        + f" in {report.seconds:.1f} s ({report.device})"
    )
    sizes = report.batch_sizes
    t = Grid(
        "runtime",
        "outcome",
        "check",
        *[f"batch {b} ms" for b in sizes],
        "× eager",
        "why",
        fixed=(1, *range(3, len(sizes) + 4)),
    )
    for c in report.candidates:
        t.add_row(
            c.runtime,
            c.outcome,
            c.check if c.outcome != "baseline" else "",
            *[f"{c.median_ms[b]:.3f}" if b in c.median_ms else "" for b in report.batch_sizes],
            f"{c.vs_eager:.2f}" if c.vs_eager is not None else "",
            escape(c.reason),
        )
    console.print(t)
    for note in getattr(report, "notes", []):
        console.print(f"note: {escape(note)}")


def _render_weights(report: Any, console: Console) -> None:
    """A weights conversion: what was written, how, and the verification verdict."""
    w = report.weights
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")  # a long path folds, never cut
    rows = [
        ("from", f"{report.source} ({report.source_format})"),
        ("to", f"{report.output} ({report.target_format})"),
        (
            "path",
            "fast: byte copies in the kernel"
            if w.path == "fast"
            else "some tensors rebuilt in memory from their storage bytes",
        ),
        ("tensors", f"{w.tensors} ({w.stored} stored, {size_text(w.bytes)})"),
        ("time", f"{report.seconds:.2f} s"),
    ]
    if w.unwrapped:
        rows.append(("unwrapped", f"took the weights from {w.unwrapped!r}"))
    if w.stripped_prefix:
        rows.append(("renamed", f"stripped the prefix {w.stripped_prefix!r} from every key"))
    for k, v in w.other_contents.items():
        rows.append(("left out", f"{k}: {v}"))
    for alias, kept in w.aliases.items():
        rows.append(("tied", f"{alias} → {kept} (stored once)"))
    check = w.verification
    rows.append(
        (
            "verified",
            f"{check.status}: {check.tensors} tensors bitwise equal "
            f"({size_text(check.bytes_compared)}) to an independent reading of the source"
            + (f" cast to {w.cast_to}" if w.cast_to else "")
            + f" ({check.reader}, {check.reader_seconds:.2f} s)"
            if check
            else "skipped (--no-verify)",
        )
    )
    rows += [("note", n) for n in report.notes]
    for k, v in rows:
        t.add_row(escape(k), escape(v))
    console.print(t)
