"""Which globals a pickle may import: the allowlist, and the names that grade a finding severe.

Safety is decided by the allowlist alone: a global is ``safe`` only when listed here (or passed
with ``--allow``). Everything else is ``needs-code`` (an importable class of user code) or
``dangerous``. The denylist below only grades severity and words the reason; it never clears a
name. Dotted names are judged component by component so that ``pathlib.os.system`` is ``os``.
"""

from __future__ import annotations

import sys
from _compat_pickle import IMPORT_MAPPING  # protocol 0-2 spell modules the Python 2 way
from collections.abc import Iterable

_DTYPE_NAMES = [
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "complex32",
    "complex64",
    "complex128",
    "bcomplex32",  # torch 2.14: complex of two bfloat16; no typed storage (UntypedStorage, v3)
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "qint8",
    "quint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "bits8",
    "bits16",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "half",
    "float",
    "double",
    "long",
    "int",
    "short",
]
_STORAGE_PREFIXES = [
    "Double",
    "Float",
    "Half",
    "BFloat16",
    "Long",
    "Int",
    "Short",
    "Char",
    "Byte",
    "Bool",
    "ComplexFloat",
    "ComplexDouble",
    "ComplexHalf",
    "UInt16",
    "UInt32",
    "UInt64",
    "QInt8",
    "QUInt8",
    "QInt32",
    "QUInt4x2",
    "QUInt2x4",
    "Float8_e4m3fn",
    "Float8_e5m2",
    "Float8_e4m3fnuz",
    "Float8_e5m2fnuz",
    "Float8_e8m0fnu",
]
_REBUILDS = [
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_nested_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy",
    "_rebuild_device_tensor_from_cpu_tensor",
]


def _safe_globals() -> frozenset[str]:
    names: set[str] = {
        # what torch.load(weights_only=True) accepts
        "collections.OrderedDict",
        "collections.Counter",
        "torch.nn.parameter.Parameter",
        "torch.Size",
        "torch.device",
        "torch.Tensor",
        "torch._tensor._rebuild_from_type_v2",
        "torch.serialization._get_layout",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
        "torch.per_tensor_affine",
        "torch.per_channel_affine",
        "torch.per_channel_affine_float_qparams",
        "torch.per_tensor_symmetric",
        "torch.per_channel_symmetric",
        "torch.strided",
        "torch.sparse_coo",
        "torch.sparse_csr",
        "torch.sparse_csc",
        "torch.sparse_bsr",
        "torch.sparse_bsc",
        "_codecs.encode",
        "builtins.set",
        "builtins.frozenset",
        "builtins.bytearray",
        "builtins.complex",
        "builtins.slice",
        "builtins.range",
        "builtins.list",
        "builtins.dict",
        "builtins.tuple",
        "builtins.int",
        "builtins.float",
        "builtins.str",
        "builtins.bytes",
        "builtins.bool",
        # TorchScript archives: helpers of torch's own restricted C++ unpickler
        "torch.jit._pickle.build_intlist",
        "torch.jit._pickle.build_floatlist",
        "torch.jit._pickle.build_boollist",
        "torch.jit._pickle.build_tensorlist",
        "torch.jit._pickle.build_doublelist",
        "torch.jit._pickle.restore_type_tag",
        "torch._utils._rebuild_tensor_v3",
        # harmless values real checkpoints carry
        "collections.defaultdict",
        "collections.deque",
        "argparse.Namespace",
        "datetime.datetime",
        "datetime.date",
        "datetime.time",
        "datetime.timedelta",
        "datetime.timezone",
        "pathlib.Path",
        "pathlib.PosixPath",
        "pathlib.WindowsPath",
        "pathlib.PurePath",
        "pathlib.PurePosixPath",
        "pathlib.PureWindowsPath",
        "numpy.ndarray",
        "numpy.dtype",
        "numpy.core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray._reconstruct",
        "numpy._core.multiarray.scalar",
        # protocol 5 pickles an array as its bytes: frombuffer(buf, dtype).reshape(shape, order)
        "numpy.core.numeric._frombuffer",
        "numpy._core.numeric._frombuffer",
        "copyreg._reconstructor",
        "builtins.object",
        "enum.Enum",
        "types.SimpleNamespace",
        "uuid.UUID",
        "decimal.Decimal",
        "fractions.Fraction",
    }
    names.update(f"torch._utils.{r}" for r in _REBUILDS)
    names.update(f"torch.{d}" for d in _DTYPE_NAMES)
    for prefix in _STORAGE_PREFIXES:
        for mod in ("torch", "torch.cuda"):
            names.add(f"{mod}.{prefix}Storage")
            names.add(f"{mod}.{prefix}Tensor")
            names.add(f"torch.sparse.{prefix}Tensor")
            names.add(f"torch.cuda.sparse.{prefix}Tensor")
    names.update(f"numpy.dtypes.{c}DType" for c in _NUMPY_DTYPE_CLASSES)
    names.update(f"numpy.{t}" for t in _NUMPY_SCALAR_TYPES)  # type objects in configs
    return frozenset(names)


