"""Pickles read without running them: the symbolic pickle machine (``machine.py``, its opcodes,
records and effects, torch's streams of pickles) and the allowlist of what a pickle may name
(``allowlist.py``). Below both the formats (which read checkpoints and TorchScript archives with
the machine) and the scanner (which judges what the machine saw): neither imports the other for
it. Beside them, the bitwise check's independent reader of torch checkpoints
(``stdlib_unpickler.py``, ``stdlib_checkpoint.py``): CPython's own unpickler and zipfile, sharing
no code with the machine."""
