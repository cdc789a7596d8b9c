"""ExecuTorch's own LLM runner (``TextLLMRunner``, from the executorch wheel's python bindings)
on a ``.pte``: run by ``.venv``'s python in a process of its own, never imported by the tests.

    python llm_runner_client.py PTE TOKENIZER INPUTS OUTPUTS

INPUTS is ``torch.save`` of ``{"prompt": str, "new_tokens": int}``; the runner generates
greedily (temperature 0) from the prompt, its tokenizer the test's ``tokenizer.json``; OUTPUTS
gets ``torch.save`` of the pieces its token callback received, in order (a list of str).
"""

from __future__ import annotations

import sys

import torch
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner


def main() -> None:
    pte, tokenizer, inputs_path, outputs_path = sys.argv[1:]
    inputs = torch.load(inputs_path, weights_only=True)
    runner = TextLLMRunner(pte, tokenizer)
    pieces: list[str] = []
    config = GenerationConfig(echo=False, max_new_tokens=inputs["new_tokens"], temperature=0.0)
    runner.generate(inputs["prompt"], config, token_callback=pieces.append)
    torch.save(pieces, outputs_path)


if __name__ == "__main__":
    main()
