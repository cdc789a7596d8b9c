"""Private torch/transformers APIs are touched only through ptconvert/_compat's declared hooks:
a source scan finds no other module that reads ``torch._*``/``transformers.*._*``, imports a
private module of theirs, or patches their attributes; each hook's probe passes on the installed
versions; a failing probe gives the hook's declared fallback or its named error; a patch acts
only for the threads inside it and is put back by the last to leave."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ptconvert import _compat
from ptconvert._compat import HOOKS
from ptconvert.errors import CompatError

PACKAGE = Path(__file__).parent.parent / "ptconvert"

# where the scan does not look, each with why:
# - _compat/: the one place that may.
# - pickles/: the symbolic pickle reader compares a pickle's global names against torch's rebuild
#   functions (``torch._utils._rebuild_tensor_v2`` …: data, as strings) and keys its checked
#   callables by those functions' ids; tests/test_layers.py forbids it to import ptconvert
#   modules outside pickles/, so it cannot import _compat.
EXEMPT = ("_compat/", "pickles/")
# private names of the standard library a module may use
STDLIB = {("os", "_exit"), ("sys", "_getframe")}
ROOTS = ("torch", "transformers")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _findings(source: str) -> list[tuple[int, str]]:
    """(line, what) of each touch of a private torch/transformers API or patch of their
    attributes in ``source``."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    theirs: set[str] = set()  # local names bound to torch's or transformers' modules/objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ROOTS:
                    theirs.add(alias.asname or top)
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in ROOTS:
                continue
            for alias in node.names:
                theirs.add(alias.asname or alias.name)
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(_private(p) for p in parts):
                found.append((node.lineno, f"from {node.module} import ..."))
    own = {  # the nodes where ``self``/``cls`` is the method's own first parameter
        id(inner): fn.args.args[0].arg
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and fn.args.args
        for inner in ast.walk(fn)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node.value)
            name = root.id if isinstance(root, ast.Name) else None
            if name in ("self", "cls") and own.get(id(node)) == name:
                continue
            if (name, node.attr) in STDLIB:
                continue
            found.append((node.lineno, f"reads {ast.unparse(node)[:60]}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1:
                key = node.args[1]
                if isinstance(key, ast.Constant) and _private(str(key.value)):
                    found.append((node.lineno, f"{node.func.id}(…, {key.value!r})"))
            if node.func.id in ("setattr", "delattr") and node.args:
                root = _root(node.args[0])
                if isinstance(root, ast.Name) and root.id in theirs:
                    found.append((node.lineno, f"patches {ast.unparse(node.args[0])}"))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute | ast.Subscript):
                    root = _root(target)
                    if isinstance(root, ast.Name) and root.id in theirs:
                        found.append((node.lineno, f"patches {ast.unparse(target)[:60]}"))
    return found


def test_no_module_outside_compat_touches_private_torch_or_transformers() -> None:
    found = {
        f"{rel}:{line}": what
        for path in sorted(PACKAGE.rglob("*.py"))
        if not (rel := path.relative_to(PACKAGE).as_posix()).startswith(EXEMPT)
        for line, what in _findings(path.read_text())
    }
    assert not found, found


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = torch._inductor.aoti_load_package",
        "from torch._export.converter import TS2EPConverter",
        "from torch.utils import _pytree",
        "from torch.onnx._internal.exporter import _registration",
        "x = ep._guards_code",
        "x = getattr(config, '_attn_implementation', 'eager')",
        "from torch.export import pt2_archive\npt2_archive.writer = None",
        "import transformers\nsetattr(transformers.AutoModel, 'x', 1)",
        "from transformers import CompileConfig\nCompileConfig.mode = 'x'",
        "def f(config):\n    cls = pick(config)\n    return cls._from_config(config)\n",
    ],
)
def test_the_scan_sees_each_kind_of_touch(source: str) -> None:
    assert _findings(source)


def test_the_scan_lets_public_use_and_own_privates_through() -> None:
    assert not _findings(
        "import os, torch\nfrom ptconvert import _compat\n"
        "class A:\n    def f(self):\n        return self._x\n"
        "    @classmethod\n    def g(cls):\n        return cls._y\n"
        "x = torch.export.export\nos._exit(0)\n_compat.torch_api.pytree()\n"
        "m = torch.nn.Linear(1, 1)\nm.weight = None\n"
    )


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_each_probe_passes_on_the_installed_versions(name: str) -> None:
    hook = HOOKS[name]
    assert _compat.probe(name), f"{name}: {hook.what} (tested on {hook.tested})"
    assert hook.what and hook.tested and hook.package in ("torch", "transformers")
    assert (hook.apply is not None) == hook.what.startswith("patches"), hook.what


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make hook ``name``'s probe fail, as on a torch that no longer has what it relies on."""

    def fail(name: str) -> None:
        monkeypatch.setitem(HOOKS, name, dataclasses.replace(HOOKS[name], probe=lambda: False))

    return fail


