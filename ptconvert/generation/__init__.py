"""Generation-ready exports: a language model with its KV cache, verified by generating.

``--task text-generation-with-past`` (optimum's name) exports a decoder-only LM so that a loop
can drive it token by token: to pt2 through transformers' exportable wrapper with a static
cache (``input_ids`` + ``cache_position``, the cache kept as mutated buffers), to ONNX with
``past_key_values.N.key|value`` inputs and ``present.N.key|value`` outputs. The check generates
with the written artifact (``runner.generate``) and compares every token and every step's
logits with transformers' ``generate(do_sample=False)`` on the eager model.

Modules: ``tasks`` (which task fits which model), ``loading`` (the eager model of a directory),
``static_cache`` (the static-cache wrapper: pt2, and AOTI and ExecuTorch build on it),
``seq2seq`` and ``seq2seq_folder`` (a seq2seq model's folder), ``targets`` (the Target each
target package declares in its ``generation`` module: its export, what a written one says of
itself, its stepper), ``runner`` (the greedy loop over an artifact), ``check`` (the comparison
with transformers), ``convert`` (the conversion and its report), ``bench`` (its timing against
transformers). Each target's own generation export lies in its package: ``formats/aoti/
generation.py``, ``formats/pte/generation.py``, ``formats/onnx/generation/`` (``past``,
``seq2seq``), ``formats/pt2/generation.py`` (the declarations of the two above).
"""
