"""The ``--input-map`` pairs a refused binding suggests: each reference input the candidate does
not take by its name, paired with a candidate input of the same kind.

Inputs both sides name alike pair with each other. The others pair in order, but only where
their kinds agree, as far as they are known: a parameter's declared type (TorchScript's schema,
``forward``'s annotations: a tensor, an int, a float) and an example input's value (a tensor's
rank and dtype, a number). silero-vad's ONNX takes ``(input, state, sr)`` and its TorchScript
``(x, sr)``: paired by position, the hint fed the sample rate (an int) to the RNN state (a
float tensor of rank 3).
"""

from __future__ import annotations

from typing import Any

# a parameter's or a value's kind: "tensor", "int" (a whole number: a Python int or a rank-0
# integer tensor), "float" (a number: a Python float or a rank-0 float tensor); None: unknown
Kind = str | None


def declared_kinds(module: Any) -> dict[str, Kind]:
    """The kinds ``module``'s forward declares, by parameter name: TorchScript's schema, else
    Python annotations; an empty dict when neither says."""
    schema = getattr(getattr(module, "forward", None), "schema", None)
    if schema is not None:  # a ScriptModule's forward
        try:
            return {a.name: _type_kind(str(a.type)) for a in schema.arguments[1:]}
        except Exception:  # a schema this torch words otherwise: the kinds are not known
            return {}
    import inspect

    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return {}
    return {p.name: _type_kind(_annotation_text(p.annotation)) for p in params}


def _annotation_text(annotation: Any) -> str:
    import inspect

    if annotation is None or annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or str(annotation)


def _type_kind(text: str) -> Kind:
    text = text.replace("typing.", "").replace("torch.", "").strip()
    for wrapper in ("Optional[", "Union["):
        if text.startswith(wrapper):
            text = text[len(wrapper) :].split(",")[0].rstrip("]").strip()
    text = text.removesuffix("?").removesuffix(" | None")
    if text == "Tensor":
        return "tensor"
    if text in ("int", "bool", "SymInt"):
        return "int"
    if text in ("float", "number", "Scalar"):
        return "float"
    return None


def value_kind(value: Any) -> tuple[Kind, int | None]:
    """An example value's kind, and its rank when it is a tensor."""
    import torch

    if isinstance(value, bool | int):
        return "int", None
    if isinstance(value, float):
        return "float", None
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            whole = not (value.is_floating_point() or value.is_complex())
            return ("int" if whole else "float"), 0
        return "tensor", value.dim()
    return None, None


def _agree(want: Kind, have: tuple[Kind, int | None]) -> bool:
    """Whether a parameter of kind ``want`` can take a value of kind ``have`` (unknown: yes). A
    rank-0 tensor is a number to a number parameter, and a tensor to a tensor one."""
    kind, rank = have
    if want is None or kind is None:
        return True
    if want == kind:
        return True
    if want == "tensor":
        return rank == 0 and kind == "float"  # a float scalar tensor; an int one is a count
    return want == "float" and kind == "int"  # a float parameter takes a whole number


def suggested_pairs(
    ref_names: list[str],
    cand_names: list[str],
    ref_kinds: dict[str, Kind],
    cand_kinds: dict[str, tuple[Kind, int | None]],
) -> list[str]:
    """``REF=CAND`` for each reference input the candidate does not take by name, with the
    first candidate input left whose kind agrees; inputs named alike on both sides pair with
    each other and are not said."""
    left = [c for c in cand_names if c not in ref_names]
    pairs = []
    for r in ref_names:
        if r in cand_names or not left:
            continue
        want = ref_kinds.get(r)
        match = next((c for c in left if _agree(want, cand_kinds.get(c, (None, None)))), None)
        if match is not None:
            left.remove(match)
            pairs.append(f"{r}={match}")
    return pairs


def kinds_of(
    ref: Any, cand: Any, values: dict[str, Any]
) -> tuple[dict[str, Kind], dict[str, tuple[Kind, int | None]]]:
    """Each side's kinds by its input names (``Runtime``s): the reference's as its module
    declares them, else as the example value of that name is; the candidate's as the example
    value of that name is, else as its module declares them."""
    ref_kinds = {n: value_kind(v)[0] for n, v in values.items()}
    if ref.module is not None:
        ref_kinds.update({n: k for n, k in declared_kinds(ref.module).items() if k is not None})
    cand_kinds: dict[str, tuple[Kind, int | None]] = {}
    if cand.module is not None:
        cand_kinds.update({n: (k, None) for n, k in declared_kinds(cand.module).items()})
    cand_kinds.update({n: value_kind(v) for n, v in values.items()})
    return ref_kinds, cand_kinds
