"""GGUF, llama.cpp's format, as a weights source: detection, ``info`` and ``scan`` from the
header alone (``gguf_file``), and its weights.

Where transformers loads the file's architecture from GGUF, the weights are the Hugging Face
directory that loading amounts to: config.json as transformers builds the config from the
metadata (``AutoConfig.from_pretrained(folder, gguf_file=…)``), and the tensors under the names
and with the processing transformers applies (``get_gguf_hf_weights_map`` on the model class,
its ``TENSOR_PROCESSORS``: llama's q/k reverse permutation, gemma's norms, …). Nothing of that is
derived here: each tensor goes through transformers' own processor; one it hands back untouched
stays a byte range of the file, one it changes is taken as transformers computes it (from
``gguf.quants.dequantize``'s float32), kept in the file's half type where that holds the values
exactly; the check reads the file again with transformers' own ``load_gguf_checkpoint``.
Elsewhere (an architecture transformers does not map, transformers missing) the tensors keep the
GGUF's own names (``gguf_file.plain_weights``), checked against gguf's ``GGUFReader``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert import _compat
from ptconvert.deps import require
from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.base import FileInfo, Format, Probe, Quantization, file_entry
from ptconvert.formats.gguf import rope
from ptconvert.formats.gguf_file import (
    FILE_TYPES,
    GGML_TYPES,
    MAGIC,
    GgufHeader,
    GgufTensor,
    LongArray,
    gguf_reader_reference,
    header_of,
    plain_weights,
    summary,
)

if TYPE_CHECKING:
    from ptconvert.formats.reference import Reference
    from ptconvert.formats.weightset import WeightSet


class GgufFormat(Format):
    name = "gguf"
    packages = ("gguf",)
    extra = "gguf"
    suffixes = (".gguf",)
    holds = (
        "weights (name → tensor, quantized blocks too) and typed metadata (architecture, "
        "tokenizer, chat template); no code"
    )
    priority = 10
    # a target too: a Hugging Face decoder written by its edges/, --dtype's precision or
    # --quantize q8_0, q4_0, q4_1, q5_0, q5_1 (llama.cpp's blocks the gguf package quantizes;
    # its k-quants it only dequantizes)
    quantize_schemes = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
    # the independent reading of a file under its own names is the gguf package's reader over
    # numpy arrays: no torch (a file transformers maps is read by transformers, which has it)
    reference_without_torch = True

    def match(self, probe: Probe) -> str | None:
        head = probe.head
        if len(head) < 8 or head[:4] != MAGIC:
            return None
        version = int.from_bytes(head[4:8], "little")
        return f"v{version}" if version < 256 else "big-endian"

    def info(self, path: Path, layout: str) -> FileInfo:
        header = header_of(path)
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        info.add_tensors(
            ((t.name, t.label, list(t.shape), t.numel) for t in header.tensors),
            nbytes={t.name: t.nbytes for t in header.tensors},  # blocks: scales with the values
        )
        meta = header.metadata
        info.metadata = {
            "GGUF.version": header.version,
            "GGUF.tensor_count": len(header.tensors),
            "GGUF.kv_count": len(meta),
            **{k: str(v) if isinstance(v, LongArray) else v for k, v in meta.items()},
        }
        file_type = meta.get("general.file_type")
        words = [f"GGUF v{header.version}", f"architecture {header.architecture or '?'}"]
        if "general.name" in meta:
            words.append(f"name {meta['general.name']!r}")
        if file_type is not None:
            words.append(f"file type {FILE_TYPES.get(file_type, file_type)}")
        info.notes.append(", ".join(words))
        quantized = Counter(t.type_name for t in header.quantized)
        if quantized:
            info.quantized = Quantization(weights=dict(sorted(quantized.items())))
            n = sum(quantized.values())
            info.notes.append(
                f"{n} quantized tensor{'s' if n != 1 else ''} ({summary(quantized)}): a "
                "conversion dequantizes them into float32 with the gguf package (the gguf extra)"
            )
        return info

    def holds_no_pickle(self, head: bytes, path: Path) -> bool:
        if head[:4] != MAGIC:
            return False
        with contextlib.suppress(UnsupportedConversionError):  # big-endian, v1: still GGUF
            header_of(path)  # a broken header: unreadable (InputError)
        return True

    def scan_notes(self, path: Path) -> list[str]:
        notes = [
            "a GGUF file (llama.cpp's format): tensors and typed metadata, it holds no pickle "
            "and loading it imports nothing; its bytes were still read as the pickle torch.load "
            "would find at byte 0"
        ]
        try:
            header = header_of(path)
        except UnsupportedConversionError as exc:
            return [*notes, exc.message]
        if "tokenizer.chat_template" in header.metadata:
            notes.append(
                "it holds a chat template (tokenizer.chat_template, Jinja): runtimes that apply "
                "it render it as code of their template engine; ptconvert never renders it"
            )
        return notes

    def refuse_source(self, src: Path) -> None:
        """A Hugging Face directory (the one source written as GGUF) whose family llama.cpp's
        architectures or whose tokenizer its vocabulary cannot hold is refused, named."""
        config = src / "config.json"
        if not (src.is_dir() and config.is_file()):
            return
        from ptconvert.formats.gguf.families import family_of
        from ptconvert.formats.gguf.tokenizer import vocabulary

        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # the directory's own reading says what is wrong with it
        _, hyper = family_of(data, str(src))
        vocabulary(src, hyper.vocab)

    def output_is_directory(self, path: Path, layout: str) -> bool:
        """A file transformers loads from GGUF is written as the Hugging Face directory that
        loading amounts to (config.json beside the weights)."""
        return hf_architecture(path, header_of(path))[0] is not None

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        """Under transformers' names where it loads the architecture from GGUF, else under the
        GGUF's own (a note says why)."""
        if key is not None:
            raise UnsupportedConversionError(
                "--key picks an entry of a checkpoint; a GGUF file has none", path=path
            )
        header = header_of(path)
        arch, why = hf_architecture(path, header)
        if arch is not None:
            return hf_weights(path, header, arch, skip_unsupported)
        ws = plain_weights(path, header, skip_unsupported)
        ws.notes.insert(0, f"tensors under the GGUF's own names: {why}")
        return ws

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        """transformers' own GGUF loading for a directory it maps (its config.json), else the
        gguf package's GGUFReader."""
        assert ws.origin is not None
        if "config.json" in ws.companions:
            return hf_reference(ws)
        return gguf_reader_reference(ws.origin)


