"""Weights conversion, read back with the reference loaders (safe_open, torch.load, HF)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ptconvert import convert as convert_weights
from ptconvert.errors import (
    OutputExistsError,
    TruncatedFileError,
    UnsupportedConversionError,
    UsageError,
)
from tests.conftest import run_cli


def _sft(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(_raw(a[k]), _raw(b[k])), k


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (bitwise comparison, NaN-safe)."""
    flat = t.contiguous().reshape(-1)
    return flat if t.dtype == torch.bool else flat.view(torch.uint8)


def test_pt_to_safetensors_fast_path(samples: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "mlp.safetensors"
    report = convert_weights(samples["mlp_zip"], "safetensors", out)
    assert (
        report.weights.path == "fast"
        and report.weights.verification
        and report.weights.verification.status == "pass"
    )
    tensors, metadata = _sft(out)
    _same(tensors, torch.load(samples["mlp_zip"], weights_only=True))
    assert metadata["format"] == "pt"


def test_training_checkpoint_is_unwrapped_and_prefix_stripped(samples, tmp_path, capsys) -> None:
    out = tmp_path / "w.safetensors"
    code, report, _ = run_cli(
        [str(samples["training_ckpt"]), "--to", "safetensors", "-o", str(out)], capsys
    )
    assert code == 0
    assert (
        report["weights"]["unwrapped"] == "model"
        and report["weights"]["stripped_prefix"] == "_orig_mod."
    )
    assert set(report["weights"]["other_contents"]) == {"optimizer", "epoch"}
    ckpt = torch.load(samples["training_ckpt"], weights_only=True)["model"]
    _same(_sft(out)[0], {k.removeprefix("_orig_mod."): v for k, v in ckpt.items()})


def test_keep_prefix_and_key(samples: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "w.safetensors"
    convert_weights(samples["training_ckpt"], "safetensors", out, key="model", keep_prefix=True)
    assert all(k.startswith("_orig_mod.") for k in _sft(out)[0])
    with pytest.raises(UnsupportedConversionError, match="--key 'nope'"):
        convert_weights(samples["training_ckpt"], "safetensors", tmp_path / "x", key="nope")


def test_ddp_prefix_is_stripped(tmp_path: Path) -> None:
    src = tmp_path / "ddp.pt"
    torch.save({"module.fc.weight": torch.ones(2, 2), "module.fc.bias": torch.zeros(2)}, src)
    report = convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    assert report.weights.stripped_prefix == "module."
    assert set(_sft(tmp_path / "o.safetensors")[0]) == {"fc.weight", "fc.bias"}


def test_tied_and_view_tensors_round_trip(tmp_path: Path) -> None:
    base = torch.arange(64, dtype=torch.float32)
    emb = torch.randn(10, 4)
    sd = {"emb.weight": emb, "head.weight": emb, "view": base[8:24].view(4, 4)}
    src = tmp_path / "tied.pt"
    torch.save(sd, src)
    report = convert_weights(src, "safetensors", tmp_path / "t.safetensors")
    assert report.weights.aliases == {"head.weight": "emb.weight"}
    tensors, metadata = _sft(tmp_path / "t.safetensors")
    assert set(tensors) == {"emb.weight", "view"}  # one copy of the tied pair
    assert json.loads(metadata["ptconvert.aliases"]) == {"head.weight": "emb.weight"}
    # the view is written as its own 64 bytes, not the whole 256-byte storage
    assert tensors["view"].numel() == 16 and os.path.getsize(tmp_path / "t.safetensors") < 500
    back = convert_weights(tmp_path / "t.safetensors", "pt", tmp_path / "back.pt")
    assert back.weights.verification and back.weights.verification.status == "pass"
    loaded = torch.load(tmp_path / "back.pt", weights_only=True)
    assert loaded["head.weight"].data_ptr() == loaded["emb.weight"].data_ptr()  # shared again
    _same({k: v for k, v in loaded.items()}, {k: v.contiguous() for k, v in sd.items()})


DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.complex64,
]


def test_every_safetensors_dtype_round_trips_exactly(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    sd = {}
    for dt in DTYPES:
        raw = torch.randint(
            0,
            255,
            (3, 5 * torch.empty(0, dtype=dt).element_size()),
            generator=gen,
            dtype=torch.uint8,
        )
        sd[str(dt)] = raw.view(dt) if dt != torch.bool else raw % 2 == 0
    src = tmp_path / "all.pt"
    torch.save(sd, src)
    convert_weights(src, "safetensors", tmp_path / "all.safetensors")
    tensors, _ = _sft(tmp_path / "all.safetensors")
    _same(tensors, sd)
    convert_weights(tmp_path / "all.safetensors", "pt", tmp_path / "all2.pt")
    _same(torch.load(tmp_path / "all2.pt", weights_only=True), sd)


def test_sharding_writes_the_transformers_layout(samples: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "shards"
    report = convert_weights(samples["mlp_zip"], "safetensors", out, max_shard_size="300B")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    loaded: dict[str, torch.Tensor] = {}
    for s in shards:
        loaded.update(load_file(out / s))
    _same(loaded, torch.load(samples["mlp_zip"], weights_only=True))
    assert (
        index["metadata"]["total_size"]
        == report.weights.bytes
        == sum(t.nbytes for t in loaded.values())
    )
    # and back from the sharded set to a single file
    convert_weights(
        out / "model.safetensors.index.json", "safetensors", tmp_path / "one.safetensors"
    )
    _same(_sft(tmp_path / "one.safetensors")[0], loaded)


def test_sharded_bin_set_converts(samples: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.safetensors"
    convert_weights(samples["block_sharded_bin"], "safetensors", out)
    expected: dict[str, torch.Tensor] = {}
    for shard in samples["block_sharded_bin"].parent.glob("*.bin"):
        expected.update(torch.load(shard, weights_only=True))
    _same(_sft(out)[0], expected)


def test_legacy_layout_is_byte_copied(samples: dict[str, Path], tmp_path: Path) -> None:
    """The legacy layout's storages follow its pickles: their bytes are copied as they are."""
    report = convert_weights(samples["mlp_legacy"], "safetensors", tmp_path / "l.safetensors")
    assert report.weights.path == "fast"
    assert (
        report.weights.verification
        and report.weights.verification.reader == "pickle records (stdlib pickle)"
    )
    _same(_sft(tmp_path / "l.safetensors")[0], torch.load(samples["mlp_legacy"], weights_only=True))


@pytest.mark.parametrize("name", ["hf_gpt2_bin", "hf_bert"])
def test_hf_directory_round_trip_computes_the_same(samples, name: str, tmp_path: Path) -> None:
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModelForCausalLM if name == "hf_gpt2_bin" else AutoModel
    target = "safetensors" if name == "hf_gpt2_bin" else "pt"
    out = tmp_path / "out"
    convert_weights(samples[name], target, out)
    assert (out / "config.json").exists()
    original, converted = cls.from_pretrained(samples[name]), cls.from_pretrained(out)
    ids = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = original(input_ids=ids), converted(input_ids=ids)
    key = "logits" if name == "hf_gpt2_bin" else "last_hidden_state"
    assert torch.equal(a[key], b[key])
    if name == "hf_gpt2_bin":
        assert converted.lm_head.weight.data_ptr() == converted.transformer.wte.weight.data_ptr()


def test_existing_output_needs_force(samples: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.safetensors"
    out.write_bytes(b"keep me")
    with pytest.raises(OutputExistsError):
        convert_weights(samples["mlp_zip"], "safetensors", out)
    assert out.read_bytes() == b"keep me"
    convert_weights(samples["mlp_zip"], "safetensors", out, force=True)
    assert len(_sft(out)[0]) == 4


def test_failed_run_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "short.pt"
    torch.save({"w": torch.arange(64, dtype=torch.float32)}, src)
    data = bytearray(src.read_bytes())
    # shrink the storage member's recorded size: the tensor now needs more than it holds
    import zipfile

    with zipfile.ZipFile(src) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    name = info.filename.encode()
    pos = data.find(b"PK\x01\x02", 0)
    while data[pos + 46 : pos + 46 + len(name)] != name:
        pos = data.find(b"PK\x01\x02", pos + 4)
    struct.pack_into("<II", data, pos + 20, 100, 100)
    src.write_bytes(bytes(data))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(TruncatedFileError, match="needs 256 bytes"):
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    assert sorted(os.listdir(tmp_path)) == before


def test_unsupported_tensor_is_named(tmp_path: Path) -> None:
    src = tmp_path / "q.pt"
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    torch.save({"ok": torch.ones(2), "q": q}, src)
    with pytest.raises(UnsupportedConversionError, match="'q' is a quantized tensor"):
        convert_weights(src, "safetensors", tmp_path / "o.safetensors")
    report = convert_weights(src, "safetensors", tmp_path / "o.safetensors", skip_unsupported=True)
    assert report.weights.tensors == 1


def test_verification_catches_a_corrupted_output(samples, tmp_path: Path, monkeypatch) -> None:
    from ptconvert.errors import VerificationError
    from ptconvert.formats import safetensors as weights_write

    real = weights_write.write_safetensors_file

    def corrupt(entries, aliases, metadata, out):  # flip one byte after a correct write
        real(entries, aliases, metadata, out)
        with open(out, "r+b") as fh:
            fh.seek(-1, 2)
            last = fh.read(1)
            fh.seek(-1, 2)
            fh.write(bytes([last[0] ^ 0xFF]))

    monkeypatch.setattr(weights_write, "write_safetensors_file", corrupt)
    with pytest.raises(VerificationError, match="bytes differ"):
        convert_weights(samples["mlp_zip"], "safetensors", tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists()


def test_a_safetensors_source_is_checked_bitwise_without_torch(tmp_path: Path) -> None:
    """safetensors → pt is checked against safe_open's names, dtypes and shapes and the bytes at
    the header's offsets, in a process that never imports torch or ml_dtypes (together they
    cost more than comparing a GiB); a changed byte of the output is still found."""
    import subprocess
    import sys

    src, out = tmp_path / "m.safetensors", tmp_path / "m.pt"
    gen = torch.Generator().manual_seed(0)
    save_file(
        {
            "w": torch.randn(64, 33, generator=gen),
            "h": torch.randn(5, 7, generator=gen).to(torch.bfloat16),
            "f8": torch.randn(9, generator=gen).to(torch.float8_e4m3fn),
        },
        src,
    )
    convert_weights(src, "pt", out)
    code = (
        "import sys; from pathlib import Path\n"
        "from ptconvert.weights.read import read_weights\n"
        "from ptconvert.verify.weights import verify_weights\n"
        "check = verify_weights(read_weights(Path(sys.argv[1])), Path(sys.argv[2]))\n"
        "heavy = sorted({'torch', 'ml_dtypes'} & set(sys.modules))\n"
        "print(check.status, check.tensors, check.reader, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True
    )
    assert done.stdout.split()[:2] == ["pass", "3"], done.stderr
    assert "safe_open" in done.stdout and done.stdout.rstrip().endswith("[]"), done.stdout

    data = bytearray(out.read_bytes())  # flip one byte of the bf16 tensor's stored bytes
    stored = torch.load(out)["h"].view(torch.uint8).numpy().tobytes()
    at = bytes(data).index(stored)
    data[at + 3] ^= 0xFF
    out.write_bytes(bytes(data))
    done = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True
    )
    assert "h: bytes differ" in done.stderr


def test_metadata_passes_through(samples: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.safetensors"
    code, _, _ = run_cli(
        [
            str(samples["mlp_zip"]),
            "--to",
            "safetensors",
            "-o",
            str(out),
            "--metadata",
            "license=mit",
        ],
        capsys,
    )
    assert code == 0 and _sft(out)[1] == {"format": "pt", "license": "mit"}
    save_file({"a": torch.ones(1)}, tmp_path / "src.safetensors", metadata={"origin": "x"})
    convert_weights(tmp_path / "src.safetensors", "safetensors", tmp_path / "copy.safetensors")
    assert _sft(tmp_path / "copy.safetensors")[1] == {"format": "pt", "origin": "x"}


def test_torch_zip_writer_is_a_valid_zip(samples: dict[str, Path], tmp_path: Path) -> None:
    import zipfile

    out = tmp_path / "w.pt"
    convert_weights(samples["cnn_safetensors"], "pt", out)
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None  # every CRC-32 is right
        offsets = [i.header_offset for i in z.infolist() if "/data/" in i.filename]
    assert offsets
    loaded = torch.load(out, weights_only=True, mmap=True)
    _same(loaded, load_file(samples["cnn_safetensors"]))


@pytest.mark.parametrize("zip64", [False, True])
def test_torch_zip_writer_keeps_large_tensors_where_the_source_has_them(
    tmp_path: Path, monkeypatch, zip64: bool
) -> None:
    """A tensor of ≥ 1 MiB copied from a file starts at its source offset modulo 64 KiB (the
    kernel copies whole page-cache folios then) and stays 64-byte aligned; torch reads every
    tensor back, mapped too, and every CRC holds. A source offset that is not 64-aligned keeps
    the 64-byte alignment instead."""
    import zipfile

    from ptconvert.formats import torch_zip

    if zip64:
        monkeypatch.setattr(torch_zip, "_ZIP64_LIMIT", 16)
    gen = torch.Generator().manual_seed(0)
    sd = {
        "a": torch.randn(300, 1024, generator=gen),  # 1.2 MB
        "b": torch.randn(513, 1024, generator=gen).half(),  # 1 MB + 2 KiB
        "small": torch.randn(7, generator=gen),  # the tensors after it lie 64-unaligned
        "c": torch.randn(5, 1024 * 64 + 3, generator=gen).bfloat16(),  # not a multiple of 64
        "d": torch.randn(256, 1024, generator=gen),
    }
    torch.save(sd, tmp_path / "m0.pt")
    src = tmp_path / "m.safetensors"  # ptconvert's: the data starts 64-aligned (spaces pad it)
    convert_weights(tmp_path / "m0.pt", "safetensors", src)
    assert (8 + int.from_bytes(src.read_bytes()[:8], "little")) % 64 == 0
    _same(_sft(src)[0], sd)
    out = tmp_path / "m.pt"
    report = convert_weights(src, "pt", out)
    assert report.weights.verification.status == "pass"
    source, written = src.read_bytes(), out.read_bytes()
    aligned = 0
    for name, t in sd.items():
        raw = _raw(t).numpy().tobytes()
        src_at, at = source.index(raw), written.index(raw)
        assert at % 64 == 0, name
        if t.nbytes >= 1 << 20 and src_at % 64 == 0:
            assert at % (64 << 10) == src_at % (64 << 10), name
            aligned += 1
    assert aligned == 2  # a and b (c is under 1 MiB; d lies 64-unaligned in the source)
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
    _same(torch.load(out, weights_only=True, mmap=True), sd)
    _same(torch.load(out, weights_only=True), sd)


@pytest.mark.parametrize("zip64", [False, True])
def test_the_padding_stays_within_the_extra_field(zip64: bool) -> None:
    """The padding that puts a tensor at its source offset fits the 16-bit extra field length
    to the byte; one that would not falls back to the 64-byte alignment."""
    from ptconvert.formats import torch_zip

    own = 20 if zip64 else 0  # the zip64 extra field the header carries
    name = b"x" * (34 - own)  # the padding then starts 68 bytes in (4 past a 64-byte boundary)
    size = 1 << 33 if zip64 else 1 << 21
    fixed = 30 + len(name) + own + 4
    assert fixed == 68
    # 65468 fits (≤ 0xFFFF - 4 - own); 65532 does not, and is < 64 KiB, so it is what the
    # source offset asks for, not a wrap-around
    for wide, fits in [(65468, True), (65532, False)]:
        like = (fixed + wide) % torch_zip.LIKE_SOURCE  # a 64-aligned source offset
        assert like % 64 == 0
        raw = torch_zip._local_header(name, size, 0, 0, like)
        extra_len = struct.unpack("<H", raw[28:30])[0]
        data_at = 30 + len(name) + extra_len
        assert data_at % 64 == 0
        if fits:
            assert extra_len == own + 4 + wide and data_at % torch_zip.LIKE_SOURCE == like
        else:
            assert extra_len == own + 4 + 60  # the plain 64-byte alignment


def test_torch_zip_writer_zip64_records(samples, tmp_path: Path, monkeypatch) -> None:
    """Checkpoints over 4 GiB need zip64 records: force them on a small file."""
    import zipfile

    from ptconvert.formats import torch_zip

    monkeypatch.setattr(torch_zip, "_ZIP64_LIMIT", 16)
    out = tmp_path / "w64.pt"
    report = convert_weights(samples["cnn_safetensors"], "pt", out)
    assert (
        report.weights.verification and report.weights.verification.status == "pass"
    )  # our reader agrees
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
    _same(torch.load(out, weights_only=True), load_file(samples["cnn_safetensors"]))


def test_inputs_are_never_modified(samples: dict[str, Path], tmp_path: Path) -> None:
    import hashlib

    def state(p: Path) -> list[tuple[str, str, int]]:
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        return [
            (str(f), hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
            for f in files
            if f.is_file()
        ]

    for name, to in (
        ("mlp_zip", "safetensors"),
        ("hf_gpt2_bin", "safetensors"),
        ("cnn_safetensors", "pt"),
    ):
        before = state(samples[name])
        convert_weights(samples[name], to, tmp_path / f"{name}-{to}")
        assert state(samples[name]) == before
    with pytest.raises(UsageError, match="overwrite the input"):
        convert_weights(samples["mlp_zip"], "pt", samples["mlp_zip"], force=True)


def test_outputs_get_the_usual_permissions(samples: dict[str, Path], tmp_path: Path) -> None:
    import stat

    out = tmp_path / "perm.safetensors"
    convert_weights(samples["mlp_zip"], "safetensors", out)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("kind", ["torchscript", "pt2"])
def test_program_weights_are_read_without_loading_the_program(kind, tmp_path, monkeypatch) -> None:
    """The weights come from the attributes pickle (TorchScript) or the payload config (pt2);
    the program's loader runs only as the independent check, after a clean scan."""
    from fixtures.build import MLP_INPUT
    from fixtures.models import MLP, SmallCNN, seeded

    if kind == "torchscript":
        src = tmp_path / "cnn_ts.pt"
        program = torch.jit.script(seeded(SmallCNN()).eval())
        program.save(str(src))
        expected, loader = program.state_dict(), (torch.jit, "load")
    else:
        src = tmp_path / "mlp.pt2"
        ep = torch.export.export(seeded(MLP()), MLP_INPUT)
        torch.export.save(ep, src)
        expected, loader = dict(ep.state_dict), (torch.export, "load")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the program was loaded to read its weights")

    with monkeypatch.context() as m:
        m.setattr(*loader, refuse)
        report = convert_weights(src, "safetensors", tmp_path / "a.safetensors", verify=False)
    assert report.source_format.startswith(kind)
    report = convert_weights(src, "safetensors", tmp_path / "b.safetensors")
    reader = f"{loader[0].__name__}.load("
    assert (
        report.weights.verification is not None
        and report.weights.verification.reader.startswith(reader)
    )
    for out in ("a.safetensors", "b.safetensors"):
        with safe_open(tmp_path / out, "pt") as f:
            assert sorted(f.keys()) == sorted(expected)
            assert all(torch.equal(f.get_tensor(k), expected[k]) for k in expected)


def _pt2_rewritten(tmp_path: Path, edit) -> tuple[Path, dict]:
    """A real .pt2 of the MLP with its members passed through ``edit(root, members)``."""
    import zipfile

    from fixtures.build import MLP_INPUT
    from fixtures.models import MLP, seeded

    ep = torch.export.export(seeded(MLP()), MLP_INPUT)
    base = tmp_path / "base.pt2"
    torch.export.save(ep, base)
    with zipfile.ZipFile(base) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    root = next(iter(members)).split("/", 1)[0]
    out = tmp_path / "edited.pt2"
    with zipfile.ZipFile(out, "w") as z:
        for name, data in edit(root, members).items():
            z.writestr(name, data)
    return out, dict(ep.state_dict)


def test_pt2_weights_follow_the_config_torch_reads(tmp_path: Path) -> None:
    """A second config beside the model's own is not what torch reads, nor what we read."""

    def add_decoy(root: str, members: dict) -> dict:
        real = json.loads(members[f"{root}/data/weights/model_weights_config.json"])
        first = next(iter(real["config"]))
        decoy = {"config": {"decoy": real["config"][first]}}
        return {f"{root}/data/weights/aaa_weights_config.json": json.dumps(decoy), **members}

    src, expected = _pt2_rewritten(tmp_path, add_decoy)
    convert_weights(src, "safetensors", tmp_path / "w.safetensors", verify=False)
    assert sorted(load_file(tmp_path / "w.safetensors")) == sorted(expected)


def test_older_pt2_layout_converts(tmp_path: Path) -> None:
    """Weights kept as one torch.save archive (data/weights/model.pt), which torch still reads."""
    import io

    def single_archive(root: str, members: dict) -> dict:
        state = torch.export.load(tmp_path / "base.pt2").state_dict
        buf = io.BytesIO()
        torch.save(dict(state), buf)
        kept = {n: b for n, b in members.items() if "/data/weights/" not in n}
        return {**kept, f"{root}/data/weights/model.pt": buf.getvalue()}

    src, expected = _pt2_rewritten(tmp_path, single_archive)
    report = convert_weights(src, "safetensors", tmp_path / "w.safetensors")
    assert report.weights.verification is not None and report.weights.verification.status == "pass"
    got = load_file(tmp_path / "w.safetensors")
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize(
    "change",
    [
        {"storage_offset": {"as_int": -5}},
        {"strides": [{"as_int": -1}]},
        {"dtype": "x"},
        {"sizes": [{"as_int": 2}, {"as_int": 2}, {"as_int": 2}]},
    ],
)
def test_a_hostile_pt2_config_is_a_named_error(tmp_path: Path, change: dict, capsys) -> None:
    def edit(root: str, members: dict) -> dict:
        name = f"{root}/data/weights/model_weights_config.json"
        config = json.loads(members[name])
        first = next(iter(config["config"].values()))
        first["tensor_meta"].update(change)
        return {**members, name: json.dumps(config)}

    src, _ = _pt2_rewritten(tmp_path, edit)
    code, out, _ = run_cli([str(src), "--to", "safetensors", "--no-verify"], capsys)
    assert code == 3 and "layout" in out["error"]["message"]
    assert not (tmp_path / "edited.safetensors").exists()


def test_training_checkpoint_takes_the_model_not_the_optimizer(tmp_path: Path, capsys) -> None:
    """Optimizer moments are not weights: the one other entry holding tensors is the model."""
    from fixtures.build import MLP_INPUT
    from fixtures.models import MLP, seeded

    model = seeded(MLP())
    opt = torch.optim.Adam(model.parameters())
    model(*MLP_INPUT).sum().backward()
    opt.step()
    sd = model.state_dict()
    src = tmp_path / "train.ckpt"
    torch.save({"model_state": sd, "optimizer_state": opt.state_dict(), "epoch": 3}, src)
    report = convert_weights(src, "safetensors", tmp_path / "w.safetensors")
    assert (
        report.weights.unwrapped == "model_state"
        and "optimizer_state" in report.weights.other_contents
    )
    assert sorted(load_file(tmp_path / "w.safetensors")) == sorted(sd)
    two = tmp_path / "two.ckpt"
    torch.save({"a": sd, "b": sd, "optimizer": opt.state_dict()}, two)
    code, out, _ = run_cli([str(two), "--to", "safetensors"], capsys)
    assert code == 4 and "['a', 'b']" in out["error"]["message"] and "--key" in out["error"]["hint"]


def test_weights_routes_refuse_before_making_anything(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a weights conversion refuses (a size that is no size, a file the scan refuses, a
    source without tensors even with --model) is refused without leaving a folder or a file;
    --device is a program's option, not a weights copy's."""
    out = tmp_path / "new" / "sub" / "o.safetensors"
    src = samples["mlp_zip"]
    code, report, _ = run_cli(
        [str(src), "--to", "safetensors", "--max-shard-size", "5XB", "-o", str(out)], capsys
    )
    assert (code, report["error"]["kind"]) == (2, "usage")
    assert not (tmp_path / "new").exists()
    code, report, _ = run_cli(
        [str(samples["cnn_module"]), "--to", "safetensors", "-o", str(out)], capsys
    )
    assert code == 11, report
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    args = [str(empty), "--to", "safetensors", "-o", str(out), "--model", "fixtures.models:MLP"]
    code, report, _ = run_cli(args, capsys)
    assert (code, report["error"]["kind"], report["error"]["path"]) == (3, "no_weights", str(empty))
    assert not (tmp_path / "new").exists()
    code, report, _ = run_cli(
        [str(src), "--to", "safetensors", "-o", str(out), "--device", "cuda"], capsys
    )
    assert code == 0 and report["check"] == "bitwise", report


def test_a_model_from_code_written_as_weights_reports_a_program_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights a factory's model gives have no file to be read from again: the report is the
    program route's (no 'weights' section claiming a skipped check), and says no check ran."""
    out = tmp_path / "mlp.safetensors"
    code, report, _ = run_cli(
        ["--model", "fixtures.models:MLP", "--to", "safetensors", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert report["weights"] is None and report["check"] == "none"
    assert any("no check ran" in n for n in report["notes"])
    assert set(load_file(str(out))) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
