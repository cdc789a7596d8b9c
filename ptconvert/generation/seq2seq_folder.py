"""A seq2seq generation export's folder: the names of the files each target writes there (pt2:
``encoder.pt2`` and ``decoder.pt2``; ONNX: optimum's graphs, the merged decoder beside the split
ones; both: the model's configs).
Which target wrote a folder is told from these names (``targets.folder_target``)."""

from __future__ import annotations

ENCODER_PT2, DECODER_PT2 = "encoder.pt2", "decoder.pt2"
ENCODER_ONNX = "encoder_model.onnx"
DECODER_ONNX = "decoder_model.onnx"
WITH_PAST_ONNX = "decoder_with_past_model.onnx"
MERGED_ONNX = "decoder_model_merged.onnx"  # both decoders in one (optimum's loader prefers it)
CONFIGS = ("config.json", "generation_config.json")
