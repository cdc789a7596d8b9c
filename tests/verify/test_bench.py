"""`ptconvert bench` and `--bench`: the report's fields, and ratios from the measured medians."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]


def _check_ratios(report: dict) -> None:
    for row in report["speedups"]:
        medians = {
            t["runtime"]: t["median_ms"] for t in report["timings"] if t["batch"] == row["batch"]
        }
        for other in ("eager", "torch.compile"):
            if other in medians:
                assert row[f"artifact_vs_{other}"] == round(medians[other] / medians["artifact"], 3)


def test_bench_without_compile(samples: dict[str, Path], capsys) -> None:
    args = ["bench", str(samples["mlp_pt2"]), "--reference", str(samples["mlp_zip"]), *MLP_ARGS]
    code, report, _ = run_cli(
        [*args, "--compile-mode", "none", "--batch-sizes", "1,4", "--repeats", "5"], capsys
    )
    assert code == 0
    assert {(t["runtime"], t["batch"]) for t in report["timings"]} == {
        (r, b) for r in ("eager", "artifact") for b in (1, 4)
    }
    for t in report["timings"]:
        assert t["samples"] == 5 and t["p25_ms"] <= t["median_ms"] <= t["p75_ms"]
    assert report["skipped"]["torch.compile"] == "--compile-mode none"
    assert report["threads"] >= 1 and report["peak_rss_mib"] > 0
    _check_ratios(report)


def test_bench_of_a_program_alone_has_no_eager_row(samples: dict[str, Path], capsys) -> None:
    """Without --reference there is no eager model: the program is not compared with itself."""
    args = ["bench", str(samples["mlp_scripted"]), "--input", "x:2x8:float32"]
    code, report, _ = run_cli([*args, "--compile-mode", "none", "--repeats", "3"], capsys)
    assert code == 0
    assert {t["runtime"] for t in report["timings"]} == {"artifact"}
    assert "--reference" in report["skipped"]["eager"]
    assert report["speedups"] == [] or all(
        "artifact_vs_eager" not in row for row in report["speedups"]
    )


@pytest.mark.slow
def test_convert_with_bench_times_eager_compile_and_pt2(tmp_path: Path, capsys) -> None:
    import torch

    from fixtures.models import MLP, seeded

    src = tmp_path / "model.bin"
    torch.save(seeded(MLP()).state_dict(), src)
    args = [
        str(src),
        "--to",
        "pt2",
        "--dynamic-batch",
        "--bench",
        "-o",
        str(tmp_path / "m.pt2"),
        *MLP_ARGS,
    ]
    code, report, _ = run_cli(args, capsys)
    assert code == 0
    assert report["parity"]["status"] == "pass" and len(report["parity"]["sizes"]) == 5
    bench = report["bench"]
    assert {t["runtime"] for t in bench["timings"]} == {"eager", "torch.compile", "artifact"}
    compiled = next(t for t in bench["timings"] if t["runtime"] == "torch.compile")
    assert (
        compiled["first_call_s"] > compiled["median_ms"] / 1000
    )  # the compile is in the first call
    _check_ratios(bench)


def test_bench_plot(samples: dict[str, Path], tmp_path: Path, capsys) -> None:
    png = tmp_path / "latency.png"
    args = ["bench", str(samples["mlp_pt2"]), "--reference", str(samples["mlp_zip"]), *MLP_ARGS]
    code, _, _ = run_cli(
        [*args, "--compile-mode", "none", "--repeats", "3", "--plot", str(png)], capsys
    )
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_on_cuda_without_a_gpu_says_so(samples: dict[str, Path], capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args = ["bench", str(samples["mlp_pt2"]), "--reference", str(samples["mlp_zip"]), *MLP_ARGS]
    code, report, _ = run_cli([*args, "--device", "cuda"], capsys)
    assert code == 5 and "CUDA is not available" in report["error"]["message"]


def test_a_spread_timing_is_said_as_noise_and_a_steady_one_is_not() -> None:
    """p25–p75 beyond ±20 % of the median is said to be noise, not read as a number."""
    import itertools
    import time

    from ptconvert.verify.bench import bench

    delays = itertools.cycle([0.001, 0.008])  # every other call 8× longer: a busy machine

    def jumpy(**_: object) -> None:
        time.sleep(next(delays))

    def steady(**_: object) -> None:  # long enough that a loaded machine's jitter stays < 20 %
        time.sleep(0.03)

    report = bench("x", {"jumpy": jumpy, "steady": steady}, lambda b: {}, [1], repeats=12)
    assert any(n.startswith("jumpy at batch 1: p25–p75") for n in report.notes), report.notes
    assert not any(n.startswith("steady") for n in report.notes), report.notes


@pytest.mark.parametrize(
    ("eager", "artifact", "said"),
    [
        # issue 44: eager's median 173 ms, middle half 68–206 ms, headlined "237.48×"
        ((173.0, 68.0, 206.0), (0.73, 0.70, 0.75), "eager 236.99× faster (90.67–294.29×)"),
        ((10.0, 7.0, 13.0), (9.5, 8.0, 11.0), "eager 1.05×, within noise (0.64–1.62×)"),
        ((10.0, 9.8, 10.2), (20.0, 19.5, 20.5), "eager 0.50× slower (0.48–0.52×)"),
    ],
)
def test_a_speedup_is_headlined_only_when_its_spread_keeps_it_from_1(
    eager: tuple[float, float, float], artifact: tuple[float, float, float], said: str
) -> None:
    import io

    from rich.console import Console

    from ptconvert.render import render_bench
    from ptconvert.verify.bench import BenchReport, Timing, _speedups

    timings = [
        Timing(name, 1, 0.1, med, p25, p75, 30)
        for name, (med, p25, p75) in (("eager", eager), ("artifact", artifact))
    ]
    report = BenchReport("x", 2, "cpu", 30, timings=timings, speedups=[_speedups(1, timings)])
    console = Console(width=200, record=True, color_system=None, file=io.StringIO())
    render_bench(report, console)
    assert f"batch 1: artifact vs {said}" in console.export_text()


def test_the_isolated_onnx_runtime_never_spins_its_threads() -> None:
    """onnxruntime's threads spin between calls by default: beside eager timed in the parent,
    they took its cores, and eager came out far slower in --to all than in bench."""
    from ptconvert.formats.onnx.runtime import session_options

    options = session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