@dataclass(frozen=True)
class Plan:
    """What transformers makes of the file: its config dict (tensor processors read it), the
    config object and the model class whose parameter names the tensors take."""

    architecture: str
    raw_config: dict[str, Any]
    config: Any
    model_class: Any


def hf_architecture(path: Path, header: GgufHeader) -> tuple[str | None, str]:
    """(the architecture transformers maps, "") or (None, why the GGUF's own names are kept)."""
    plan = _plan(path, header)
    return (plan.architecture, "") if isinstance(plan, Plan) else (None, plan)


def _plan(path: Path, header: GgufHeader) -> Plan | str:
    st = path.stat()
    return _cached_plan(path.resolve(), (st.st_size, st.st_mtime_ns), header.architecture)


@functools.lru_cache(maxsize=4)
def _cached_plan(path: Path, stamp: tuple[int, int], arch: str) -> Plan | str:
    if not arch:
        return "the file names no general.architecture"
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (the hf extra): its GGUF names are not known"
    if importlib.util.find_spec("gguf") is None:
        return "transformers reads GGUF metadata with the gguf package (the gguf extra)"
    if not _maybe_mapped(arch):
        return f"transformers has no GGUF mapping for architecture {arch!r}"
    with _quiet():
        from transformers import AutoConfig
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        try:  # transformers 5: a few architectures load through conversion ops instead
            from transformers.integrations.gguf import is_gguf_arch_supported

            converted = is_gguf_arch_supported(arch)
        except ImportError:
            converted = False
        if converted:
            return (
                f"transformers loads {arch} GGUF files through its weight conversion ops, which "
                "ptconvert does not replay"
            )
        try:
            raw = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
            config = AutoConfig.from_pretrained(
                str(path.parent), gguf_file=path.name, trust_remote_code=False
            )
        except (ValueError, KeyError, NotImplementedError) as exc:
            return f"transformers does not load architecture {arch!r} from GGUF ({exc})"
    model_class = _model_class(config)
    if model_class is None:
        return f"transformers has no model class for {type(config).__name__}"
    return Plan(arch, raw, config, model_class)


