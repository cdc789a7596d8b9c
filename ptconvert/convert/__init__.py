"""Conversions. Today: weights between pickle checkpoints and safetensors (``weights.py``)."""
