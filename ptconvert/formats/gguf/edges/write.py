"""The hf → gguf edge: a Hugging Face causal-LM directory written as llama.cpp's GGUF with the
gguf package's writer, then checked (``check.py``).

What is refused is refused before the weights are read: a family llama.cpp's architectures have
no place for, a tokenizer its vocabulary cannot hold (``gguf/families.py``, ``tokenizer.py``;
the engine asks ``GgufFormat.refuse_source`` before the route). The
matrices take the type asked (``--quantize q8_0|q4_0|q4_1|q5_0|q5_1``, else ``--dtype``, else
the source's own precision); as llama.cpp writes them, 1-D tensors (norms, biases) stay f32, and
a matrix whose rows the schemes' 32-value blocks do not divide is written f16. Under the 4- and
5-bit schemes the output matrix (a tied embedding's copy too) is written q8_0: llama-quantize
keeps it finer (llama-quant.cpp: q6_k for q4_0…q5_1), and the gguf package
quantizes no k-quant; the token embedding takes the scheme, as llama-quantize gives it. The
tensors are written one at a time (header and tensor infos first): one converted tensor is in
memory at once.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ptconvert import progress
from ptconvert.convert.state import RunState
from ptconvert.formats.gguf.families import (
    PHI3_NAMED_TOKENS,
    Family,
    Hyper,
    add_hyperparameters,
    family_of,
    general_name,
    permute_qk,
    tensor_names,
)
from ptconvert.formats.gguf.rope import FREQS, llama3_divisors
from ptconvert.formats.gguf.tokenizer import add_vocabulary, vocabulary
from ptconvert.formats.rope_config import rope_parameters
from ptconvert.options import Options

BLOCK = 32  # values in one block of q8_0, q4_0, q4_1, q5_0, q5_1
# the scheme → (gguf.GGMLQuantizationType name, gguf.LlamaFileType name)
SCHEMES = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
    "q4_1": ("Q4_1", "MOSTLY_Q4_1"),
    "q5_0": ("Q5_0", "MOSTLY_Q5_0"),
    "q5_1": ("Q5_1", "MOSTLY_Q5_1"),
}
# the block-quantized types (gguf.quants.quantize writes them)
QUANTIZED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
ROPE_FREQS = "#rope_freqs"  # the plan's key of Llama 3's rope factors (written f32)
# --dtype's precision → its GGUF type
_OF_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Planned:
    """One tensor of the file: the checkpoint's name, llama.cpp's, its ggml type, whether its
    rows are reordered for llama.cpp's rope (the heads it has), whether it is transposed (a
    Conv1D's (in, out) matrix, GPT-2's)."""

    source: str
    name: str
    qtype: str
    heads: int = 0  # > 0: permuted with that many heads
    transposed: bool = False


def oriented(tensor: Any, planned: Planned) -> Any:
    """The source tensor as the file holds it before any cast: (out, in)."""
    return tensor.t() if planned.transposed else tensor


def write_gguf(state: RunState, opts: Options) -> None:
    """The step: refuse what cannot be written, read the directory's weights (scanned first),
    write the GGUF at ``state.output``, check it (unless --no-verify)."""
    import gguf

    from ptconvert.model.build import source_weights
    from ptconvert.weights.read import as_tensors

    folder = state.src
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    family, hyper = family_of(config, str(folder))
    vocab = vocabulary(folder, hyper.vocab)
    scheme = _scheme(opts)  # the options' contradictions before the weights are read
    ws, state.scans = source_weights(folder, opts, state.scans)
    tensors = as_tensors(ws)
    if scheme is None:
        scheme = _source_scheme(tensors)
        state.notes.append(f"matrices written {scheme}: the source's own precision")
    names = tensor_names(list(tensors), family, hyper, str(folder))
    if "output.weight" not in names.values():  # tied: llama.cpp reads an output matrix too
        embedding = next(k for k, v in names.items() if v == "token_embd.weight")
        names[embedding + "#output"] = "output.weight"
        tensors[embedding + "#output"] = tensors[embedding]
    if hyper.rope_type == "llama3":  # llama.cpp's converter's extra tensor: "#" is no source's
        import torch

        # the original context as transformers takes it: a top-level key first, then the rope
        # parameters', else the model's own context
        rope = {"original_max_position_embeddings": hyper.context, **rope_parameters(config)}
        if config.get("original_max_position_embeddings") is not None:
            rope["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        divisors = llama3_divisors(rope, hyper.head_dim, hyper.rope_base)
        names[ROPE_FREQS], tensors[ROPE_FREQS] = FREQS, torch.tensor(divisors)
    plan = _plan(tensors, names, family, hyper, scheme)
    name = general_name(folder.name, vocab.tokens)
    if name is None:
        state.notes.append(
            f"general.name not written: llama.cpp takes a model named {folder.name!r} for "
            f"Phi-3's and looks up {', '.join(PHI3_NAMED_TOKENS)}, which this vocabulary lacks"
        )
    assert state.output is not None
    with progress.step(f"writing {len(plan)} tensors as GGUF ({scheme})"):
        writer = gguf.GGUFWriter(state.output, gguf.MODEL_ARCH_NAMES[_arch(family)])
        try:
            add_hyperparameters(writer, family, hyper, name)
            writer.add_file_type(getattr(gguf.LlamaFileType, SCHEMES[scheme][1]))
            state.notes += add_vocabulary(writer, vocab, folder)
            _write(writer, plan, tensors)
        finally:
            writer.close()
    state.notes.append(_summary(plan, family, hyper, scheme))
    if opts.verify:
        from ptconvert.formats.gguf.edges.check import check_gguf

        check_gguf(state, state.output, plan, tensors, family, hyper, scheme)


def _arch(family: Family) -> Any:
    import gguf

    return getattr(gguf.MODEL_ARCH, family.arch)


def _scheme(opts: Options) -> str | None:
    """--quantize's scheme, else --dtype's type, else None (the source's precision); the engine
    refused both together before any work."""
    if opts.quantize:
        return opts.quantize
    return _OF_DTYPE[opts.dtype] if opts.dtype else None


def _source_scheme(tensors: dict[str, Any]) -> str:
    """The type most of the source's floating tensors have (float64: f32)."""
    kinds = Counter(str(t.dtype) for t in tensors.values() if t.is_floating_point())
    common = kinds.most_common(1)[0][0].removeprefix("torch.") if kinds else "float32"
    return _OF_DTYPE.get(common, "f32")


def _plan(
    tensors: dict[str, Any], names: dict[str, str], family: Family, hyper: Hyper, scheme: str
) -> list[Planned]:
    out = []
    for source, name in names.items():
        transposed = name.endswith(family.transposed) if family.transposed else False
        shape = tuple(tensors[source].shape)
        shape = shape[::-1] if transposed else shape
        qtype = SCHEMES[scheme][0]
        if len(shape) < 2:
            qtype = "F32"  # norms and biases: llama.cpp keeps them f32
        elif qtype in QUANTIZED and shape[-1] % BLOCK:
            qtype = "F16"  # the blocks do not divide its rows: llama.cpp's fallback
        elif qtype in QUANTIZED and qtype != "Q8_0" and name == "output.weight":
            qtype = "Q8_0"  # llama-quantize's finer output (q6_k, which gguf cannot write)
        heads = 0
        if family.permutes_qk and ".attn_q." in name:
            heads = hyper.heads
        elif family.permutes_qk and ".attn_k." in name:
            heads = hyper.heads_kv
        out.append(Planned(source, name, qtype, heads, transposed))
    return out


def stored(tensor: Any, planned: Planned) -> Any:
    """The numpy array written for one tensor: permuted, then cast or quantized; bfloat16 as its
    raw bits (numpy has no bfloat16)."""
    import gguf
    import numpy as np
    import torch

    tensor = oriented(tensor, planned)
    if planned.heads:
        tensor = permute_qk(tensor, planned.heads)
    if planned.qtype in QUANTIZED:
        data = tensor.to(torch.float32).contiguous().numpy()
        return gguf.quants.quantize(data, getattr(gguf.GGMLQuantizationType, planned.qtype))
    dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[planned.qtype]
    cast = tensor.to(dtype).contiguous()
    if dtype == torch.bfloat16:
        return cast.view(torch.int16).numpy().view(np.uint16)
    return np.ascontiguousarray(cast.numpy())


def _nbytes(shape: tuple[int, ...], qtype: str) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, qtype)]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def _write(writer: Any, plan: list[Planned], tensors: dict[str, Any]) -> None:
    """Tensor infos first (their sizes known from the shapes), then each tensor converted and
    written in turn."""
    import gguf
    import numpy as np

    for p in plan:
        shape = tuple(oriented(tensors[p.source], p).shape)
        writer.add_tensor_info(
            p.name,
            shape,
            np.dtype(np.float32),
            _nbytes(shape, p.qtype),
            raw_dtype=getattr(gguf.GGMLQuantizationType, p.qtype),
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in plan:
        writer.write_tensor_data(stored(tensors[p.source], p))


def _summary(plan: list[Planned], family: Family, hyper: Hyper, scheme: str) -> str:
    types = Counter(p.qtype for p in plan)
    permuted = sum(1 for p in plan if p.heads)
    transposed = sum(1 for p in plan if p.transposed)
    words = [
        f"{len(plan)} tensors as llama.cpp's {family.arch.lower()} ({scheme}): "
        + ", ".join(f"{n} {t}" for t, n in sorted(types.items()))
    ]
    if permuted:
        words.append(
            f"{permuted} q/k projections reordered for llama.cpp's rope (each head's halves "
            "interleaved; transformers' GGUF loader reorders them back)"
        )
    if transposed:
        words.append(
            f"{transposed} Conv1D matrices transposed to (out, in) as llama.cpp reads them"
        )
    fallback = types["F16"] if SCHEMES[scheme][0] in QUANTIZED else 0
    if any(p.source == ROPE_FREQS for p in plan):
        words.append("Llama 3's rope scaling as rope_freqs (its per-frequency divisors)")
    if hyper.rope_type == "linear":
        words.append(f"linear rope scaling ×{hyper.rope_factor:g} as rope.scaling.type/factor")
    if fallback:
        words.append(
            f"{fallback} matrices f16: {scheme}'s 32-value blocks do not divide their rows"
        )
    if scheme != "q8_0" and types["Q8_0"]:
        words.append(
            "the output matrix q8_0: llama-quantize keeps it finer than the scheme (q6_k, which "
            "the gguf package cannot quantize)"
        )
    return "; ".join(words)
