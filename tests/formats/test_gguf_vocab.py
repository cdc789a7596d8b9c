"""--to gguf of a sentencepiece-style BPE (byte fallback: Llama 2's, TinyLlama's, Mistral 7B's
tokenizer.json) as llama.cpp's ``llama`` tokenizer model: tokens with merge-rank scores, the
byte tokens typed BYTE, the space prefix, no merges; transformers' GGUF tokenizer encodes as
the source's; a normalizer llama.cpp's tokenizer does not apply is refused. llama.cpp's own
tokenizer runs it in tests/clients/test_llama_cpp.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.formats.gguf_target_models import SP_MERGED, SP_SIZE, SP_VOCAB, build_decoder

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

TEXTS = ["hello there in the hell", "the shawl and a wand réé", "a\nnew line", "w"]


@pytest.fixture(scope="module")
def llama2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_decoder("llama", tmp_path_factory.mktemp("sp") / "tiny-llama", sentencepiece=True)


def field(reader: Any, name: str) -> Any:
    found = reader.get_field(name)
    return None if found is None else found.contents()


def test_a_sentencepiece_bpe_is_written_as_llama_cpps_llama_tokenizer(
    llama2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sp.gguf"
    code, report, _ = run_cli([str(llama2), "--to", "gguf", "-o", str(out), "--json"], capsys)
    assert code == 0, report
    reader = gguf.GGUFReader(out)
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert field(reader, "tokenizer.ggml.add_space_prefix") is True
    assert field(reader, "tokenizer.ggml.merges") is None  # llama.cpp's llama model scores
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    scores = field(reader, "tokenizer.ggml.scores")
    assert len(tokens) == len(types) == len(scores) == SP_VOCAB
    assert tokens[3] == "<0x00>" and types[3] == gguf.TokenType.BYTE and types[258] == 6
    assert [types[i] for i in (0, 1, 2)] == [gguf.TokenType.UNKNOWN, *[gguf.TokenType.CONTROL] * 2]
    assert types[SP_SIZE:] == [gguf.TokenType.UNUSED] * (SP_VOCAB - SP_SIZE)
    # a merged piece scores above the pieces merged after it; pieces no merge makes score 0
    merged = [scores[tokens.index(p)] for p in SP_MERGED]
    assert merged == sorted(merged, reverse=True) and max(merged) < 0
    assert scores[tokens.index("h")] == 0.0
    assert field(reader, "tokenizer.ggml.bos_token_id") == 1
    assert field(reader, "tokenizer.ggml.eos_token_id") == 2
    assert any("sentencepiece-style BPE as llama.cpp's llama model" in n for n in report["notes"])


def test_transformers_tokenizer_of_the_gguf_encodes_as_the_source(
    llama2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    out = tmp_path / "sp.gguf"
    code, report, _ = run_cli([str(llama2), "--to", "gguf", "-o", str(out)], capsys)
    assert code == 0, report
    source = AutoTokenizer.from_pretrained(llama2)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    for text in TEXTS:
        assert theirs(text)["input_ids"] == source(text)["input_ids"], text
    assert source(TEXTS[1])["input_ids"][-2:] == [198, 172]  # é as its two byte tokens


def test_a_normalizer_llama_cpp_does_not_apply_is_refused(
    llama2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    src = tmp_path / "nfkc"
    shutil.copytree(llama2, src)
    data = json.loads((src / "tokenizer.json").read_text())
    data["normalizer"]["normalizers"].insert(0, {"type": "NFKC"})
    (src / "tokenizer.json").write_text(json.dumps(data))
    out = tmp_path / "refused.gguf"
    code, report, _ = run_cli([str(src), "--to", "gguf", "-o", str(out)], capsys)
    assert code == 4 and not out.exists(), report
    assert "not Llama's normalizer" in report["error"]["message"]


LLAMA_NORMALIZER = {
    "type": "Sequence",
    "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    ],
}


METASPACE = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}


def test_llamas_normalizer_is_the_space_prefix_and_a_metaspace_is_refused() -> None:
    """A Metaspace (transformers 5 saves Llama 2's tokenizer with one) skips the space before
    text that starts with one, and after special tokens ("first"), where llama.cpp does not:
    measured, " hello" is [▁hell, o] to it and [▁, ▁hell, o] to llama.cpp."""
    from ptconvert.errors import UnsupportedConversionError
    from ptconvert.formats.gguf.tokenizer import _space_prefix

    where = Path("tokenizer.json")
    assert _space_prefix({"normalizer": LLAMA_NORMALIZER, "pre_tokenizer": None}, where)
    for pre in (METASPACE, {**METASPACE, "prepend_scheme": "always"}):
        with pytest.raises(UnsupportedConversionError, match="splits text by Metaspace"):
            _space_prefix({"normalizer": None, "pre_tokenizer": pre}, where)


def sp_model(**changes: Any) -> dict[str, Any]:
    """A BPE model whose scores order its merges: ▁h, he, ll, hell (every split a merge)."""
    vocab = {p: i for i, p in enumerate(["▁", "h", "e", "l", "▁h", "he", "ll", "hell"])}
    merges = ["▁ h", "h e", "l l", "he ll"]
    return {"type": "BPE", "byte_fallback": True, "vocab": vocab, "merges": merges, **changes}


TRAINED = ["▁ h", "h e", "he l", "l l", "he ll"]  # hel made first, hell only from he + ll


@pytest.mark.parametrize(
    ("model", "said"),
    [
        # a trained BPE's piece whose other split (hel + l) is no merge of this file
        (sp_model(vocab={**sp_model()["vocab"], "hel": 8}, merges=TRAINED),
         "'hell': its split hel + l is no merge"),
        (sp_model(vocab={**sp_model()["vocab"], "▁hello": 8}), "'▁hello': no merge makes it"),
        (sp_model(ignore_merges=True), "ignore_merges"),
        (sp_model(dropout=0.1), "dropout"),
    ],
)  # fmt: skip
def test_merges_no_score_order_reproduces_are_refused(model: dict[str, Any], said: str) -> None:
    from ptconvert.errors import UnsupportedConversionError
    from ptconvert.formats.gguf.tokenizer import _refuse_unscorable

    _refuse_unscorable(sp_model(), set(), Path("tokenizer.json"))  # the consistent one passes
    with pytest.raises(UnsupportedConversionError, match=re.escape(said)):
        _refuse_unscorable(model, set(), Path("tokenizer.json"))


def test_an_added_token_over_a_pieces_id_is_refused(
    llama2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    src = tmp_path / "clash"
    shutil.copytree(llama2, src)
    data = json.loads((src / "tokenizer.json").read_text())
    he = data["model"]["vocab"]["he"]
    data["added_tokens"].append({"id": he, "content": "<pad>", "special": True})
    (src / "tokenizer.json").write_text(json.dumps(data))
    out = tmp_path / "refused.gguf"
    code, report, _ = run_cli([str(src), "--to", "gguf", "-o", str(out)], capsys)
    assert code == 4 and not out.exists(), report
    assert "takes id" in report["error"]["message"]