_NUMPY_SCALAR_TYPES = [
    "bool",
    "bool_",
    "float16",
    "float32",
    "float64",
    "longdouble",
    "complex64",
    "complex128",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "intc",
    "uintc",
    "str_",
    "bytes_",
    "datetime64",
    "timedelta64",
]


_NUMPY_DTYPE_CLASSES = [
    "Float16",
    "Float32",
    "Float64",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Bool",
    "Complex64",
    "Complex128",
    "LongDouble",
]
SAFE_GLOBALS: frozenset[str] = _safe_globals()

# Activation functions that modules keep as attributes, so whole-module pickles hold them as
# values (TransformerEncoderLayer.activation is F.relu; transformers' GELUActivation keeps
# torch._C._nn.gelu). Pure tensor functions: kept where torch may call them, they do no harm.
# They stay needs-code (not on the allowlist): a trusted load allowlists them by name.
_F_ACTIVATIONS = [
    "relu",
    "relu6",
    "gelu",
    "silu",
    "mish",
    "elu",
    "selu",
    "celu",
    "glu",
    "leaky_relu",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "softplus",
    "softsign",
    "tanhshrink",
    "logsigmoid",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
]
_ATEN_NN_ACTIVATIONS = [
    "relu6",
    "gelu",
    "silu",
    "mish",
    "elu",
    "glu",
    "leaky_relu",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "softplus",
    "log_sigmoid",
]


PURE_FUNCTIONS: frozenset[str] = frozenset(
    [f"torch.nn.functional.{f}" for f in _F_ACTIVATIONS]
    + [f"torch._C._nn.{f}" for f in _ATEN_NN_ACTIVATIONS]
    + [f"torch.{f}" for f in ("relu", "sigmoid", "tanh")]
)
# Modules of tensor math only (losses, activations, initialisers): a function of theirs kept
# as a value (a hyperparameter, a module's attribute) is as harmless as the activations above.
_PURE_MODULES = ("torch.nn.functional.", "torch.nn.init.")


def is_pure_function(dotted: str) -> bool:
    """Whether a function kept as a value is tensor math (never a danger where it is kept)."""
    return dotted in PURE_FUNCTIONS or (
        dotted.startswith(_PURE_MODULES) and not dotted.rpartition(".")[2].startswith("_")
    )


TEXT_EVALUATING = (
    "sympy",
    "torch.utils._sympy",
    "mpmath",
    "numexpr",
    "pandas.core.computation",
    "pandas.eval",
    "jinja2",
    "mako",
    "chameleon",
    "genshi",
    "Cheetah",
    "numba",
    "Cython",
    "pyximport",
    "IPython",
    "sage",
)
# Modules whose every member can run code, touch files, processes or the network, or load
# another pickle. Matched against every prefix of a dotted name.
DANGEROUS_MODULES: frozenset[str] = frozenset(
    [
        "os",
        "posix",
        "nt",
        "subprocess",
        "sys",
        "runpy",
        "importlib",
        "pkgutil",
        "pickle",
        "_pickle",
        "marshal",
        "cPickle",
        "dill",
        "cloudpickle",
        "joblib",
        "shelve",
        "code",
        "codeop",
        "operator",
        "_operator",
        "functools",
        "ctypes",
        "_ctypes",
        "webbrowser",
        "pip",
        "ensurepip",
        "setuptools",
        "distutils",
        "socket",
        "ssl",
        "http",
        "urllib",
        "urllib2",
        "requests",
        "httpx",
        "ftplib",
        "smtplib",
        "telnetlib",
        "imaplib",
        "poplib",
        "asyncio",
        "multiprocessing",
        "concurrent",
        "threading",
        "_thread",
        "pty",
        "tty",
        "shutil",
        "tempfile",
        "io",
        "_io",
        "fileinput",
        "glob",
        "platform",
        "_posixsubprocess",
        "signal",
        "types",
        "inspect",
        "gc",
        "weakref",
        "builtins",
        "__builtin__",
        "_interpreters",
        "_xxsubinterpreters",
        "pydoc",
        "doctest",
        "idlelib",
        "lib2to3",
        "cProfile",
        "profile",
        "pdb",
        "bdb",
        "trace",
        "timeit",
        "venv",
        "zipimport",
        "uuid",
        "_osx_support",
        "_aix_support",
        "_pyrepl",
        "test",
        "sqlite3",
        "dbm",
        "logging",
        "xmlrpc",
        "numpy.f2py",
        "numpy.memmap",  # a class, but constructing it creates or truncates a file
        "numpy.core.memmap",
        "numpy._core.memmap",
        "numpy.lib.format.open_memmap",
        "numpy.testing",
        "numpy.distutils",
        "numpy.load",
        "numpy.lib.npyio",
        "torch.load",
        "torch.hub",
        "torch.jit",
        "torch.package",
        "torch.utils.collect_env",
        "torch.utils.bottleneck",
        "torch._dynamo",
        "torch._inductor",
        "torch.fx",
        "torch.utils.data",
        "torch.utils._config_module",
        "torch.serialization",
        "torch._export",
        "torch.export",
        "torch.compiler",
        "torch.ops",
        "torch._ops",
        "torch.cuda.memory",
        # native classes whose constructors open, write or serve files and sockets
        "torch.PyTorchFileWriter",
        "torch.PyTorchFileReader",
        "torch._C.PyTorchFileWriter",
        "torch._C.PyTorchFileReader",
        "torch.distributed",
        "torch.library",
        "torch.multiprocessing",
        "torch.utils.cpp_extension",
        "torch.utils.tensorboard",
        # libraries whose constructors evaluate, compile or template text as code: a class of
        # theirs rebuilt from a pickle's string runs it (sympy's sympify is eval)
        *TEXT_EVALUATING,
    ]
)

