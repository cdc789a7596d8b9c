"""One exception hierarchy for the whole tool.

Each class carries the CLI exit code it maps to (the table in docs/exit-codes.md) and a message
that names the file, says what is wrong and what to do next. The CLI prints ``str(error)`` (or its
JSON form) and exits with ``error.exit_code``; tracebacks only with ``--debug``.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, ClassVar

SUCCESS = 0  # the exit code of a command that did what it was asked


class PtconvertError(Exception):
    """Base of every error ptconvert raises on purpose."""

    exit_code: ClassVar[int] = 1
    kind: ClassVar[str] = "error"

    def __init__(
        self, message: str, *, path: str | Path | None = None, hint: str | None = None
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "kind": self.kind,
            "exit_code": self.exit_code,
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
        }


class UsageError(PtconvertError):
    """Bad command-line usage or bad arguments to an API call."""

    exit_code = 2
    kind = "usage"


class InputError(PtconvertError):
    """The input is missing, unreadable, truncated or corrupt."""

    exit_code = 3
    kind = "bad_input"


class EmptyFileError(InputError):
    kind = "empty_file"


class LfsPointerError(InputError):
    kind = "lfs_pointer"


class HtmlPageError(InputError):
    kind = "html_page"


class TruncatedFileError(InputError):
    kind = "truncated"


class CorruptFileError(InputError):
    kind = "corrupt"


class LoadTimeoutError(InputError):
    """Loading the file did not finish within --load-timeout (it was stopped)."""

    kind = "load_timeout"


class DecompressionLimitError(InputError):
    """A compressed member inflates far past its compressed size (a decompression bomb?)."""

    kind = "decompression_limit"


class NoWeightsError(InputError):
    kind = "no_weights"


class UnknownFormatError(InputError):
    kind = "unknown_format"


class HubModelNotFoundError(InputError):
    """A Hugging Face Hub id (``owner/name``) that is neither a local path nor in the Hub cache,
    and could not be downloaded (offline, or the Hub refused it): the message names the id, the
    revision and the cache searched (``ptconvert.hub``)."""

    kind = "hub_model_not_found"


class UnsupportedConversionError(PtconvertError):
    """No converter reaches the requested target, or the input holds something it cannot carry."""

    exit_code = 4
    kind = "unsupported"


class RuntimeDiedError(UnsupportedConversionError):
    """A runtime that runs in its own process (onnxruntime, AOTInductor) could not load the file
    or died: said at once, with what the runtime reported."""

    kind = "runtime_died"


class ModelDefinitionError(UnsupportedConversionError):
    """What defines the model does not fit the weights or cannot be read: config.json that is not
    a JSON object or names a model type transformers does not know, tensors whose shapes differ
    from the model's (each listed)."""

    kind = "model_definition"


class MissingRequirementError(PtconvertError):
    """Something the run needs is not there: an optional package, a model spec, a compiler."""

    exit_code = 5
    kind = "missing_requirement"


class CompatError(MissingRequirementError):
    """The installed torch or transformers lacks a private API that one of ptconvert's hooks
    (``ptconvert._compat``) relies on and the hook has no fallback: the message names the hook
    and the installed version (exit 5; ``python -m ptconvert._compat`` lists every hook)."""

    kind = "compat"


class MissingInputError(MissingRequirementError):
    """An argument the model's signature requires has no example input: every route needs it,
    so no other route is tried."""


class VerificationError(PtconvertError):
    """The converted artifact does not compute (or hold) the same numbers as its source."""

    exit_code = 6
    kind = "verification_failed"


class NotImplementedYetError(PtconvertError):
    """A command whose grammar exists but whose engine has not landed yet."""

    exit_code = 7
    kind = "not_implemented"


class OutputExistsError(PtconvertError):
    """The output already exists and ``--force`` was not given."""

    exit_code = 8
    kind = "output_exists"


class UnsafeInputError(PtconvertError):
    """The security scan found something that can run code: the file is refused."""

    exit_code = 10
    kind = "dangerous"


class NeedsTrustError(PtconvertError):
    """The file references user classes that must be imported to load it: needs ``--trust``."""

    exit_code = 11
    kind = "needs_code"


class ModelRaisedError(UnsupportedConversionError):
    """The model itself raised on the example inputs (an index out of range, a shape it rejects):
    not a bug of ptconvert, and not a difference between two artifacts."""

    kind = "model_error"


class CacheError(PtconvertError):
    """The cache directory cannot be used: owned by another user, writable by others, read-only,
    or on a read-only filesystem. Said before any work, with the ways out (permissions,
    PTCONVERT_CACHE, ``--no-cache``)."""

    exit_code = 12
    kind = "cache"


class FilesystemError(PtconvertError):
    """The machine, not the model: no space, a read-only filesystem, no permission, a folder
    that is missing or is a file, a symbolic link loop. The message names the user's path (the
    output, never a temporary file) and what the system said."""

    exit_code = 9
    kind = "filesystem"