@pytest.mark.parametrize("name", sorted(n for n, h in HOOKS.items() if h.fallback is None))
def test_a_failed_probe_without_fallback_is_a_named_error(name: str, failing: Any) -> None:
    failing(name)
    with pytest.raises(CompatError) as caught:
        _compat.available(name)
    version = _compat.registry.installed(HOOKS[name].package)
    assert name in caught.value.message and version in caught.value.message
    assert caught.value.exit_code == 5 and caught.value.kind == "compat"


def test_failed_probes_without_fallback_stop_their_callers(failing: Any) -> None:
    for name in ("pytree", "ts2ep_converter", "aoti_compile", "hf_static_cache_layers"):
        failing(name)
    with pytest.raises(CompatError, match="'pytree'"):
        _compat.torch_api.pytree()
    with pytest.raises(CompatError, match="'ts2ep_converter'"):
        _compat.torch_api.ts2ep_converter()
    with pytest.raises(CompatError, match="'aoti_compile'"):
        _compat.inductor.compile_and_package(None)
    with pytest.raises(CompatError, match="'hf_static_cache_layers'"):
        _compat.hf.static_cache_pointer()


@pytest.mark.parametrize("name", ["pt2_archive_writer", "onnx_shared_registry"])
def test_a_patch_whose_probe_fails_leaves_torch_as_it_is(name: str, failing: Any) -> None:
    from torch.export.pt2_archive import _package
    from torch.onnx._internal.exporter import _registration

    def torchs() -> tuple[Any, ...]:
        return (
            _package._get_raw_tensor_bytes,
            _package.PT2ArchiveWriter.write_bytes,
            _registration.ONNXRegistry.__dict__["from_torchlib"],
        )

    before = torchs()
    failing(name)
    with _compat.patched(name, registries={}) as used:
        assert used == {name: False}
        assert torchs() == before


def test_failed_probes_with_fallback_give_the_declared_fallback(failing: Any) -> None:
    import torch

    for name, hook in HOOKS.items():
        if hook.fallback is not None and hook.apply is None:
            failing(name)
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    assert _compat.torch_api.guards_code(ep) is None
    assert _compat.torch_api.draft_report(ep) is None
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    assert _compat.torch_api.jit_attributes(scripted) == {}
    t = torch.zeros(2)
    assert _compat.torch_api.tensor_version(t) != _compat.torch_api.tensor_version(t)
    owner, module = torch.nn.Linear(2, 2), torch.nn.Module()
    owner.register_buffer("b", torch.ones(1))
    _compat.torch_api.adopt_children(module, owner)
    assert dict(module.named_parameters()) == dict(owner.named_parameters())
    assert dict(module.named_buffers()) == dict(owner.named_buffers())

    class Model:
        def __init__(self, config: Any) -> None:
            self.config = config

    assert _compat.hf.auto_model_mapping(object()) is None
    assert _compat.hf.from_config(Model, "cfg").config == "cfg"
    assert _compat.hf.keys_to_ignore(object()) == []
    assert _compat.hf.attn_implementation(object()) == "eager"
    assert _compat.hf.compile_on_every_device(object()) is False
    assert _compat.hf.default_logging_level(object()) == 30


def test_a_patch_acts_only_for_the_threads_inside_it_and_is_put_back_by_the_last() -> None:
    import torch
    from torch.export.pt2_archive import _package

    original = _package._get_raw_tensor_bytes
    tensor = torch.arange(4.0)
    inside, leave = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def other() -> None:
        with _compat.patched("pt2_archive_writer"):
            seen["other"] = _package._get_raw_tensor_bytes(tensor)
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(30)
    # patched for the other thread only: this one gets torch's bytes
    assert _package._get_raw_tensor_bytes is not original
    assert isinstance(_package._get_raw_tensor_bytes(tensor), bytes)
    assert not isinstance(seen["other"], bytes)
    with _compat.patched("pt2_archive_writer"):
        assert not isinstance(_package._get_raw_tensor_bytes(tensor), bytes)
    assert _package._get_raw_tensor_bytes is not original  # the other thread is still inside
    leave.set()
    thread.join(30)
    assert _package._get_raw_tensor_bytes is original


def test_the_status_command_lists_every_hook() -> None:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "ptconvert._compat"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in HOOKS:
        assert f"{name}: probe OK" in done.stdout
    assert f"{len(HOOKS)} of {len(HOOKS)} hooks' probes pass" in done.stdout


def test_importing_the_hooks_imports_neither_torch_nor_transformers() -> None:
    code = "import sys, ptconvert._compat; print(*(m in sys.modules for m in ROOTS))"
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    code = f"ROOTS = {ROOTS!r}; {code}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["False", "False"], done.stderr
