"""Pickles read without running them: the symbolic pickle machine (``machine.py``) and the
allowlist of what a pickle may name (``allowlist.py``). Below both the formats (which read
checkpoints and TorchScript archives with the machine) and the scanner (which judges what the
machine saw): neither imports the other for it."""
