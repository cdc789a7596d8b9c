"""What every format module provides, and the shared shapes of detection and ``info``.

A format recognises itself from content (``match`` on a ``Probe``: first bytes, last bytes, zip
member names), never from the file name, and describes a file without executing anything
(``info``). Formats know nothing about each other; overlaps are settled by ``priority`` (a pt2
archive is also a zip, an AOTInductor package is also a pt2 archive).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ptconvert.archive import ZipArchive, is_zip, open_zip
from ptconvert.errors import CorruptFileError, UnsupportedConversionError, VerificationError
from ptconvert.formats.program import IOSpec, Program
from ptconvert.formats.torch_objects import DTYPE_SIZES
from ptconvert.report import Report

if TYPE_CHECKING:
    from ptconvert.formats.reference import Reference
    from ptconvert.formats.weightset import WeightSet

HEAD_BYTES = 4096
_REGISTRY_DESCRIBE: list[Callable[[Path], FileInfo]] = []  # set by ptconvert.formats
TAIL_BYTES = 65535 + 22


@dataclass
class Probe:
    """Cheap, cached views of a path that every format's ``match`` may look at."""

    path: Path

    @cached_property
    def is_dir(self) -> bool:
        return self.path.is_dir()

    @cached_property
    def size(self) -> int:
        return 0 if self.is_dir else self.path.stat().st_size

    @cached_property
    def head(self) -> bytes:
        if self.is_dir:
            return b""
        with open(self.path, "rb") as fh:
            return fh.read(HEAD_BYTES)

    @cached_property
    def tail(self) -> bytes:
        if self.is_dir or self.size == 0:
            return b""
        with open(self.path, "rb") as fh:
            return os.pread(fh.fileno(), TAIL_BYTES, max(0, self.size - TAIL_BYTES))

    @cached_property
    def zip(self) -> ZipArchive | None:
        """The archive's directory if this is a zip that parses, else None."""
        if self.is_dir or not is_zip(self.head):
            return None
        try:
            return open_zip(self.path)
        except CorruptFileError:
            return None

    def zip_has(self, suffix: str) -> bool:
        """Whether a member named ``<root>/<suffix>`` (or ``<suffix>``) exists, ignoring case as
        torch's zip reader does."""
        z = self.zip
        if z is None:
            return False
        want = suffix.lower()
        return any(n == want or n.endswith("/" + want) for n in map(str.lower, z.names))


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: list[int | str]
    numel: int