def _maybe_mapped(arch: str) -> bool:
    """Whether transformers may map ``arch``: a name of its GGUF config mapping is in it, or it
    in one, punctuation aside (its loader's renames: qwen2moe, gpt-oss, t5encoder, …). A cheap
    first look (no torch import); transformers' own loader decides."""
    try:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    except ImportError:
        return True

    def bare(name: str) -> str:
        return "".join(c for c in name.lower() if c.isalnum())

    mine = bare(arch)
    known = [bare(k) for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")]
    return any(k in mine or mine in k for k in known if k)


def _model_class(config: Any) -> Any:
    """The class a user loads it with: the config's own architecture, else the first auto
    class (causal LM, seq2seq LM, base model) that has one for this config."""
    import transformers

    for name in getattr(config, "architectures", None) or []:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    for auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModel"):
        mapping = _compat.hf.auto_model_mapping(getattr(transformers, auto))
        if mapping is not None and type(config) in mapping:
            return mapping[type(config)]
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' GGUF reader draws a tqdm bar on stderr and warns; neither is ours to show."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _meta_model(plan: Plan) -> Any:
    import torch

    with torch.device("meta"), _quiet():
        return plan.model_class(plan.config)


def hf_weights(path: Path, header: GgufHeader, arch: str, skip_unsupported: bool) -> WeightSet:
    """The tensors under transformers' names, processed as it loads them; config.json (and the
    tokenizer transformers builds from the file) as companions."""
    import numpy as np
    import torch
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    from ptconvert.formats.weightset import ByteRange, WeightEntry, WeightSet

    plan = _plan(path, header)
    assert isinstance(plan, Plan)
    gguf = require("gguf")
    rope_note = _carry_rope(path, header, plan)  # a scaling refused before any tensor is read
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=dict(plan.raw_config))
    key_map = get_gguf_hf_weights_map(_meta_model(plan), processor)
    parsed: dict[str, dict[str, Any]] = {"tensors": {}}
    entries: list[WeightEntry] = []
    skipped: dict[str, str] = {}
    dropped: list[str] = []
    copied, changed, deq = 0, 0, Counter[str]()
    for t in header.tensors:
        if t.dtype:  # the processor given the bytes as they are: untouched, they are copied
            view = _raw(path, t, np, plain=True)
            got = _process(processor, view, t.name, key_map, {"tensors": {}})
            if got.name is not None and got.weights is view:
                if got.name not in key_map:
                    dropped.append(t.name)
                    continue
                source = ByteRange(path, t.offset)
                entries.append(WeightEntry(key_map[got.name], t.dtype, t.shape, t.nbytes, source))
                copied += 1
                continue
        try:  # as transformers loads it: gguf's dequantize, then the processor
            weights = gguf.quants.dequantize(
                _raw(path, t, np, plain=False), gguf.GGMLQuantizationType(t.ggml_type)
            )
        except NotImplementedError as exc:
            if not skip_unsupported:
                raise UnsupportedConversionError(
                    f"tensor {t.name!r}: the gguf package cannot dequantize {t.type_name} ({exc})",
                    path=path,
                    hint="pass --skip-unsupported to leave it out (it is then reported)",
                ) from None
            skipped[t.name] = f"{t.type_name}: the gguf package cannot dequantize it"
            continue
        if not t.dtype:
            deq[t.type_name] += 1
        got = _process(processor, weights, t.name, key_map, parsed)
        if got.weights is not weights or got.name is None:
            changed += 1
        if got.name is None:  # the processor placed it itself (experts, a renamed head)
            continue
        if got.name not in key_map:
            dropped.append(t.name)
            continue
        tensor = _narrowed(torch.from_numpy(np.copy(got.weights)), t.dtype, torch)
        entries.append(_tensor_entry(key_map[got.name], tensor, WeightEntry))
    entries += [_tensor_entry(n, v, WeightEntry) for n, v in parsed["tensors"].items()]
    if rope_note:
        dropped = [n for n in dropped if n != rope.FREQS]
    companions, tokenizer_note = _companions(path, plan)
    ws = WeightSet(
        entries, "torch" if len(entries) > copied else "fast", skipped=skipped,
        companions=companions,
    )  # fmt: skip
    ws.notes.append(
        f"names mapped for architecture {arch} as transformers loads the GGUF "
        f"({plan.model_class.__name__}, {type(processor).__name__}); config.json from its "
        "metadata"
    )
    ws.notes.append(f"{copied} tensors copied as byte ranges of the file")
    if deq:
        ws.notes.append(
            f"dequantized {sum(deq.values())} tensors of types {summary(deq)} into float32 "
            "(gguf.quants.dequantize)"
        )
    if changed:
        ws.notes.append(f"{changed} tensors processed as transformers processes them")
    if dropped:
        ws.notes.append(
            f"{len(dropped)} tensors left out, as transformers leaves them out "
            f"({plan.model_class.__name__} has no parameter for them): {dropped[:10]}"
        )
    if rope_note:
        ws.notes.append(rope_note)
    if tokenizer_note:
        ws.notes.append(tokenizer_note)
    return ws


