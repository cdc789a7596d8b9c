"""``ptconvert bench`` on a generation export: time to the first token and per-token latency of
the artifact (``runner.greedy``, what ``ptconvert.generate`` runs) against transformers'
``generate`` on the eager model (greedy, its default dynamic cache) and ``torch.compile``d
(transformers' own compiled decoding: a static cache and ``compile_config``, forced on the CPU),
on the same prompt and the same number of new tokens.

The timing is ``verify.bench.bench``'s (warm-up, interleaved repeats, medians and quartiles):
each call it times is one whole generation, and each contender records the split of that call
(the first token; the tokens after it, per token) for the same rounds. transformers' split is
read from a streamer: ``generate`` hands it the prompt, then each new token as it is chosen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert import _compat
from ptconvert.errors import UsageError
from ptconvert.report import Report
from ptconvert.verify.bench import BenchReport, _quantiles, bench

if TYPE_CHECKING:
    from ptconvert.options import BenchKeywords, Options

BATCH_SIZES = (1, 8)
PROMPT_LENGTH = 16
NEW_TOKENS = 32
CONTENDERS = ("eager", "torch.compile", "artifact")


@dataclass(frozen=True)
class Export:
    """What bench needs to know of a generation export, read without loading it."""

    task: str
    format: str  # the target the export was written as (a folder: its layout, pt2 | onnx)
    layout: str  # decoder | seq2seq (a folder)
    batch: int | None = None  # a static cache's rows (None: any batch)
    length: int | None = None  # a static cache's positions


def generation_export(path: Path) -> Export | None:
    """The generation export at ``path`` (a pt2, AOTI package or .pte with a static cache, an
    ONNX decoder with ``past_key_values`` inputs, a seq2seq export's folder), else None."""
    from ptconvert.errors import PtconvertError
    from ptconvert.generation.targets import target_of

    if not path.exists():
        return None
    try:
        fmt, target = target_of(path)
    except PtconvertError:
        return None
    meta = target.read(path) if target is not None else None
    if target is None or meta is None or "task" not in meta:
        return None
    return Export(
        str(meta["task"]), fmt, target.layout, _int(meta, "batch_size"),
        _int(meta, "cache_length"),
    )  # fmt: skip


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return int(value) if isinstance(value, int) else None


@dataclass
class TokenTiming(Report):
    """One contender at one batch size: medians and quartiles over the timed rounds."""

    runtime: str
    batch: int
    first_token_ms: float
    first_token_p25_ms: float
    first_token_p75_ms: float
    per_token_ms: float
    per_token_p25_ms: float
    per_token_p75_ms: float
    samples: int


@dataclass
class GenerationBenchReport(BenchReport):
    """``BenchReport`` (its timings: one whole generation per call) plus the split of each
    generation: ``tokens`` (time to the first token, per token after it) and ``ratios`` per
    batch, the reference's median over the artifact's (above 1: the artifact is faster)."""

    mode: str = "generation"
    task: str = ""
    prompt_length: int = 0
    new_tokens: int = 0
    tokens: list[TokenTiming] = field(default_factory=list)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The table ``ptconvert bench`` prints for a generation export."""
        # a speech model's input: features of its fixed shape (no prompt length)
        prompt = f"prompt of {self.prompt_length} tokens" if self.prompt_length else "features"
        lines = [
            f"{self.artifact} ({self.task}): greedy, {prompt}, {self.new_tokens} new tokens",
            f"{'batch':>5}  {'runtime':<14} {'first token ms':>15} {'(p25–p75)':<17} "
            f"{'per token ms':>13} {'(p25–p75)':<17}",
        ]
        for t in self.tokens:
            first = f"{t.first_token_p25_ms:.3f}–{t.first_token_p75_ms:.3f}"
            per = f"{t.per_token_p25_ms:.3f}–{t.per_token_p75_ms:.3f}"
            lines.append(
                f"{t.batch:>5}  {t.runtime:<14} {t.first_token_ms:>15.3f} {first:<17} "
                f"{t.per_token_ms:>13.3f} {per:<17}"
            )
        for row in self.ratios:
            parts = [
                f"{other}: first token {row[f'first_token_vs_{other}']:.2f}×, per token "
                f"{row[f'per_token_vs_{other}']:.2f}×"
                for other in ("eager", "torch.compile")
                if f"per_token_vs_{other}" in row
            ]
            if parts:
                lines.append(f"batch {row['batch']}: artifact vs " + "; ".join(parts))
        lines += [f"not timed: {name} ({why})" for name, why in self.skipped.items()]
        lines += [f"note: {note}" for note in self.notes]
        lines.append(
            f"{self.threads} threads, {self.repeats} interleaved rounds, peak RSS "
            f"{self.peak_rss_mib:.0f} MiB; above 1× the artifact is faster"
        )
        return "\n".join(lines)


class _Contender:
    """A whole greedy generation per call; the split of each call kept by batch size."""

    def __call__(self, input_ids: Any) -> None:
        raise NotImplementedError

    def __init__(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        self.split: dict[int, list[tuple[float, float]]] = {}

    def record(self, batch: int, first_s: float, per_token_s: float) -> None:
        self.split.setdefault(batch, []).append((first_s, per_token_s))


class _Artifact(_Contender):
    def __init__(self, stepper: Any, new_tokens: int) -> None:
        super().__init__(new_tokens)
        self.stepper = stepper

    def __call__(self, input_ids: Any) -> None:
        from ptconvert.generation.runner import greedy

        done = greedy(self.stepper, input_ids, self.new_tokens)
        self.record(input_ids.shape[0], done.first_token_s, done.per_token_s)


class _Transformers(_Contender):
    """transformers' ``generate`` as the check calls it (``check.reference_generate``: greedy,
    exactly ``new_tokens``), ``extra`` its further keywords; timed through a streamer."""

    def __init__(self, model: Any, new_tokens: int, **extra: Any) -> None:
        super().__init__(new_tokens)
        self.model = model
        self.extra = extra

    def __call__(self, input_ids: Any) -> None:
        import torch
        from transformers.generation.streamers import BaseStreamer

        from ptconvert.generation.check import reference_generate

        stamps: list[float] = []

        class Stamps(BaseStreamer):
            def put(self, value: Any) -> None:
                stamps.append(time.perf_counter())

            def end(self) -> None:
                pass

        # token ids have a mask; a speech model's features none
        mask = (
            {} if input_ids.is_floating_point() else {"attention_mask": torch.ones_like(input_ids)}
        )
        began = time.perf_counter()
        reference_generate(
            self.model, input_ids, self.new_tokens, streamer=Stamps(), **mask, **self.extra
        )
        # the first put is the prompt (a seq2seq model's: the decoder's start token)
        if len(stamps) != self.new_tokens + 1:
            raise RuntimeError(
                f"generate streamed {len(stamps)} times for {self.new_tokens} new tokens"
            )
        first = stamps[1] - began
        per_token = (stamps[-1] - stamps[1]) / (self.new_tokens - 1)
        self.record(input_ids.shape[0], first, per_token)


def bench_generation(
    artifact: str, opts: Options, keywords: BenchKeywords, *, export: Export
) -> GenerationBenchReport:
    """Time ``artifact`` (a generation export) against transformers' ``generate`` on the
    keywords' ``reference`` directory's model, eager and ``torch.compile``d."""
    reference = None if keywords.reference is None else str(keywords.reference)
    batch_sizes, compile_mode = keywords.batch_sizes, keywords.compile_mode
    repeats, warmup, threads = keywords.repeats, keywords.warmup, keywords.threads
    device = keywords.device or opts.device
    prompt_length, new_tokens = keywords.prompt_length, keywords.new_tokens
    if reference is None:
        raise UsageError(
            f"bench of a generation export ({export.task}) times it against transformers' "
            "generate on the eager model: pass --reference SRC_DIR (the Hugging Face directory "
            "it was exported from)",
            path=artifact,
        )
    if device != "cpu":
        raise UsageError("bench of a generation export runs on the CPU only in this version")
    if repeats < 1 or warmup < 0:
        raise UsageError("bench needs --repeats 1 or more and --warmup 0 or more")
    prompt = PROMPT_LENGTH if prompt_length is None else prompt_length
    tokens = NEW_TOKENS if new_tokens is None else new_tokens
    if prompt < 1 or tokens < 2:
        raise UsageError(
            f"bench generates after a prompt of 1 token or more, 2 new tokens or more (the "
            f"per-token latency is that of the tokens after the first): got --prompt-length "
            f"{prompt}, --new-tokens {tokens}"
        )
    if batch_sizes is not None and (not batch_sizes or min(batch_sizes) < 1):
        raise UsageError(f"batch sizes are 1 or more, got {batch_sizes}")
    used = export.length
    needed = tokens if export.layout == "seq2seq" else prompt + tokens - 1
    if used is not None and needed > used:
        what = "new tokens" if export.layout == "seq2seq" else "prompt and new tokens"
        raise UsageError(
            f"{needed} positions ({what}) do not fit the artifact's static cache of {used}",
            path=artifact,
            hint="pass a shorter --prompt-length or fewer --new-tokens",
        )
    from ptconvert.generation.check import features, prompts
    from ptconvert.generation.loading import load_model
    from ptconvert.generation.seq2seq import feature_shape, is_speech
    from ptconvert.generation.targets import open_stepper
    from ptconvert.scan.guard import refuse_unsafe

    refuse_unsafe(artifact, reference)
    sizes, notes = _sizes(list(batch_sizes or BATCH_SIZES), export.batch)
    model = load_model(Path(reference), export.task, export.format, opts).model
    vocab = int(model.config.get_text_config().vocab_size)
    contenders: dict[str, _Contender] = {"eager": _Transformers(model, tokens)}
    skipped: dict[str, str] = {}
    if compile_mode == "none":
        skipped["torch.compile"] = "--compile-mode none"
    else:
        from transformers import CompileConfig

        config = CompileConfig(mode=compile_mode)
        _compat.hf.compile_on_every_device(config)  # transformers compiles on accelerators only
        contenders["torch.compile"] = _Transformers(
            model, tokens, cache_implementation="static", compile_config=config
        )
    contenders["artifact"] = _Artifact(open_stepper(artifact, opts.trust), tokens)

    def make(b: int) -> dict[str, Any]:
        if is_speech(model):  # Whisper: random features of its fixed shape (no prompt length)
            return {"input_ids": features(feature_shape(model), b, 1, opts.seed)}
        return {"input_ids": prompts(vocab, b, prompt, opts.seed)}

    timed = bench(
        artifact,
        dict(contenders),
        make,
        sizes,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        device="cpu",
        skipped=skipped,
    )
    report = GenerationBenchReport(
        **{f.name: getattr(timed, f.name) for f in fields(BenchReport) if f.name != "notes"},
        task=export.task,
        prompt_length=0 if is_speech(model) else prompt,
        new_tokens=tokens,
        notes=[*notes, *timed.notes],  # bench's own (timings too spread) after ours
    )
    for t in timed.timings:  # the rounds bench timed: the last of each contender's calls
        split = contenders[t.runtime].split.get(t.batch, [])[-t.samples :]
        first = _quantiles([s[0] * 1000 for s in split])
        per = _quantiles([s[1] * 1000 for s in split])
        report.tokens.append(TokenTiming(t.runtime, t.batch, *first, *per, len(split)))
    for b in sizes:
        medians = {t.runtime: t for t in report.tokens if t.batch == b}
        row: dict[str, Any] = {"batch": b}
        ours = medians.get("artifact")
        for other in ("eager", "torch.compile"):
            if ours is not None and other in medians:
                row[f"first_token_vs_{other}"] = round(
                    medians[other].first_token_ms / ours.first_token_ms, 3
                )
                row[f"per_token_vs_{other}"] = round(
                    medians[other].per_token_ms / ours.per_token_ms, 3
                )
        report.ratios.append(row)
    if export.batch is not None and min(sizes) < export.batch:
        report.notes.append(
            f"the artifact's static cache has {export.batch} rows: a smaller batch runs padded "
            "to it (copies of its last row)"
        )
    return report


def _sizes(asked: list[int], cap: int | None) -> tuple[list[int], list[str]]:
    """The batch sizes to time: those asked, each at most the static cache's rows (said)."""
    if cap is None:
        return sorted(set(asked)), []
    past = sorted(b for b in set(asked) if b > cap)
    sizes = sorted({min(b, cap) for b in asked})
    notes = [
        f"batch {', '.join(map(str, past))} is past the artifact's static cache of {cap} rows: "
        f"timed at {cap}, the largest it allows (export with --batch-sizes up to the batch to "
        "time)"
    ] if past else []  # fmt: skip
    return sizes, notes