class NoSpaceError(FilesystemError):
    kind = "no_space"


class ReadOnlyError(FilesystemError):
    kind = "read_only"


class PermissionDeniedError(FilesystemError):
    kind = "permission_denied"


class MissingFolderError(FilesystemError):
    kind = "missing_folder"


class NotAFolderError(FilesystemError):
    kind = "not_a_folder"


class SymlinkLoopError(FilesystemError):
    kind = "symlink_loop"


class OutOfMemoryError(PtconvertError):
    """The machine (or the process's memory limit) has too little memory for this input: not a
    corrupt file, and not a bug."""

    exit_code = 13
    kind = "out_of_memory"


class InternalError(PtconvertError):
    """A bug: an exception ptconvert did not raise on purpose (the CLI says so, and shows its
    traceback under ``--debug``). Never raised: its exit code and kind are the CLI's report."""

    exit_code = 1
    kind = "internal"


class Interrupted(PtconvertError):
    """The user interrupted the command (Ctrl-C): the shell's 128 + SIGINT, not one of
    ptconvert's codes (so not in EXIT_CODES)."""

    exit_code = 130
    kind = "interrupted"


# errno → (class, what it means for the path named)
_OS_ERRORS: dict[int, tuple[type[FilesystemError], str]] = {
    errno.ENOSPC: (NoSpaceError, "no space left on the device"),
    errno.EDQUOT: (NoSpaceError, "the disk quota is exceeded"),
    errno.EFBIG: (NoSpaceError, "the file is larger than this filesystem allows"),
    errno.EROFS: (ReadOnlyError, "the filesystem is read-only"),
    errno.EACCES: (PermissionDeniedError, "permission denied"),
    errno.EPERM: (PermissionDeniedError, "operation not permitted"),
    errno.ENOENT: (MissingFolderError, "the folder does not exist (removed while writing?)"),
    errno.ENOTDIR: (NotAFolderError, "a part of the path is a file, not a folder"),
    errno.EEXIST: (NotAFolderError, "a part of the path is a file, not a folder"),
    errno.ELOOP: (SymlinkLoopError, "a symbolic link loop (links that point at each other)"),
}
_HINTS = {
    NoSpaceError: "free space there, or write elsewhere with -o",
    ReadOnlyError: "write elsewhere with -o",
    PermissionDeniedError: "check the permissions, or write elsewhere with -o",
    MissingFolderError: "create the folder, or write elsewhere with -o",
    NotAFolderError: "choose an output path whose folders are folders",
    SymlinkLoopError: "remove or fix the link",
}


def named_error(exc: BaseException, path: str | Path | None = None) -> PtconvertError | None:
    """The named error for an environment failure (an ``OSError`` the system raised, a
    ``MemoryError``), naming ``path`` or else the file the system named; None for anything else
    (a bug stays a bug)."""
    if isinstance(exc, PtconvertError):
        return exc
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return OutOfMemoryError(
            "ran out of memory (the machine's, or this process's limit)",
            path=path,
            hint="free memory, raise the limit, or use a larger machine",
        )
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    where = path if path is not None else exc.filename
    cls, what = _OS_ERRORS.get(exc.errno, (FilesystemError, exc.strerror or str(exc)))
    if exc.errno == errno.ENOENT and path is None:
        what = "no such file or folder"
    return cls(what, path=where, hint=_HINTS.get(cls))


EXIT_CODES: dict[int, str] = {
    SUCCESS: "success",
    InternalError.exit_code: "internal error (a bug: please report it with --debug output)",
    UsageError.exit_code: "usage error (bad option or argument)",
    InputError.exit_code: "unreadable, truncated, corrupt or unrecognised input",
    UnsupportedConversionError.exit_code: "unsupported conversion or content, or a model "
    "definition that does not fit its weights",
    MissingRequirementError.exit_code: "missing requirement (optional package, model spec, …)",
    VerificationError.exit_code: "verification failed (outputs or weights differ)",
    NotImplementedYetError.exit_code: "not implemented yet",
    OutputExistsError.exit_code: "output exists (pass --force to replace it)",
    UnsafeInputError.exit_code: "refused by the security scan (dangerous)",
    NeedsTrustError.exit_code: "needs code: loading would import user classes (--trust), "
    "rebuild a class by its own code (--allow it), or run a folder's code (--trust-remote-code)",
    FilesystemError.exit_code: "the filesystem: no space, read-only, permission denied, a "
    "missing folder, a file where a folder should be, a symbolic link loop",
    CacheError.exit_code: "the cache directory cannot be used (another user's, writable by "
    "others, read-only)",
    OutOfMemoryError.exit_code: "out of memory (the machine's, or the process's limit)",
}
