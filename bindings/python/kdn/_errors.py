# SPDX-License-Identifier: Apache-2.0
"""kdn's exceptions: one class per status, under kdn.Error.

The classes also derive from the builtin exception that means the same in
Python, so code that knows nothing of kdn still catches them sensibly:
InvalidArgumentError is a ValueError, NotFoundError a LookupError,
TimeoutError the builtin TimeoutError, UnavailableError a ConnectionError,
NoMemoryError a MemoryError, UnsupportedError a NotImplementedError.

Two family bases group them by what the caller can do: CallerError (fix the
call: invalid argument, version, buffer too small) and RetryableError (try
again later: busy, unavailable, timeout).
"""
import builtins

from ._enums import Status

__all__ = [
    "Error", "CallerError", "RetryableError", "InvalidArgumentError", "ClosedError", "VersionError",
    "BufferTooSmallError", "NotFoundError", "BusyError", "UnavailableError", "TimeoutError", "CorruptError",
    "UnsupportedError", "NoMemoryError", "InternalError", "CancelledError",
]


class Error(Exception):
    """A kdn call failed.

    Attributes: ``status`` (a kdn.Status; an unknown code is kept as a
    pseudo-member), ``message`` (kdn's reason, for humans: never parse it).
    """

    status = Status.INTERNAL

    def __init__(self, message="", *, status=None):
        super().__init__(message)
        if status is not None:
            self.status = Status(status)

    @property
    def message(self):
        return self.args[0] if self.args else ""


class CallerError(Error):
    """The call was wrong: fix it before calling again."""


class RetryableError(Error):
    """Not now: the same call may succeed later."""


class InvalidArgumentError(CallerError, ValueError):
    """A bad value, size, count, buffer or handle (KDN_ERR_INVALID_ARGUMENT)."""
    status = Status.INVALID_ARGUMENT


class ClosedError(InvalidArgumentError):
    """A closed Runtime, Model or Op was used (the call never reached kdn)."""


class VersionError(CallerError):
    """A struct version this library cannot accept (KDN_ERR_VERSION)."""
    status = Status.VERSION


class BufferTooSmallError(CallerError):
    """An output buffer is too small; ``needed`` says how much is needed
    (for a knowledge fetch: the document's length in tokens)."""
    status = Status.BUFFER_TOO_SMALL

    def __init__(self, message="", *, status=None, needed=0):
        super().__init__(message, status=status)
        self.needed = needed


class NotFoundError(Error, LookupError):
    """A named object (a document) does not exist, or its KV is gone
    (KDN_ERR_NOT_FOUND). Never raised for a cache miss."""
    status = Status.NOT_FOUND


class BusyError(RetryableError):
    """Overloaded or full for now (KDN_ERR_BUSY)."""
    status = Status.BUSY


class UnavailableError(RetryableError, ConnectionError):
    """A remote peer is unreachable (KDN_ERR_UNAVAILABLE)."""
    status = Status.UNAVAILABLE


class TimeoutError(RetryableError, builtins.TimeoutError):
    """A wait ran out of time; the operation goes on (KDN_ERR_TIMEOUT)."""
    status = Status.TIMEOUT


class CorruptError(Error):
    """Stored or received bytes failed a check (KDN_ERR_CORRUPT)."""
    status = Status.CORRUPT


class UnsupportedError(Error, NotImplementedError):
    """Valid, but not supported by this build or version (KDN_ERR_UNSUPPORTED)."""
    status = Status.UNSUPPORTED


class NoMemoryError(Error, MemoryError):
    """Out of memory (KDN_ERR_NO_MEMORY)."""
    status = Status.NO_MEMORY


class InternalError(Error):
    """A bug in kdn (KDN_ERR_INTERNAL): please report it with the message."""
    status = Status.INTERNAL


class CancelledError(Error):
    """The operation was cancelled (KDN_ERR_CANCELLED): do not retry it."""
    status = Status.CANCELLED


_BY_STATUS = {
    cls.status: cls
    for cls in (InvalidArgumentError, VersionError, BufferTooSmallError, NotFoundError, BusyError,
                UnavailableError, TimeoutError, CorruptError, UnsupportedError, NoMemoryError, InternalError,
                CancelledError)
}


def _from_native(status, message, closed, needed):
    """The exception for a failed call (the extension raises what this returns)."""
    if closed:
        return ClosedError(message, status=status)
    cls = _BY_STATUS.get(status, Error)
    if cls is BufferTooSmallError:
        return cls(message, status=status, needed=needed)
    return cls(message, status=status)
