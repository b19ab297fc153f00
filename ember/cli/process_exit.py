"""Ending an ``ember`` process without tearing down the modules it loaded.

With torch loaded, the interpreter's own teardown (freeing every module, then
libtorch's static destructors) takes about half a second after the program is
done. A shard, a trainer rank and every CLI command pay it on every exit, and
a test run starts hundreds of them. :func:`exit_finished_process` does what the
interpreter does first, in its order, and skips the rest:

1. wait for every non-daemon thread (``threading``'s own shutdown: executors
   are told to stop, then their workers are joined);
2. run the ``atexit`` callbacks (logging flushes and closes its handlers);
3. flush stdout and stderr, then C's stdio buffers (what native libraries
   printed);
4. ``os._exit`` with the status, or 120 when stdout could not be flushed (as
   the interpreter exits then: a full disk must not pass for success).

What is skipped: finalizers of objects still alive (``__del__``, weakref
callbacks outside atexit) and C ``atexit`` handlers and static destructors.
A file left open and unflushed would lose its buffered bytes, as in a crash;
Ember closes (and fsyncs where it matters) its own files before the program
returns. The usual exit is kept where something needs it: while a tracer or a
profiler is active (cProfile, coverage, a debugger stopped at a breakpoint; a
debugger that has let the program run on has removed its tracer), with
``EMBER_EXIT_TEARDOWN=1`` (read when the command starts: a value that is not a
boolean is refused before anything runs), or when this Python lacks the hooks
used for steps 1 and 2. A signal that arrives during steps 1-2 raises in the
caller as it would anywhere else.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from ember.env import env_value

# Set by a failed flush of stdout at exit, as CPython's own exit does.
_STDOUT_FLUSH_FAILED = 120


def system_exit_status(stop: SystemExit) -> int:
    """The status ``stop`` ends the process with, as the interpreter maps it; like the
    interpreter, prints a code that is not an int (a message) to stderr.

    Returns:
        0 for None; an int in the C ``long`` range modulo 256, any other int 255; 1 for
        anything else.
    """
    code = stop.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(2**63) <= code < 2**63 else 0xFF
    if sys.stderr is not None:
        print(code, file=sys.stderr)
    return 1


def teardown_asked() -> bool:
    """Whether ``EMBER_EXIT_TEARDOWN`` asks for the interpreter's usual exit.

    Raises:
        ValueError: a value that is not a boolean, naming the variable.
    """
    return env_value("EXIT_TEARDOWN", False)


def exit_finished_process(status: int, teardown: bool = False) -> NoReturn:
    """Exit with ``status`` once threads, ``atexit`` callbacks and the standard streams are
    done, skipping the teardown of loaded modules unless ``teardown`` or a tracer or
    profiler asks for it (see the module docstring)."""
    join_threads: Callable[[], None] | None = getattr(threading, "_shutdown", None)
    run_atexit: Callable[[], None] | None = getattr(atexit, "_run_exitfuncs", None)
    if teardown or join_threads is None or run_atexit is None or _traced():
        sys.exit(status)
    join_threads()
    run_atexit()
    if not _flushed(sys.stdout, "output"):
        status = _STDOUT_FLUSH_FAILED
    _flushed(sys.stderr, "error")
    if _C_FFLUSH is not None:
        _C_FFLUSH(None)
    os._exit(status)


def _traced() -> bool:
    """Whether a tracer or profiler is active (it may still have output to write at exit)."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)  # 3.12+: cProfile and coverage use it
    return monitoring is not None and any(
        monitoring.get_tool(tool) is not None for tool in range(6)
    )


def _flushed(stream: object, name: str) -> bool:
    """Flush standard ``name`` (``stream``); False, and a line on stderr where possible, when
    that fails. A stream that is None (its descriptor was closed at start-up) or closed is
    skipped, as the interpreter skips it."""
    try:
        if stream is None or stream.closed:  # type: ignore[attr-defined]
            return True
        stream.flush()  # type: ignore[attr-defined]
    except (OSError, ValueError) as error:  # ValueError: a detached stream
        if sys.stderr is not None:
            try:
                print(f"ember: could not write standard {name} at exit: {error}", file=sys.stderr)
            except (OSError, ValueError):
                pass
        return False
    return True


def _c_fflush() -> Callable[[None], int] | None:
    """C's ``fflush``, which flushes every C stdio stream when given NULL (None where this
    platform's C library cannot be opened this way)."""
    try:
        return ctypes.CDLL(None).fflush
    except (OSError, AttributeError, TypeError):
        return None


_C_FFLUSH = _c_fflush()
