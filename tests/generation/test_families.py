"""The other decoder-only families of issue #26 (GPT-NeoX, Mistral, Phi-3, Gemma, OPT, Bloom,
Falcon) with their cache: each tiny directory (random init from its config, as conftest builds
GPT-2, Llama and Qwen2) converted to pt2 with a static cache and to ONNX with past (the
conversion checks itself by generating), then generated with by the tests' own loops over
``torch.export.load`` and onnxruntime, token for token and logit for logit against
transformers' ``generate`` at batch 1 and 2.

OPT to pt2 is not here: its decoder takes its positions from the cache's length
(``past_seen_tokens = cache.get_seq_length()``), a tensor in a static cache, and slicing by it
is data-dependent (torch.export fails on ``aten.item``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ptconvert
from tests.generation import test_onnx_past, test_pt2_static_cache

TASK = "text-generation-with-past"
pytestmark = pytest.mark.slow  # the default tests cover the same exports on GPT-2 and Llama

CHECKS = {
    "pt2": test_pt2_static_cache.assert_generates_as_transformers,
    "onnx": test_onnx_past.assert_generates_as_transformers,
}
CASES = [
    (family, fmt)
    for family in ("gpt_neox", "mistral", "phi3", "gemma", "opt", "bloom", "falcon")
    for fmt in ("pt2", "onnx")
    if (family, fmt) != ("opt", "pt2")
]


def config_and_class(family: str) -> tuple[Any, Any]:
    """Hidden 32, 2 layers, 4 heads, vocab 99; initializer_range 0.3 (OPT's init_std) so that
    greedy decoding picks several tokens."""
    import transformers as t

    common: dict[str, Any] = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "initializer_range": 0.3,
    }
    gqa = {**common, "intermediate_size": 37, "num_key_value_heads": 2}
    if family == "gpt_neox":
        return (
            t.GPTNeoXConfig(**common, intermediate_size=37, max_position_embeddings=64),
            t.GPTNeoXForCausalLM,
        )
    if family == "mistral":
        return t.MistralConfig(**gqa, max_position_embeddings=64), t.MistralForCausalLM
    if family == "phi3":  # its default pad/eos ids (32000) are past the tiny vocabulary
        config = t.Phi3Config(
            **gqa,
            max_position_embeddings=64,
            original_max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        return config, t.Phi3ForCausalLM
    if family == "gemma":  # head_dim is its own setting (default 256)
        config = t.GemmaConfig(**gqa, head_dim=8, max_position_embeddings=64)
        return config, t.GemmaForCausalLM
    if family == "opt":  # word_embed_proj_dim defaults to 768; no eos: the tiny model
        # generates OPT's eos 2, and conftest's reference keeps the model's eos (its None is unset)
        config = t.OPTConfig(
            vocab_size=99,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=37,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            init_std=0.3,
            eos_token_id=None,
        )
        return config, t.OPTForCausalLM
    if family == "bloom":  # ALiBi, no position limit: the static cache's default 1024
        config = t.BloomConfig(
            vocab_size=99, hidden_size=32, n_layer=2, n_head=4, initializer_range=0.3
        )
        return config, t.BloomForCausalLM
    if family == "falcon":  # the default: Falcon-7B's multi-query attention, one cached head
        return t.FalconConfig(**common, max_position_embeddings=64), t.FalconForCausalLM
    raise AssertionError(family)


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import torch

    out, built = tmp_path_factory.mktemp("families"), {}

    def directory(family: str) -> Path:
        if family not in built:
            config, cls = config_and_class(family)
            torch.manual_seed(0)
            built[family] = out / f"hf-{family}"
            cls(config).eval().save_pretrained(built[family])
        return built[family]

    return directory


@pytest.mark.parametrize(("family", "fmt"), CASES)
def test_family_generates_as_transformers(
    directories: Any, tmp_path: Path, family: str, fmt: str
) -> None:
    directory = directories(family)
    out = tmp_path / f"{family}.{fmt}"
    report = ptconvert.convert(directory, fmt, out, task=TASK)
    assert report.check == "generation" and report.generation.check.status == "pass"
    assert {(r.batch, r.prompt_length) for r in report.generation.check.runs} >= {(1, 3), (2, 7)}
    CHECKS[fmt](directory, out)


def test_a_decoder_that_does_not_export_with_a_static_cache_is_said(
    directories: Any, tmp_path: Path
) -> None:
    """OPT slices its positions by the static cache's length tensor (``aten.item`` under
    export): an internal error (exit 1) before, a named unsupported conversion now."""
    with pytest.raises(ptconvert.UnsupportedConversionError, match="OPTForCausalLM with a static"):
        ptconvert.convert(directories("opt"), "pt2", tmp_path / "opt.pt2", task=TASK)
    assert not (tmp_path / "opt.pt2").exists()
