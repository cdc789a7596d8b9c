"""``--dtype`` and ``--quantize`` refused before any work where the target cannot hold them:
each target declares the precisions (``Format.dtypes``) and schemes (``quantize_schemes``) it
writes, and the refusal names those, or the targets that write the scheme."""

from __future__ import annotations

from typing import Any

from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.options import Options


def refuse_unheld_precision(to: str, opts: Options) -> None:
    """UnsupportedConversionError (exit 4) when ``to`` cannot hold ``--dtype`` or ``--quantize``."""
    target = FORMATS_BY_NAME.get(to)
    if target is None:
        return
    if opts.dtype and opts.dtype not in target.dtypes:
        raise UnsupportedConversionError(
            f"--to {to} cannot hold --dtype {opts.dtype}: {target.dtypes_why}",
            hint=f"{to} takes --dtype {' or '.join(target.dtypes)}",
        )
    if opts.quantize:
        _refuse_scheme(to, target, opts.quantize, opts.dtype)


def _refuse_scheme(to: str, target: Any, scheme: str, dtype: str | None) -> None:
    """``--quantize`` refused where the target does not write the scheme (the hint names the
    targets that do) or with a half precision (the quantizers take float32)."""
    if scheme not in target.quantize_schemes:
        why = (
            target.quantize_why
            if target.kind == "program"
            else "quantized weights files are not there yet; --dtype casts"
        )
        takers = sorted(f.name for f in FORMATS_BY_NAME.values() if scheme in f.quantize_schemes)
        raise UnsupportedConversionError(
            f"--to {to} cannot hold --quantize {scheme}: {why}",
            hint=f"--quantize {scheme} is written by --to {' or '.join(takers)}",
        )
    if dtype not in (None, "float32"):
        raise UnsupportedConversionError(
            f"--quantize {scheme} with --dtype {dtype} is not there yet: the quantized program "
            "keeps float32 activations",
            hint="leave out --dtype, or convert with --dtype alone",
        )
