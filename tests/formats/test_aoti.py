"""AOTInductor packages: detected and scanned as native code, loadable by torch's own loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fixtures.build import MLP_INPUT
from fixtures.models import MLP, seeded
from ptconvert import describe, detect


@pytest.mark.slow
def test_aoti_package_is_native_code(tmp_path: Path) -> None:
    model = seeded(MLP())
    ep = torch.export.export(model, MLP_INPUT)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "mlp.pt2"))
    assert detect(path).format == "aoti"  # not "pt2", though it is a PT2 archive too
    info = describe(path)
    assert info.native_code and all(n.endswith(".so") for n in info.native_code)
    assert info.metadata["models"] == ["model"]
    assert info.metadata["target"]["AOTI_DEVICE_KEY"] == "cpu"
    # the constants the library embeds, under the module's own names, read from the generated
    # source without loading it (the compiler may fold a small one into its kernels)
    state = {k: list(v.shape) for k, v in model.state_dict().items()}
    listed = {t.name: t.shape for t in info.largest}
    assert info.tensors is not None and 3 <= info.tensors <= len(state)
    assert listed and all(state[name] == shape for name, shape in listed.items())
    assert info.dtypes.keys() == {"float32"}
    assert info.inputs is not None and len(info.inputs) == 1
    assert info.outputs is not None and len(info.outputs) == 1
    from ptconvert.scan.scanner import scan_file

    scan = scan_file(path)  # the scanner reports the library as native code
    assert scan.verdict == "needs-code"
    assert any(f.member.endswith(".so") and "native code" in f.reason for f in scan.findings)
    from ptconvert.options import Options
    from ptconvert.verify.runtime import open_runtime

    isolated = open_runtime(path, Options(trust=True))  # in a spawned process
    torch.testing.assert_close(isolated.call(x=MLP_INPUT[0])[0], model(*MLP_INPUT))
    runner = torch._inductor.aoti_load_package(path)
    torch.testing.assert_close(runner(*MLP_INPUT), model(*MLP_INPUT))
