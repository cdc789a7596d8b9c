"""llama.cpp's runtime on a GGUF file, run by the clients' venv's python (llama-cpp-py-sync:
llama.cpp b11739's prebuilt libraries, loaded from the folder tools/llama_cpp_fit.py fitted).

Usage: ``python llama_cpp_client.py FITTED_DIR MODEL.gguf INPUTS.pt OUTPUTS.pt``. INPUTS holds
``prompts`` (lists of token ids), ``greedy_prompt``, ``new_tokens``, ``text`` and optionally
``texts``; OUTPUTS
holds, per prompt, the logits llama.cpp computes at every position (float32, one row per
token), ``greedy``: ``greedy_prompt`` followed by ``new_tokens`` tokens llama.cpp's own greedy
sampler picks (no stop at end-of-sequence, as the reference's), and ``tokenized``: llama.cpp's
tokenizer on ``text`` (no BOS added, special tokens parsed), ``tokenized_all`` on each of
``texts``.

The package's ``Llama`` class loads the model and makes the context; its decoding asks for the
last position's logits only, so prompts are decoded here through llama.cpp's C API (the
package's CFFI ``lib``: ``llama_batch_init``, ``llama_decode``, ``llama_get_logits_ith``,
``llama_sampler_init_greedy``)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch


def open_llama_cpp(fitted: Path) -> Any:
    """The package, its library found in ``fitted`` (the wheel's own copy may not load on this
    glibc): the shim of C23 libc functions first, global, so llama.cpp binds to it."""
    ctypes.CDLL(str(fitted / "libisoc23.so"), mode=ctypes.RTLD_GLOBAL)
    from llama_cpp_py_sync import _cffi_bindings

    _cffi_bindings._find_library = lambda: str(fitted / "libllama.so")
    import llama_cpp_py_sync

    return llama_cpp_py_sync


def decode(llm: Any, ids: list[int], start: int, every: bool) -> None:
    """One llama_decode of ``ids`` at positions ``start``…, in sequence 0; logits for every
    position when ``every``, else for the last."""
    lib = llm._lib
    batch = lib.llama_batch_init(len(ids), 0, 1)
    try:
        batch.n_tokens = len(ids)
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if every or i == len(ids) - 1 else 0
        code = lib.llama_decode(llm._ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
    finally:
        lib.llama_batch_free(batch)


def all_logits(llm: Any, ids: list[int]) -> torch.Tensor:
    llm._clear_context_state()  # a fresh sequence: position 0, empty KV cache
    decode(llm, ids, 0, every=True)
    n = llm.n_vocab
    rows = [
        np.frombuffer(llm._ffi.buffer(llm._lib.llama_get_logits_ith(llm._ctx, i), 4 * n), "<f4")
        for i in range(len(ids))
    ]
    return torch.from_numpy(np.stack(rows).copy())


def greedy(llm: Any, ids: list[int], new_tokens: int) -> torch.Tensor:
    llm._clear_context_state()
    lib = llm._lib
    sampler = lib.llama_sampler_init_greedy()
    try:
        out = list(ids)
        decode(llm, out, 0, every=False)
        for _ in range(new_tokens):
            token = int(lib.llama_sampler_sample(sampler, llm._ctx, -1))
            out.append(token)
            decode(llm, [token], len(out) - 1, every=False)
    finally:
        lib.llama_sampler_free(sampler)
    return torch.tensor(out)


def main() -> None:
    fitted, model, given, got = map(Path, sys.argv[1:5])
    inputs = torch.load(given, weights_only=True)
    llama = open_llama_cpp(fitted)
    longest = max(len(p) for p in [*inputs["prompts"], inputs["greedy_prompt"]])
    longest += inputs["new_tokens"]
    with llama.Llama(str(model), n_ctx=max(64, longest), n_batch=64, n_threads=2) as llm:
        out = {
            "logits": [all_logits(llm, list(p)) for p in inputs["prompts"]],
            "greedy": greedy(llm, list(inputs["greedy_prompt"]), inputs["new_tokens"]),
            "tokenized": llm.tokenize(inputs["text"], add_special=False, parse_special=True),
            "tokenized_all": [  # each of "texts" too, where given
                llm.tokenize(t, add_special=False, parse_special=True)
                for t in inputs.get("texts", [])
            ],
            "n_vocab": llm.n_vocab,
            "description": llm.get_model_desc(),
        }
    torch.save(out, got)


if __name__ == "__main__":
    main()
