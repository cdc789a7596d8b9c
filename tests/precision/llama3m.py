"""The ~3 M-parameter Llama of issue 41's measurements (vocab 2000, hidden 256, 4 layers, 4
heads over 2 key/value heads, intermediate 688: 3.9 M parameters), saved as a Hugging Face
directory, and its float32 eager logits: what the slow precision tests compare against."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 2000


def build_llama_3m(directory: Path) -> Path:
    """The model with seeded weights, saved by ``save_pretrained`` in ``directory``."""
    import transformers as t

    config = t.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    t.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def sample_ids(rows: int, length: int = 9) -> torch.Tensor:
    """Token ids a program was not exported with (seeded by the batch size)."""
    seeded = torch.Generator().manual_seed(rows)
    return torch.randint(3, VOCAB - 1, (rows, length), generator=seeded)


def float32_logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    """What the float32 eager model of ``directory`` returns for ``ids`` (no padding)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