def _carry_rope(path: Path, header: GgufHeader, plan: Plan) -> str:
    """The file's rope scaling into the config (``rope.rope_of_file``), its rope tensors read
    as transformers would read any tensor (``gguf.quants.dequantize``)."""
    import numpy as np

    gguf = require("gguf")
    found = {}
    for t in header.tensors:
        if t.name in rope.ROPE_TENSORS:
            raw = _raw(path, t, np, plain=False)
            values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.ggml_type))
            found[t.name] = values.reshape(-1).tolist()
    return rope.rope_of_file(path, header.metadata, found, plan.config)


def _raw(path: Path, t: GgufTensor, np: Any, *, plain: bool) -> Any:
    """The tensor's bytes mapped: in its own dtype (``plain``, bfloat16 as uint16 bits) in torch
    order, or as GGUFReader hands them to dequantize (rows of uint8 for blocks and bfloat16)."""
    if plain and t.dtype:
        dtype = "uint16" if t.dtype == "bfloat16" else t.dtype
        return np.memmap(path, dtype=dtype, mode="r", offset=t.offset, shape=t.shape or (1,))
    _, block, type_size, dtype = GGML_TYPES[t.ggml_type]
    if dtype and dtype != "bfloat16":
        return np.fromfile(path, dtype=dtype, count=t.numel, offset=t.offset).reshape(t.shape)
    row = t.shape[-1] // block * type_size if t.shape else t.nbytes
    data = np.fromfile(path, dtype=np.uint8, count=t.nbytes, offset=t.offset)
    return data.reshape((*t.shape[:-1], row))


def _process(processor: Any, weights: Any, name: str, key_map: Any, parsed: Any) -> Any:
    import numpy as np

    with np.errstate(all="ignore"), _quiet():
        return processor.process(
            weights=weights, name=name, tensor_key_mapping=key_map, parsed_parameters=parsed
        )


def _narrowed(tensor: Any, dtype: str, torch: Any) -> Any:
    """A float32 tensor in the file's half type when that holds every value exactly."""
    if dtype not in ("float16", "bfloat16") or tensor.dtype != torch.float32:
        return tensor
    half = tensor.to(getattr(torch, dtype))
    same = torch.equal(half.to(torch.float32).view(torch.int32), tensor.view(torch.int32))
    return half if same else tensor


def _tensor_entry(name: str, tensor: Any, entry: Any) -> Any:
    tensor = tensor.contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    return entry(
        name, dtype, tuple(tensor.shape), tensor.numel() * tensor.element_size(), None, tensor
    )


def _companions(path: Path, plan: Plan) -> tuple[dict[str, bytes], str]:
    """config.json (the model class named, in the dtype transformers loads the GGUF in), and the
    tokenizer files transformers builds from the file's vocabulary where it can."""
    import torch

    config = plan.config
    config.architectures = [plan.model_class.__name__]
    config.dtype = str(torch.get_default_dtype()).removeprefix("torch.")
    files = {"config.json": config.to_json_string().encode()}
    try:
        from transformers import AutoTokenizer

        with _quiet(), tempfile.TemporaryDirectory() as tmp:
            tok = AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name, trust_remote_code=False
            )
            tok.save_pretrained(tmp)
            files |= {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    except Exception as exc:  # transformers' tokenizer builders raise anything
        return files, f"no tokenizer files: transformers could not build one ({exc})"[:300]
    return files, ""


def hf_reference(ws: WeightSet) -> Reference:
    """transformers' own ``load_gguf_checkpoint`` (GGUFReader, dequantize, its processors and
    names) for the class config.json names; a float32 tensor the output keeps in a half type is
    compared in that type only where the half type holds it exactly."""
    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from ptconvert.formats.reference import Reference, torch_ref

    path = ws.origin
    assert path is not None
    declared = json.loads(ws.companions["config.json"])
    with _quiet():
        config = AutoConfig.from_pretrained(
            str(path.parent), gguf_file=path.name, trust_remote_code=False
        )
        cls = getattr(transformers, declared["architectures"][0])
        with torch.device("meta"):
            model = cls(config)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    wanted = {e.name: e.dtype for e in ws.entries}
    refs = {}
    for name, t in tensors["tensors"].items():
        refs[name] = torch_ref(_narrowed(t, wanted.get(name, ""), torch))
    return Reference("transformers' load_gguf_checkpoint (gguf.GGUFReader)", refs)
