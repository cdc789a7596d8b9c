"""A fresh interpreter that loads a written program as its user does (the format's
``fresh_load_line``), started before the file exists so that importing torch is hidden behind
the conversion, and run once on the example's inputs: the check's last word on a program
written in this process's own runtime (an isolated runtime's process is ``formats/isolated``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ptconvert.errors import VerificationError
from ptconvert.formats import FORMATS_BY_NAME


class FreshLoad:
    """A new interpreter with only the format's runtime imported, that loads a written file as
    a user does. It starts at once and imports torch while the caller goes on; ``load`` hands it
    the file (and, with ``run``, inputs to run the program on); ``finish`` collects its verdict
    and the outputs it computed. A program whose output spec needs another package's pytree
    registrations fails there (a copy of such a program is loaded as ptconvert loads it)."""

    def __init__(self, to: str, *, torch_only: bool = True) -> None:
        import os
        import subprocess
        import sys

        fmt = FORMATS_BY_NAME[to]
        self.to = to
        self._load = fmt.fresh_load_line or fmt.load_line
        if not torch_only:
            self._load = (
                "from pathlib import Path\nfrom ptconvert.formats import FORMATS_BY_NAME\n"
                f"FORMATS_BY_NAME[{to!r}].open(Path(p)).close()"
            )
        self._runs = False
        self._dir = Path(tempfile.mkdtemp(prefix="ptconvert-fresh-"))
        self._log: Any = None
        self._proc: Any = None
        # its threads: a quarter of this process's, which may not have imported torch yet (it
        # then has torch's default, and so has the interpreter, which works it out the same way)
        self._threads = _own_threads() if "torch" in sys.modules else None
        threads = self._threads or "max(1, torch.get_num_threads() // 4)"
        env = dict(os.environ)
        if self._threads is not None:
            env["OMP_NUM_THREADS"] = str(self._threads)
        # what the format's load imports, imported before the file exists; the rest of its code
        # comes on stdin once it does
        warm = ""
        if fmt.warm_line:
            warm = f"try:\n    {fmt.warm_line}\nexcept ImportError:\n    pass\n"
        # it dies with this process (no load left running if ptconvert is killed); once its
        # verdict is written it ends at once: an interpreter that imported torch takes
        # 0.5-0.7 s to tear itself down, time the caller would wait for nothing
        code = (
            f"import os, sys\nfrom ptconvert.spawn import die_with_parent\n"
            f"die_with_parent({os.getpid()})\n"
            f"import torch\ntorch.set_num_threads({threads})\n{warm}"
            "exec(compile(sys.stdin.read(), '<the file, loaded>', 'exec'))\n"
            "sys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n"
        )
        try:
            # its messages go to a file: a pipe nobody reads while the comparison runs fills
            self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by finish/stop)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                text=True,
                env=env,
            )
        except BaseException:
            self.stop()
            raise

    @property
    def threads(self) -> int:
        if self._threads is None:
            self._threads = _own_threads()
        return self._threads

    def load(
        self,
        artifact: Path,
        *,
        run: dict[str, Any] | None = None,
        positional: list[str] | None = None,
    ) -> None:
        """Hand the interpreter ``artifact`` to load (and run on ``run``)."""
        import torch

        code = f"p = {str(artifact)!r}\n{self._load}\n"
        if run is not None:
            # tensors and Python scalars alike, read back with weights_only=True
            torch.save(dict(run), self._dir / "in")
            call = (
                f"prog(*[feeds[n] for n in {positional!r}])"
                if positional is not None
                else "prog(**feeds)"
            )
            code += _RUN_ONCE.format(dir=str(self._dir), call=call)
            self._runs = True
        try:
            self._proc.stdin.write(code)
            self._proc.stdin.close()
        except BrokenPipeError:  # it ended already: finish says why
            pass

    @contextmanager
    def sharing_cores(self) -> Iterator[None]:
        """This process computes on the cores the interpreter leaves free while it runs (two
        pools of threads on one set of cores slow each other down many times over), and on all
        of them again from the first size compared after it has ended."""
        import torch

        from ptconvert.verify.parity import between_sizes

        before = torch.get_num_threads()
        torch.set_num_threads(max(1, before - self.threads))

        def once_ended() -> None:
            if self._proc.poll() is not None:
                torch.set_num_threads(before)

        try:
            with between_sizes(once_ended):
                yield
        finally:
            torch.set_num_threads(before)

    def finish(self, src: Path) -> tuple[Any, ...] | None:
        """Its verdict (a load that failed: VerificationError naming ``src``, the conversion's
        source) and the outputs it computed, if it ran the program."""
        import torch

        self._proc.wait()
        self._log.seek(0)
        stderr = self._log.read()
        if self._proc.returncode != 0:
            last = (stderr.strip().splitlines() or ["?"])[-1]
            raise VerificationError(
                f"the written {self.to} does not load in a fresh Python process: {last[:300]}",
                path=src,
            )
        if not self._runs:
            return None
        return tuple(torch.load(self._dir / "out", weights_only=True))

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _own_threads() -> int:
    """The fresh interpreter's threads: a quarter of this process's, at least one."""
    import torch

    return max(1, torch.get_num_threads() // 4)


# what the fresh process runs after loading: the example's inputs in, every output tensor out
_RUN_ONCE = """
from ptconvert._compat.torch_api import pytree
tree_leaves = pytree().tree_leaves
feeds = torch.load("{dir}/in", weights_only=True)
with torch.no_grad():
    out = {call}
if hasattr(out, "to_tuple"):
    out = out.to_tuple()
torch.save([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], "{dir}/out")
"""
