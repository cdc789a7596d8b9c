"""joblib's numpy arrays: the wrapper joblib.dump writes for each, and the layout of the raw
bytes that follow it outside the opcodes (object array, size, padding), read from its BUILD state.

The machine (``machine.py``) skips those bytes, or runs the nested pickle of an object array, by
this layout: a reading that loses its place there would judge array bytes as opcodes.
"""

from __future__ import annotations

import re
from typing import Any

from ptconvert.pickles.records import Call, Dict, brief, dotted

# joblib.dump writes each numpy array as this wrapper, then the array's bytes right after the
# wrapper's BUILD, outside the pickle's opcodes; joblib.load reads them there (numpy_pickle.py).
JOBLIB_WRAPPER = "joblib.numpy_pickle.NumpyArrayWrapper"


def is_joblib_wrapper(value: Any) -> bool:
    """Whether ``value`` builds joblib's array wrapper (NEWOBJ, or copyreg at protocols 0-1)."""
    if not isinstance(value, Call):
        return False
    cls = value.func
    if dotted(cls) == "copyreg._reconstructor" and isinstance(value.args, tuple) and value.args:
        cls = value.args[0]
    return dotted(cls) == JOBLIB_WRAPPER


_DTYPE_SPEC = re.compile(r"[A-Za-z?]\d*")


def joblib_array_layout(state: Any) -> tuple[bool, int, bool]:
    """(object array, bytes of data, padding byte first) from a wrapper's BUILD state, or
    ValueError where the layout depends on something the machine cannot know."""
    if not isinstance(state, Dict) or not all(isinstance(k, str) for k, _ in state.items):
        raise ValueError("joblib array wrapper without a literal state")
    fields = dict(state.items)
    shape = fields.get("shape")
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError(f"joblib array shape is not literal ({brief(shape, 60)})")
    count = 1
    for n in shape:
        count *= n
    has_object, itemsize = _joblib_dtype(fields.get("dtype"))
    align = fields.get("numpy_array_alignment_bytes")
    return has_object, count * itemsize, align is not None


def _joblib_dtype(value: Any) -> tuple[bool, int]:
    """(has objects, item size) of a pickled ``numpy.dtype(spec, False, True)`` with its BUILD
    state ``(version, order, subarray, names, fields, elsize, ...)``; structured dtypes refused."""
    import numpy as np

    args = value.args if isinstance(value, Call) else None
    state = value.state if isinstance(value, Call) else None
    if (
        dotted(value.func if isinstance(value, Call) else None) != "numpy.dtype"
        or not isinstance(args, tuple)
        or not args
        or not isinstance(args[0], str)
        or not _DTYPE_SPEC.fullmatch(args[0])
    ):
        raise ValueError("joblib array dtype is not a literal numpy dtype")
    if isinstance(state, tuple) and len(state) >= 6 and (state[2] is not None or state[3]):
        raise ValueError("joblib array with a structured dtype: its layout is not checked")
    try:
        base = np.dtype(args[0])
    except TypeError as exc:
        raise ValueError(f"joblib array dtype {args[0]!r}: {exc}") from None
    elsize = state[5] if isinstance(state, tuple) and len(state) >= 6 else -1
    if base.kind in "VSU" and isinstance(elsize, int) and elsize > 0:
        return base.hasobject, elsize  # flexible types take their size from the state
    if elsize not in (-1, base.itemsize):
        raise ValueError(f"joblib array dtype {args[0]!r} with item size {elsize!r}")
    return base.hasobject, base.itemsize
