"""ExecuTorch's own LLM runner (``TextLLMRunner``, the executorch wheel's python bindings of its
C++ runner) on a written ``.pte``: run in a process of its own (``formats/isolated.py``), greedy,
on a prompt text, its tokenizer a ``tokenizer.json``; it answers with the pieces its token
callback received, in order.

The runner prints each piece on the process's stdout and logs on its stderr (native code, not
Python's streams): in the child both go to the file ``isolated`` captures, so nothing reaches
the user's terminal or ptconvert's ``--json``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

RUNNER_MODULE = "executorch.extension.llm.runner"


def runner_installed() -> bool:
    """Whether the executorch wheel has the LLM runner's compiled bindings, found without
    importing them (a wheel built without them raises at import; importing them here would
    print the native tokenizer's log on the user's terminal)."""
    import importlib.machinery
    import importlib.util

    try:
        spec = importlib.util.find_spec(RUNNER_MODULE.rsplit(".", 1)[0])
    except (ImportError, ValueError):  # executorch itself is missing
        return False
    folders = spec.submodule_search_locations if spec is not None else None
    return any(
        (Path(folder) / "runner" / f"_llm_runner{suffix}").is_file()
        for folder in folders or ()
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def generate_pieces(program: Path, tokenizer: Path, prompt: str, new_tokens: int) -> list[str]:
    """The pieces ``TextLLMRunner`` generates from ``prompt`` for ``program`` (at most
    ``new_tokens``; fewer where it reaches an end-of-sequence id), in a spawned process that
    ends with this call. The runner failing on the written program, or its process dying, is
    the check's failure (``VerificationError``): the program does not run in its client."""
    from ptconvert.errors import RuntimeDiedError, VerificationError
    from ptconvert.formats.isolated import IsolatedRuntime

    load = functools.partial(_load, str(tokenizer))
    try:
        runtime = IsolatedRuntime("TextLLMRunner", str(program), load=load)
    except RuntimeDiedError as exc:
        raise VerificationError(exc.message, path=program) from None
    try:
        out = runtime(prompt=prompt, new_tokens=new_tokens)
    except RuntimeError as exc:
        raise VerificationError(
            f"ExecuTorch's TextLLMRunner failed generating from {prompt!r}: {exc}", path=program
        ) from None
    finally:
        runtime.close()
    return [bytes(t.tolist()).decode() for t in out]


def _load(tokenizer: str, path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    """The child's runner (``isolated.Load``, ``tokenizer`` bound by ``generate_pieces``): each
    call generates from ``prompt`` afresh and returns its pieces as UTF-8 byte arrays (arrays
    are what the pipe carries)."""
    import os

    import numpy as np

    os.dup2(2, 1)  # its printed pieces into the captured stderr, never the parent's stdout
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    def run(feeds: dict[str, Any]) -> list[Any]:
        runner = TextLLMRunner(path, tokenizer)  # a new one: position 0, an empty cache
        # greedy; no BOS or EOS added to the prompt's ids (the config's defaults, said here)
        config = GenerationConfig(
            echo=False,
            max_new_tokens=int(feeds["new_tokens"]),
            temperature=0.0,
            num_bos=0,
            num_eos=0,
        )
        pieces: list[str] = []
        runner.generate(str(feeds["prompt"]), config, token_callback=pieces.append)
        return [np.frombuffer(p.encode(), dtype=np.uint8).copy() for p in pieces]

    return run, ["prompt", "new_tokens"], [device]
