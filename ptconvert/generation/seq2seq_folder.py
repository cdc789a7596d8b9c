"""A seq2seq generation export's folder: the files each of its layouts writes (pt2:
``encoder.pt2`` and ``decoder.pt2``; ONNX: optimum's three graphs; both: the model's configs),
and ``layout``, which tells from their names which one a folder holds."""

from __future__ import annotations

from pathlib import Path

ENCODER_PT2, DECODER_PT2 = "encoder.pt2", "decoder.pt2"
ENCODER_ONNX = "encoder_model.onnx"
DECODER_ONNX = "decoder_model.onnx"
WITH_PAST_ONNX = "decoder_with_past_model.onnx"
CONFIGS = ("config.json", "generation_config.json")

# the files of each layout, the configs aside
FILES: dict[str, tuple[str, ...]] = {
    "pt2": (ENCODER_PT2, DECODER_PT2),
    "onnx": (ENCODER_ONNX, DECODER_ONNX, WITH_PAST_ONNX),
}


def layout(path: Path) -> str | None:
    """``pt2`` or ``onnx`` for a folder written by a seq2seq generation export, else None
    (read from the names of the files it holds)."""
    if not path.is_dir():
        return None
    return next(
        (name for name, files in FILES.items() if all((path / f).is_file() for f in files)), None
    )
