"""The scanner on a corpus of malicious techniques and real benign checkpoints.

Every malicious file must be flagged (dangerous, or refused as unreadable), every benign one must
get its expected verdict, and no command may ever run a payload (the marker never appears).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.scan_corpus import benign_corpus, malicious_corpus, raw_techniques
from ptconvert.cli import main
from ptconvert.scan.scanner import scan, scan_file
from tests.conftest import run_cli

CONTAINERS = [
    "zip_checkpoint.pt",
    "zip_member_txt.pt",
    "zip_unreferenced_storage.pt",
    "zip_flag_bits.pt",
    "zip_name_mismatch.pt",
    "zip_bad_crc.pt",
    "zip_duplicate_names.pt",
    "zip_prefixed_data.pt",
    "zip_deflated.pt",
    "zip_nested.zip",
    "legacy_payload.pt",
    "legacy_magic_by_eval.pt",
    "legacy_tar_payload.pt",
    "tar_gz.tar.gz",
    "gzip_pickle.pkl.gz",
    "sevenzip.7z",
    "numpy_object.npy",
    "numpy_object.npz",
    "pt2_sample_inputs.pt2",
    "pt2_constant_pickle.pt2",
    "pt2_config_decoy.pt2",
    "pt2_datapkl_decoy.pt2",
    "tar_pickle_hardlink.pt",
    "tar_pickle_symlink.pt",
    "zip64_locator_decoy.pt",
    "torchscript_constants.pt",
    "hf_directory",
    "sharded_set",
    # issue #10: layouts and containers that hid a payload
    "legacy_with_zip_appended.pt",
    "legacy_proto0_object.pt",
    "legacy_payload_in_storage_keys.pt",
    "legacy_magic_late.pt",
    "tar_pickle_proto0.pt",
    "tar_storage_views.pt",
    "tar_v7.pt",
    "joblib_zlib.pkl",
    "joblib_bz2.pkl",
    "joblib_xz.pkl",
    "joblib_lzma.pkl",
    "joblib_zfile.pkl",
    "zip_data_PKL_case.pt",
    "zip_case_duplicate.pt",
    "numpy_object_lowercase.npy",
    "numpy_object_structured.npy",
    "numpy_object_lowercase.npz",
    "torchscript_setstate_code.pt",
    "torchscript_ops_from_file.pt",
    # issue #10: hostile formats, refused whether or not they carry a payload
    "onnx_external_dotdot.onnx",
    "onnx_external_abs.onnx",
    "onnx_external_symlink.onnx",
    "zip_dotdot_member.zip",
    "zip_deep_nesting.zip",
    "gzip_bomb.gz",
    # the --trust issue: callables of user code kept where torch's rebuild code calls them
    *(
        f"trust_{gadget}{where}.pt"
        for gadget in ("as_subclass", "setstate", "enum_missing")
        for where in ("", "_sequential", "_legacy", "_tar")
    ),
    # found attacking the fixed scanner: persistent ids, a state built by a call, joblib bytes
    "trust_persid_tuple_tar.pt",
    "trust_persid_module_legacy.pt",
    "trust_namespace_odict_setstate.pkl",
    "joblib_array_polyglot.pkl",
    "joblib_object_array.pkl",
    "joblib_object_array_outer_memo.pkl",
    # the held-out red team: bytes read otherwise than the loader reads them
    "sstring_nonascii_nested.pt",
    "sstring_legacy_nested.pt",
    "sstring_legacy_second.pt",
    "tar_name_pickle_nested.pt",
    "tar_base256_checksum.pt",
    "tar_nul_first_name.pt",
    "safetensors_polyglot.bin",
    "safetensors_polyglot_hf",
    "source_polyglot.py",
    "additems_add_class.pkl",
    "append_attribute_class.pkl",
    # issue 38: constructors that evaluate text; a package's __main__ module
    "ctor_sympy_sequential.pt",
    "ctor_sympy_state_dict.pt",
    "ctor_sympy_legacy.pt",
    "ctor_sympy_hparams.ckpt",
    "ctor_sympy_metadata.pt",
    "ctor_sympy_trace_reduce.pt",
    "ctor_sympy_lambda.pt",
    "main_module_class.pkl",
]
TECHNIQUES = [f"{n}.pkl" for n in raw_techniques(Path("/m"))] + CONTAINERS
# Refused as unreadable ("error"), never passed as clean: containers the scanner cannot open
# (7z), or will not open completely by design (nesting past its depth limit, a decompression
# bomb). Everything else is "dangerous": every pickle that carries a payload, and ONNX external
# data that points outside the model's directory (loading reads a file of the host's choosing:
# an attack, not a corrupt file).
REFUSED = {
    "sevenzip.7z": "error",
    "zip_deep_nesting.zip": "error",
    "gzip_bomb.gz": "error",
    # readers disagree on which central directory is the archive's, or on whether the file is a
    # zip at all (torch: a pickle from byte 0): refused as unreadable
    "zip64_locator_decoy.pt": "error",
    "zip_prefixed_data.pt": "error",
}
# files under the malicious corpus's root that are not themselves malicious
BENIGN_MEMBERS = {
    "hf_dir/config.json",
    "sharded/pytorch_model.bin.index.json",
    "sharded/pytorch_model-00001-of-00002.bin",
    "safetensors_polyglot_hf/config.json",
}
OUTSIDE_DATA = {"secret.bin", "onnx_external_symlink/weights.bin"}  # what the ONNX files point at


@pytest.fixture(scope="session")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "PAYLOAD_RAN"


@pytest.fixture(scope="session")
def malicious(tmp_path_factory: pytest.TempPathFactory, marker: Path) -> dict[str, Path]:
    return malicious_corpus(tmp_path_factory.mktemp("malicious"), marker)


@pytest.fixture(scope="session")
def benign(tmp_path_factory, samples: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    return benign_corpus(tmp_path_factory.mktemp("benign"), samples)


def test_corpus_sizes(malicious: dict[str, Path], benign: dict) -> None:
    assert len(malicious) >= 40 and set(malicious) == set(TECHNIQUES)
    assert len(benign) >= 30


@pytest.mark.parametrize("name", TECHNIQUES)
def test_every_malicious_file_is_flagged(malicious: dict[str, Path], name: str, marker) -> None:
    report = scan([malicious[name]])
    assert report.verdict == REFUSED.get(name, "dangerous"), [
        (f.global_name, f.reason) for r in report.files for f in r.findings
    ]
    assert not marker.exists()


def test_every_benign_file_gets_its_verdict(benign: dict[str, tuple[Path, str]]) -> None:
    wrong = {}
    for name, (path, expected) in benign.items():
        report = scan([path])
        if report.verdict != expected:
            wrong[name] = [(f.global_name, f.reason) for r in report.files for f in r.findings]
    assert wrong == {}


def test_findings_say_what_where_and_why(malicious: dict[str, Path]) -> None:
    r = scan_file(malicious["zip_checkpoint.pt"])
    (f,) = [f for f in r.findings if f.global_name == "posix.system"]
    assert f.severity == "dangerous" and f.opcode == "GLOBAL"
    assert f.member.endswith("zip_checkpoint.pt:archive/data.pkl") and f.offset > 0
    assert "shell" in f.reason


def test_stack_global_through_memo_is_resolved(malicious: dict[str, Path]) -> None:
    r = scan_file(malicious["stack_global_memo.pkl"])
    assert any(f.global_name == "os.system" and f.opcode == "STACK_GLOBAL" for f in r.findings)


def test_scan_cli_exit_codes(malicious, benign, samples, capsys) -> None:
    code, out, _ = run_cli(["scan", str(malicious["os_system_p2.pkl"])], capsys)
    assert code == 10 and out["verdict"] == "dangerous"
    code, out, _ = run_cli(
        ["scan", str(samples["mlp_zip"]), str(samples["cnn_safetensors"])], capsys
    )
    assert code == 0 and out["counts"]["clean"] == 2
    code, out, _ = run_cli(["scan", str(samples["cnn_module"])], capsys)
    assert code == 11 and out["verdict"] == "needs-code"
    code, out, _ = run_cli(["scan", str(malicious["sevenzip.7z"])], capsys)
    assert code == 3 and out["verdict"] == "error"


def test_allow_extends_the_allowlist(samples: dict[str, Path], capsys) -> None:
    classes = [
        "fixtures.models.SmallCNN",
        "torch.nn.modules.conv.Conv2d",
        "torch.nn.modules.batchnorm.BatchNorm2d",
        "torch.nn.modules.linear.Linear",
    ]
    args = ["scan", str(samples["cnn_module"])] + [a for c in classes for a in ("--allow", c)]
    code, out, _ = run_cli(args, capsys)
    assert code == 0 and out["verdict"] == "clean"


def test_directory_scan_with_processes(malicious: dict[str, Path], capsys) -> None:
    root = malicious["zip_checkpoint.pt"].parent
    one = scan([root])
    two = scan([root], jobs=2)
    assert [(f.path, f.verdict) for f in one.files] == [(f.path, f.verdict) for f in two.files]
    assert one.skipped == two.skipped
    clean = [f.path for f in one.files if f.verdict == "clean"]
    unflagged = {str(Path(p).relative_to(root)) for p in [*clean, *one.skipped]}
    # every malicious file but the directories' benign members (config and index: no model
    # files, skipped; the first shard) and the bytes the ONNX samples point at (flagging those
    # too is fine)
    assert unflagged - OUTSIDE_DATA == BENIGN_MEMBERS


def test_no_command_runs_a_payload(malicious: dict[str, Path], tmp_path: Path, marker) -> None:
    for name, path in malicious.items():
        main(["info", str(path), "--json"])
        main([str(path), "--to", "safetensors", "-o", str(tmp_path / f"{name}.st"), "--json"])
        main([str(path), "--to", "pt", "-o", str(tmp_path / f"{name}.pt"), "--json"])
        main(["scan", str(path), "--json"])
        assert not marker.exists(), name
    assert not list(tmp_path.iterdir())  # nothing was converted


def test_conversion_refuses_dangerous_and_needs_code(malicious, samples, tmp_path, capsys) -> None:
    code, out, _ = run_cli([str(malicious["zip_checkpoint.pt"]), "--to", "safetensors"], capsys)
    assert code == 10 and "posix.system" in out["error"]["message"]
    code, out, _ = run_cli(
        [str(samples["cnn_module"]), "--to", "safetensors", "-o", str(tmp_path / "x")], capsys
    )
    assert code == 11 and "fixtures.models.SmallCNN" in out["error"]["message"]


def test_a_shard_index_is_refused_for_the_shards_it_names(malicious, tmp_path, capsys) -> None:
    index = malicious["sharded_set"] / "pytorch_model.bin.index.json"
    program = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32", "--no-verify"]
    for to, extra in (("pt2", program), ("safetensors", [])):
        code, out, _ = run_cli([str(index), "--to", to, "-o", str(tmp_path / to), *extra], capsys)
        assert code == 10, (to, out)
        assert "pytorch_model-00002-of-00002.bin" in out["error"]["path"]
    code, out, _ = run_cli(["scan", str(index)], capsys)
    assert code == 10 and len(out["files"]) == 3  # the index and both shards
    assert not list(tmp_path.iterdir())


def test_ambiguous_zip_is_refused(tmp_path: Path) -> None:
    import pickle
    import zipfile

    p = tmp_path / "dup.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({}, 2))
        with pytest.warns(UserWarning):
            z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, 2))
    r = scan_file(p)
    assert r.verdict == "error" and "appears more than once" in r.findings[0].reason
