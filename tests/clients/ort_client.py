"""optimum's ORTModel classes on what ptconvert wrote: run by the clients' venv's python
(``.venv-optimum``: optimum-onnx, transformers 4.57), never imported by the tests.

    python ort_client.py CLASS PATH INPUTS OUTPUTS

``CLASS.from_pretrained(PATH)`` (an ``optimum.onnxruntime`` class: ``ORTModelForCausalLM``,
``ORTModelForSeq2SeqLM``, ``ORTModelForSpeechSeq2Seq``, ``ORTModelForSequenceClassification``)
loads the folder as written; INPUTS is ``torch.save`` of a dict of tensors. A generation class
generates greedily, ``new_tokens`` exactly, with the bare generation config the tests'
reference uses (tests/generation: no end token, the model's own config swapped out); a
classifier's forward returns its logits. OUTPUTS gets ``torch.save`` of the tensor, and
OUTPUTS.json what the model opened and ran: each part's file (``encoder``, ``decoder``,
``decoder_with_past``), whether the decoder is merged (``is_merged``) and the
``use_cache_branch`` it was fed at each call (``use_cache_branch``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import optimum.onnxruntime
import torch
from transformers import GenerationConfig


def main() -> None:
    cls_name, path, inputs_path, outputs_path = sys.argv[1:]
    cls = getattr(optimum.onnxruntime, cls_name)
    model = cls.from_pretrained(path)
    opened = {"use_cache_branch": []}
    watch(model, opened)
    inputs = torch.load(inputs_path, weights_only=True)
    new_tokens = int(inputs.pop("new_tokens", 0))
    with torch.no_grad():
        if not new_tokens:
            result = model(**inputs).logits
        else:
            config = GenerationConfig(
                do_sample=False,
                max_new_tokens=new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                decoder_start_token_id=model.generation_config.decoder_start_token_id,
            )
            model.generation_config = GenerationConfig()
            result = model.generate(**inputs, generation_config=config)
    torch.save(result, outputs_path)
    Path(outputs_path + ".json").write_text(json.dumps(opened))


def watch(model: Any, opened: dict[str, Any]) -> None:
    """The files of the model's parts into ``opened``; its decoder's session runs recorded (the
    ``use_cache_branch`` of each: a merged decoder's branch; None without one)."""
    for part in ("encoder", "decoder", "decoder_with_past"):
        if getattr(model, part, None) is not None:
            opened[part] = Path(getattr(model, part).path).name
    decoder = getattr(model, "decoder", None)
    if decoder is None:
        return
    opened["is_merged"] = bool(getattr(decoder, "is_merged", False))
    session = decoder.session
    run = session.run

    def recorded(names: Any, feed: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        branch = feed.get("use_cache_branch")
        opened["use_cache_branch"].append(None if branch is None else bool(branch[0]))
        return run(names, feed, *args, **kwargs)

    session.run = recorded


if __name__ == "__main__":
    main()
