"""The pt2 target's converters: an ExportedProgram loaded (after the scan) and saved, and its
weights from its loaded state dict."""

from __future__ import annotations

from ptconvert.atomic import guarded_file
from ptconvert.convert.graph import Edge
from ptconvert.convert.state import RunState
from ptconvert.convert.steps import program_read
from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.pt2 import ExportedProgramFormat
from ptconvert.model.build import program_sample_inputs
from ptconvert.options import Options
from ptconvert.scan.guard import guard


def load_pt2(state: RunState, opts: Options) -> None:
    from ptconvert.convert.exporting import dynamic_range_words
    from ptconvert.formats.pt2 import open_exported
    from ptconvert.model.wrappers import keywords_to_positions

    guard(state.src)
    program = open_exported(state.src)
    state.exported = program.exported
    state.dynamic_range = dynamic_range_words(program.exported)
    keyword = program.call is program.module
    if not keyword and program.signature is not None:
        state.positional = list(program.signature.names)  # as it was exported: by position
    if state.reference is None:
        state.reference = (
            program.module
            if keyword or state.positional is None
            else keywords_to_positions(program.module, state.positional)
        )
    if state.inputs is None and state.exported.example_inputs is not None:
        state.inputs = program_sample_inputs(state.exported)


def save_pt2(state: RunState, opts: Options) -> None:
    import torch

    from ptconvert.formats.pt2 import without_stack_traces
    from ptconvert.formats.pt2.edges.save import records_in_place

    assert state.exported is not None and state.output is not None
    # no path of this machine in the file unless --keep-debug-info; a failed write must not
    # abort the process (guarded_file); the weights written from where they lie
    with (
        without_stack_traces(state.exported, opts.keep_debug_info),
        guarded_file(state.output) as fh,
        records_in_place(),
    ):
        try:
            torch.export.save(state.exported, fh)
        except Exception as exc:
            if fh.error is not None or type(exc).__name__ != "SerializeError":
                raise  # a failed write (guarded_file's error), or not torch's refusal
            raise _unserializable(exc, state) from exc


def _unserializable(exc: Exception, state: RunState) -> UnsupportedConversionError:
    """torch.export's serializer refuses a node the export kept (Python's ``round`` on a
    dynamic size is not among the symbolic operators it can write): the program runs in
    memory, but has no .pt2 form."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    node = (lines[0].split(" in graph")[0] if lines else "")[:200]
    why = lines[-1][:200] if len(lines) > 1 else ""
    return UnsupportedConversionError(
        f"torch.export.save cannot serialize this program: {node}" + (f" ({why})" if why else ""),
        path=state.src,
        hint="compute the size with torch operations the serializer knows (// instead of "
        "round(), int(), math functions), or export it with static shapes (no --dynamic-batch)",
    )


def program_weights(state: RunState, opts: Options) -> None:
    """The weights of the pt2 source, from the program loaded (after a clean scan): on the way to
    a module it is the parity reference and brings its sample inputs; to a weights file they are
    read symbolically instead (planning.inapplicable)."""
    from ptconvert.formats.weightset import weights_from_tensors

    load_pt2(state, opts)
    assert state.exported is not None
    state.weights = weights_from_tensors(dict(state.exported.state_dict))
    program_read(state)


_PT2 = ExportedProgramFormat.name
EDGES = [
    Edge(
        _PT2,
        "exported",
        "load_pt2",
        1,
        label="torch.export.load (after the scan)",
        reads_source=True,
        run=load_pt2,
    ),
    Edge("exported", _PT2, "save_pt2", 1, label="torch.export.save", run=save_pt2),
    Edge(
        _PT2,
        "weights",
        "program_weights",
        1,
        label="the loaded program's state dict",
        run=program_weights,
    ),
]