# Words for the reason shown with a dangerous finding, by module prefix.
REASONS: dict[str, str] = {
    "os": "runs shell commands and touches files",
    "posix": "runs shell commands and touches files",
    "nt": "runs shell commands and touches files",
    "subprocess": "starts processes",
    "builtins": "a builtin that can evaluate code, import modules or open files",
    "runpy": "runs Python modules",
    "importlib": "imports arbitrary modules",
    "pkgutil": "resolves any module attribute (pkgutil.resolve_name)",
    "pickle": "loads a nested pickle",
    "_pickle": "loads a nested pickle",
    "marshal": "loads code objects",
    "torch.load": "loads a nested pickle",
    "numpy.load": "loads a nested pickle",
    "operator": "attribute and item getters reach any object",
    "functools": "partial application hides the real callee",
    "code": "evaluates code",
    "webbrowser": "opens URLs",
    "pip": "installs packages",
    "ctypes": "calls native code",
    "socket": "opens network connections",
    "urllib": "opens network connections",
    "shutil": "copies and deletes files",
    "sys": "changes the interpreter",
    "types": "builds code and function objects",
    **{m: "its classes evaluate text as code when they are constructed" for m in TEXT_EVALUATING},
}


def _prefixes(dotted: str) -> Iterable[str]:
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def normalize(module: str) -> str:
    """The module Python 3's unpickler really imports (``__builtin__`` is ``builtins``)."""
    return IMPORT_MAPPING.get(module, module)


def denied_reason(module: str, name: str) -> str | None:
    """Why ``module.name`` can run code, when a known-dangerous module prefix matches."""
    module = normalize(module)
    dotted = f"{module}.{name}"
    for prefix in _prefixes(dotted):
        if prefix in DANGEROUS_MODULES:
            top = prefix if prefix in REASONS else prefix.split(".")[0]
            return REASONS.get(top, f"{prefix} can run code or touch the system")
    # A dotted attribute path reaches through one module into another (pathlib.os.system).
    for part in name.split(".")[:-1]:
        if part in DANGEROUS_MODULES:
            return REASONS.get(part, f"reaches {part} through an attribute path")
    return None


def danger_reason(module: str, name: str) -> str | None:
    """Why ``module.name`` can run code, or None when no known-dangerous prefix matches."""
    if (why := denied_reason(module, name)) is not None:
        return why
    module = normalize(module)
    if "__main__" in module.split(".")[1:]:
        return "a package's __main__ module: importing it runs the package's command line"
    if module.split(".")[0] in sys.stdlib_module_names:
        # not user code: a standard-library function or alias (tarfile.bltn_open is open)
        return "a standard-library name not on the allowlist (it may reach files or processes)"
    return None


# Classes of libraries whose modules are denied as a whole, that a file of theirs only
# instantiates: needs-code (the library must be importable to load it), with what they are.
LIBRARY_CLASSES: dict[str, str] = {
    "joblib.numpy_pickle.NumpyArrayWrapper": "joblib's array wrapper: a file for joblib.load",
}


def library_class(dotted: str) -> str | None:
    """What a known library's class is, for one that is not on the allowlist: joblib's
    wrapper, or a class of torch itself (a whole pickled ``nn.Module``: torch.load builds it only
    with weights_only=False). None: a class of user code. It names; ``classify`` judges."""
    if dotted in LIBRARY_CLASSES:
        return LIBRARY_CLASSES[dotted]
    module, _, name = dotted.rpartition(".")
    if module.split(".")[0] == "torch" and name[:1].isupper():
        return "a class of torch itself, which torch.load builds only with weights_only=False"
    return None


def classify(module: str, name: str, extra_allowed: frozenset[str] = frozenset()) -> str:
    """``safe``, ``needs-code`` or ``dangerous`` for one imported global, by name alone."""
    module = normalize(module)
    dotted = f"{module}.{name}"
    if dotted in SAFE_GLOBALS or dotted in extra_allowed:
        return "safe"
    if dotted in LIBRARY_CLASSES:
        return "needs-code"
    if danger_reason(module, name) is not None or name.startswith("__") or "." in name:
        return "dangerous"
    return "needs-code"