@dataclass
class Quantization:
    """What in a file is quantized, counted: ``ops`` the quantized operators of its program by
    name (ONNX's MatMulInteger, DynamicQuantizeLinear, QLinear*; a pte's quantized kernels),
    ``weights`` its quantized tensors by how each is stored (``int8``: the integer weights of
    those operators; GGUF's block types; ``torchao.Int8Tensor``: a pt2's tensor subclass)."""

    ops: dict[str, int] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)

    def add(self, other: Quantization) -> None:
        """Count another file's as well (the shards of one set)."""
        for mine, theirs in ((self.ops, other.ops), (self.weights, other.weights)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n


@dataclass
class FileInfo(Report):
    """What ``ptconvert info`` reports about a file or directory."""

    path: str
    format: str
    layout: str
    size_bytes: int
    files: list[dict[str, Any]] = field(default_factory=list)
    tensors: int | None = None
    parameters: int | None = None
    # per dtype: tensors, elements and the bytes they are stored in (no bytes: a size unknown)
    dtypes: dict[str, dict[str, int]] = field(default_factory=dict)
    quantized: Quantization | None = None  # None: nothing in the file is quantized
    largest: list[TensorEntry] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    inputs: list[IOSpec] | None = None
    outputs: list[IOSpec] | None = None
    opset: dict[str, int] | None = None
    contents: dict[str, str] = field(default_factory=dict)  # non-tensor entries of a checkpoint
    globals: list[str] = field(default_factory=list)  # every global a pickle imports
    needs_code: list[str] = field(default_factory=list)  # classes that must be importable
    native_code: list[str] = field(default_factory=list)  # shared libraries that run on load
    notes: list[str] = field(default_factory=list)

    def add_tensors(
        self,
        entries: Iterable[tuple[str, str, list[int | str], int]],
        aliases: frozenset[str] = frozenset(),
        nbytes: Mapping[str, int] | None = None,
    ) -> None:
        """Fill tensor count, parameter count, dtype histogram and the largest tensors.

        ``aliases`` names tensors that share their data with another listed tensor (tied
        weights): they count as tensors but not again as parameters. ``nbytes`` gives the
        stored size of tensors whose dtype does not say it (quantized blocks, a tensor
        subclass's storages); the others take elements × the dtype's size, and a dtype of no
        known size has no ``bytes`` in the histogram.
        """
        items = [TensorEntry(n, d, list(s), int(k)) for n, d, s, k in entries]
        self.tensors = len(items)
        self.parameters = sum(t.numel for t in items if t.name not in aliases)
        hist: dict[str, dict[str, int]] = {}
        unsized: set[str] = set()  # a dtype with a tensor of unknown size: its total is unknown
        for t in items:
            h = hist.setdefault(t.dtype, {"tensors": 0, "elements": 0, "bytes": 0})
            h["tensors"] += 1
            h["elements"] += t.numel
            size = (nbytes or {}).get(t.name, t.numel * DTYPE_SIZES.get(t.dtype, -1))
            h["bytes"] += size
            if size < 0:
                unsized.add(t.dtype)
        for dtype in unsized:
            del hist[dtype]["bytes"]
        self.dtypes = dict(sorted(hist.items()))
        self.largest = heapq.nlargest(5, items, key=lambda t: (t.numel, t.name))

    def merge_tensors(self, other: FileInfo) -> None:
        """Add another file's tensor figures to these (the shards of one set)."""
        self.tensors = (self.tensors or 0) + (other.tensors or 0)
        self.parameters = (self.parameters or 0) + (other.parameters or 0)
        for dtype, h in other.dtypes.items():
            mine = self.dtypes.get(dtype)
            if mine is None:
                self.dtypes[dtype] = dict(h)
                continue
            mine["tensors"] += h["tensors"]
            mine["elements"] += h["elements"]
            if "bytes" in mine and "bytes" in h:
                mine["bytes"] += h["bytes"]
            else:
                mine.pop("bytes", None)
        self.dtypes = dict(sorted(self.dtypes.items()))
        if other.quantized is not None:
            self.quantized = self.quantized or Quantization()
            self.quantized.add(other.quantized)
        self.largest = heapq.nlargest(
            5, [*self.largest, *other.largest], key=lambda t: (t.numel, t.name)
        )


@dataclass(frozen=True)
class Need:
    """What a converter (an edge of the graph) needs: how to tell it is met, how to provide it."""

    name: str
    hint: str  # what provides it, for the message when it is missing
    met: Callable[[str, Any], bool]  # (the source's format, the options) → met?


def installed(*modules: str) -> Callable[[str, Any], bool]:
    """A need met when every one of ``modules`` is installed (found, not imported)."""
    import importlib.util

    return lambda src_format, opts: all(importlib.util.find_spec(m) for m in modules)


class Format:
    """Base of format modules. Subclasses set the class attributes and implement the methods.

    ``kind`` says what the file is to a conversion: ``weights`` (tensors by name: checked
    bitwise) or ``program`` (something that runs: ``open`` loads it, checked for parity).
    """

    name: ClassVar[str]
    kind: ClassVar[Literal["weights", "program"]] = "weights"
    suffixes: ClassVar[tuple[str, ...]] = ()
    output_suffix: ClassVar[str] = ""  # the suffix of a file ptconvert writes ("" : suffixes[0])
    # its loader refuses a file named otherwise (torch.export.load, aoti_load_package: ".pt2")
    loader_needs_suffix: ClassVar[bool] = False
    holds: ClassVar[str] = ""
    priority: ClassVar[int] = 0  # higher wins when several formats match
    # programs: how a user loads one with its own runtime (``p`` is the path), as Python lines;
    # the conversion runs them in a fresh interpreter before it reports success
    load_line: ClassVar[str] = ""
    # the same load as the conversion's fresh interpreter runs it ("": load_line)
    fresh_load_line: ClassVar[str] = ""
    # what load_line imports, imported by that interpreter before the file is written
    warm_line: ClassVar[str] = ""
    runs_native_code: ClassVar[bool] = False  # loading runs compiled code (needs --trust)
    isolated: ClassVar[bool] = False  # `open` runs the program in a process of its own
    # a nested input (a tuple, list or dict of tensors) is taken as its leaves, each named as
    # torch.onnx names them (``tuple0_0``: isolated.flat_inputs)
    takes_leaves: ClassVar[bool] = False
    # the file refuses sizes outside the ranges its dynamic dims were exported with (a .pt2's
    # guards, an AOTI package's input checks): a range can be narrowed in it; ONNX cannot
    bounds_dims: ClassVar[bool] = False
    # a format ptconvert writes through another target's option says which (sharded sets)
    written_by: ClassVar[str] = ""
    carries_model_spec: ClassVar[bool] = False  # names its model class (a config.json beside)
    may_hold_module: ClassVar[bool] = False  # may be a whole pickled nn.Module (with --trust)
    # what its converters need beyond the core needs (an installed package, a compiler)
    needs: ClassVar[tuple[Need, ...]] = ()
    # the optional packages it imports and the extra of ptconvert that brings them: the install
    # hints name the extra, and their versions are in the cache's key
    packages: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str] = ""
    # its own options (a dataclass of ``options.flag()`` fields, e.g. the ONNX target's opset):
    # the CLI's flags and the API's keywords, read with ``Options.of(cls)``, in the cache's key
    options_class: ClassVar[type | None] = None
    # the precisions --dtype may ask of it, and why the others are refused (before any work)
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    dtypes_why: ClassVar[str] = ""
    # the schemes --quantize may ask of it (options.Quantize), and why the others are refused
    # (before any work); ``quantizes_module``: the scheme is applied to the eager model before
    # export (torchao), so the program is compared with that quantized model by parity; else the
    # target's own step quantizes the written program, which is judged by accuracy alone
    quantize_schemes: ClassVar[tuple[str, ...]] = ()
    quantize_why: ClassVar[str] = "it has no quantized form here yet"
    quantizes_module: ClassVar[bool] = False

    def load_in_time(self, path: Path, timeout: float | None) -> None:
        """A file whose own code runs when it loads (TorchScript's ``__setstate__``) loaded first
        in a child, stopped after ``timeout`` s (LoadTimeoutError): before this process loads
        it, or a copy is written. Other formats run nothing of the file's at load."""

    def refuse_source(self, src: Path) -> None:
        """A target that cannot hold what ``src`` holds says so before any work, as an
        UnsupportedConversionError naming what is missing (a GGUF: the model's family, its
        tokenizer); ``plan`` and ``--to all`` say it too. Most targets take any source a route
        reaches."""

    def writes_weights_in_place(self) -> bool:
        """Whether writing a program of this format writes each weight from where it lies (no
        copy of the largest tensor at the peak: a check's fresh interpreter may start early)."""
        return False

    def edges(self) -> list[Any]:
        """Its converters: the graph's ``Edge``s to and from it. A target package's are the
        ``EDGES`` of its ``edges`` subpackage, imported when the graph first asks for them (they
        stand on the converter layer, above the readers); a plugin's format may return its own."""
        import importlib
        import importlib.util
        import sys

        package = sys.modules[type(self).__module__]
        if not hasattr(package, "__path__"):  # a format of one module: no converters of its own
            return []
        name = f"{package.__name__}.edges"
        if importlib.util.find_spec(name) is None:  # a package without converters
            return []
        edges: list[Any] = importlib.import_module(name).EDGES
        return edges

    def generation_targets(self) -> list[Any]:
        """What it writes for a generation task (``--task …-with-past``): the ``TARGETS`` of its
        package's ``generation`` module (``generation.targets.Target``s: how a model is exported
        with its cache, read back, described and stepped), imported when first asked for."""
        import importlib
        import importlib.util
        import sys

        package = sys.modules[type(self).__module__]
        if not hasattr(package, "__path__"):
            return []
        name = f"{package.__name__}.generation"
        if importlib.util.find_spec(name) is None:
            return []
        targets: list[Any] = importlib.import_module(name).TARGETS
        return targets

    def describe_part(self, path: Path) -> FileInfo:
        """Another file (a shard, a directory's weights) as the registry describes it: a format
        that describes its parts needs no import of the registry (which imports it)."""
        assert _REGISTRY_DESCRIBE, "the registry (ptconvert.formats) sets how parts are described"
        return _REGISTRY_DESCRIBE[0](path)

    def match(self, probe: Probe) -> str | None:
        """The layout name if ``probe`` is this format, else None. Must be cheap and safe."""
        raise NotImplementedError

    def info(self, path: Path, layout: str) -> FileInfo:
        raise NotImplementedError

    def open(self, path: Path, device: str = "cpu") -> Program:
        """Load a program (the caller has scanned it) as something to call on named inputs.
        ``device`` is where a runtime in its own process runs (in-process ones stay on the
        CPU, beside the eager reference)."""
        raise NotImplementedError(f"{self.name} files are not programs")

    def companions(self, path: Path) -> list[Path]:
        """Files beside ``path`` that a file of this format written there may come with (ONNX
        external data): checked as outputs are (never an input, replaced only with --force)."""
        return []

    def call_line(self, args: str) -> str:
        """How a user calls the loaded program on ``args`` (``x, mask`` or ``x=…, mask=…``)."""
        return f"prog({args})"

    @property
    def suffix(self) -> str:
        return self.output_suffix or (self.suffixes[0] if self.suffixes else f".{self.name}")

    # -- weights: what reading a file's tensors, checking them and writing them asks of a format

    # the converter graph's edge from this format to the weights stage: its label, its needs
    read_label: ClassVar[str] = "read tensors"
    # the step that reads them: "read_weights" (the file, symbolically) or "program_weights"
    # (a loaded program's state dict, also for a program the route wrote)
    read_step: ClassVar[str] = "read_weights"
    read_needs: ClassVar[tuple[str, ...]] = ()
    # and the one from the weights stage to it (a format whose weights ptconvert writes)
    write_label: ClassVar[str] = ""
    # a format that writes weights: whether it writes shards (--max-shard-size), and its file's
    # name in a folder the conversion writes (a Hugging Face directory's weights); a program's:
    # its name in the folder its client loads, beside the source directory's config.json and
    # tokenizer files (ONNX: optimum's model.onnx; output_naming.client_file), and that client
    writes_shards: ClassVar[bool] = False
    folder_file: ClassVar[str] = ""
    folder_client: ClassVar[str] = ""
    folder_load_line: ClassVar[str] = ""  # how that folder loads (``p``: the folder)
    # the independent reading (``reference``) builds no torch tensor: any dtype is compared
    # without torch knowing it
    reference_without_torch: ClassVar[bool] = False

    @property
    def reads_weights(self) -> bool:
        cls = type(self)
        return cls.read_weights is not Format.read_weights or (
            cls.weights_file is not Format.weights_file
        )

    @property
    def writes_weights(self) -> bool:
        return type(self).write_weights is not Format.write_weights

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        """Every tensor of a file of this format, named as its state dict names them; nothing
        executed. ``key``: the checkpoint entry to read (--key); ``skip_unsupported``: tensors a
        weights file cannot hold are left out and listed instead of refused."""
        raise UnsupportedConversionError(
            f"ptconvert cannot read the weights of {self.name} files", path=path
        )

    def weights_file(self, path: Path) -> Path | None:
        """The file this one's weights are read from when it is not ``path`` itself (a
        directory's weights file or shard index), read through the registry."""
        return None

    def output_is_directory(self, path: Path, layout: str) -> bool:
        """Whether its weights are written as a folder, with ``kept_files`` and the weight set's
        ``companions`` beside them (a Hugging Face directory)."""
        return False

    def kept_files(self, path: Path) -> list[Path]:
        """The source's files a folder written from it keeps (a directory's config and
        tokenizer: everything but its weights)."""
        return []

    def holds_dtype(self, dtype: str) -> bool:
        """Whether a file of this format written by ptconvert can hold tensors of ``dtype``."""
        return True

    def named_after(self, path: Path) -> Path:
        """What an output written from a file of this format is named after: itself, or the
        folder its parts lie in (a shard index)."""
        return path

    def loads_to_read(self, path: Path, layout: str) -> bool:
        """Whether reading the weights runs the format's own loader (a scan must clear the file
        first: the caller runs it)."""
        return False

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        """The file read again by another implementation than ``read_weights``, for the bitwise
        check. ``may_load()``: whether a program's own loader may run on it (the scan found it
        clean, or --trust); ``stack`` closes what the reading opened, after the comparison."""
        raise VerificationError(f"no independent reader for {self.name} sources", path=ws.origin)

    def write_weights(
        self,
        ws: WeightSet,
        out: Path,
        *,
        max_shard_size: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> list[Path]:
        """Write ``ws`` at ``out`` (a file, or a folder of shards); the files written."""
        raise UnsupportedConversionError(f"weights cannot be written as {self.name}", path=out)

    # -- scanning

    def holds_no_pickle(self, head: bytes, path: Path) -> bool:
        """Whether ``head`` (a file's first bytes) starts a data file of this format, which holds
        no pickle stream (the scanner still reads byte 0 as torch.load would). A header that
        claims the format but is broken raises InputError: the file is unreadable."""
        return False

    def scan_notes(self, path: Path) -> list[str]:
        """What ``ptconvert scan`` says about a file of this format beside its findings."""
        return []


def file_entry(path: Path) -> dict[str, Any]:
    return {"path": str(path), "size_bytes": path.stat().st_size}
