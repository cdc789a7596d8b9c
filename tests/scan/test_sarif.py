"""``scan --format sarif``: a SARIF 2.1.0 log for CI code scanning (issue 44).

The SARIF schema cannot be downloaded here, so the structure the 2.1.0 schema requires (and
what GitHub's upload-sarif reads) is asserted by hand; the output was validated against the
OASIS schema (sarif-schema-2.1.0.json) with jsonschema once, outside the test suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptconvert.cli import main
from ptconvert.scan.sarif import RULES

PAYLOAD = b"\x80\x02cposix\nsystem\n(Vtouch x\ntR."


def _sarif(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["scan", *argv, "--format", "sarif"])
    return code, json.loads(capsys.readouterr().out)


def test_sarif_names_each_finding_kind_as_a_rule_and_locates_results(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    root = tmp_path / "repo"
    (root / "models").mkdir(parents=True)
    (root / "models" / "evil file.txt").write_bytes(PAYLOAD)
    torch.save(torch.nn.Linear(2, 2), root / "models" / "whole.pt")
    (root / "models" / "README.md").write_text("# notes\n")
    monkeypatch.chdir(root)
    code, log = _sarif(["models"], capsys)
    assert code == 10
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "ptconvert" and driver["version"]
    ids = [r["id"] for r in driver["rules"]]
    assert ids == list(RULES) and len(set(ids)) == len(ids)
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root.as_uri() + "/"
    levels = {}
    for result in run["results"]:
        assert result["ruleId"] == ids[result["ruleIndex"]]
        assert result["message"]["text"]
        (loc,) = result["locations"]
        where = loc["physicalLocation"]["artifactLocation"]
        assert where["uriBaseId"] == "%SRCROOT%"
        levels.setdefault(where["uri"], set()).add((result["ruleId"], result["level"]))
    # relative to the checkout, percent-encoded; the README is no model file: no result
    assert levels == {
        "models/evil%20file.txt": {("dangerous", "error")},
        "models/whole.pt": {("needs-code", "warning")},
    }


def test_a_clean_folder_is_an_empty_sarif_log(tmp_path: Path, capsys) -> None:
    (tmp_path / "train.log").write_text("step 1\n")
    code, log = _sarif([str(tmp_path)], capsys)
    assert code == 0 and log["runs"][0]["results"] == []
    assert log["runs"][0]["properties"] == {"verdict": "clean", "skipped": 1}


@pytest.mark.parametrize("quiet", ["-q", "--quiet"])
def test_quiet_keeps_the_sarif_document(tmp_path: Path, capsys, quiet: str) -> None:
    """``-q`` silences the human report; a SARIF document on stdout is the output itself (it
    printed nothing, as only ``--json`` was taken for machine output)."""
    (tmp_path / "x.pkl").write_bytes(PAYLOAD)
    code = main(["scan", str(tmp_path), quiet, "--format=sarif"])
    log = json.loads(capsys.readouterr().out)
    assert code == 10 and log["runs"][0]["results"]
