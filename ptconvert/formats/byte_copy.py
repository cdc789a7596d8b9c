"""Copying a file's bytes to another file's end, in the kernel where it can: the one copy
routine of every weights writer (safetensors, the torch zip).

``os.copy_file_range`` (no pass through Python memory), falling back to ``os.sendfile`` and then to
reads and writes in large blocks where the kernel cannot copy between the two filesystems.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from ptconvert.errors import TruncatedFileError

COPY_CHUNK = 1 << 30

# copy_file_range cannot copy here: another filesystem (EXDEV; before Linux 5.19 any two),
# one without it (ENOSYS, EOPNOTSUPP), a special file (EINVAL)
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
BLOCK = 8 << 20  # the read-write fallback's block


def copy_range(src_fd: int, offset: int, dst_fd: int, nbytes: int, source: Path) -> None:
    """Copy ``nbytes`` of ``source`` (open as ``src_fd``) from ``offset`` to the current end of
    ``dst_fd``: in the kernel, on any pair of filesystems."""
    copies = (_copy_file_range, _sendfile, _read_write)
    for i, copy in enumerate(copies):
        try:
            while nbytes > 0:
                n = copy(src_fd, offset, dst_fd, min(nbytes, COPY_CHUNK))
                if n == 0:
                    raise TruncatedFileError(
                        f"the file ended {nbytes} bytes early while its tensor bytes were "
                        "copied (was it changed meanwhile?)",
                        path=source,
                    )
                offset += n
                nbytes -= n
            return
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY or i == len(copies) - 1:
                raise


def _copy_file_range(src_fd: int, offset: int, dst_fd: int, count: int) -> int:
    return os.copy_file_range(src_fd, dst_fd, count, offset)


def _sendfile(src_fd: int, offset: int, dst_fd: int, count: int) -> int:
    return os.sendfile(dst_fd, src_fd, offset, count)


def _read_write(src_fd: int, offset: int, dst_fd: int, count: int) -> int:
    block = os.pread(src_fd, min(count, BLOCK), offset)
    view = memoryview(block)
    while view:
        view = view[os.write(dst_fd, view) :]
    return len(block)


def tensor_bytes(tensor: Any) -> memoryview:
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
