"""Tiny Hugging Face directories of real transformers classes (random init from configs, never
the hub), built once per session. ``initializer_range=0.3`` spreads the random logits so that
greedy decoding picks many different tokens (the default 0.02 repeats one)."""

from __future__ import annotations

from pathlib import Path

import pytest

DECODERS = ("llama", "gpt2", "qwen2")
VOCAB = 99  # every tiny model's
FIRST = 0x100  # write_tokenizer's: id i is the character chr(FIRST + i)
SEQ2SEQ = ("t5", "bart", "marian")


def build(name: str, out: Path) -> Path:
    import torch
    import transformers as t

    configs = {
        "llama": (
            t.LlamaConfig(
                vocab_size=99,
                hidden_size=32,
                intermediate_size=37,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                initializer_range=0.3,
            ),
            t.LlamaForCausalLM,
        ),
        "gpt2": (
            t.GPT2Config(
                vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.3
            ),
            t.GPT2LMHeadModel,
        ),
        "qwen2": (
            t.Qwen2Config(
                vocab_size=99,
                hidden_size=32,
                intermediate_size=37,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                initializer_range=0.3,
            ),
            t.Qwen2ForCausalLM,
        ),
        # initializer_factor 4 / init_std 0.5 and 1: greedy decoding picks several tokens, not one
        "t5": (
            t.T5Config(
                vocab_size=99,
                d_model=32,
                d_kv=8,
                d_ff=37,
                num_layers=2,
                num_heads=4,
                initializer_factor=4.0,
                decoder_start_token_id=0,
            ),
            t.T5ForConditionalGeneration,
        ),
        "bart": (
            t.BartConfig(
                vocab_size=99,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=37,
                decoder_ffn_dim=37,
                max_position_embeddings=64,
                init_std=0.5,
            ),
            t.BartForConditionalGeneration,
        ),
        "marian": (
            t.MarianConfig(
                vocab_size=99,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=37,
                decoder_ffn_dim=37,
                max_position_embeddings=64,
                init_std=1.0,
                decoder_start_token_id=98,
                pad_token_id=98,
            ),
            t.MarianMTModel,
        ),
        # Whisper: 16 mel bins × 64 frames (2 × max_source_positions, fixed), init_std 0.5
        "whisper": (
            t.WhisperConfig(
                vocab_size=99,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=37,
                decoder_ffn_dim=37,
                num_mel_bins=16,
                max_source_positions=32,
                max_target_positions=48,
                decoder_start_token_id=1,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                init_std=0.5,
            ),
            t.WhisperForConditionalGeneration,
        ),
        "bert": (
            t.BertConfig(
                vocab_size=99,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=37,
            ),
            t.BertModel,
        ),
    }
    config, cls = configs[name]
    torch.manual_seed(0)
    directory = out / f"hf-{name}"
    cls(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("generation")
    return {name: build(name, out) for name in (*DECODERS, "bert")}


@pytest.fixture(scope="session")
def tiny_seq2seq(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("seq2seq")
    return {name: build(name, out) for name in SEQ2SEQ}


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("whisper", tmp_path_factory.mktemp("whisper"))


def eager(directory: Path):  # type: ignore[no-untyped-def]
    """The directory's model as transformers loads it: the reference."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()


def reference(model, ids, new_tokens: int = 16):  # type: ignore[no-untyped-def]
    """transformers' greedy generate: exactly ``new_tokens`` tokens, raw logits per step."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)


def write_tokenizer(path: Path) -> Path:
    """A BPE ``tokenizer.json`` for the tiny models (which have none): their 99 ids as single
    characters U+0100 + id, no merges, what ExecuTorch's TextLLMRunner and ``tokenizers``
    read alike."""
    from tokenizers import Tokenizer, models

    chars = {chr(FIRST + i): i for i in range(VOCAB)}
    Tokenizer(models.BPE(chars, [], unk_token=None)).save(str(path))
    return path
