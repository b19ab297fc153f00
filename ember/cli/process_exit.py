"""Ending an ``ember`` process without tearing down the modules it loaded.

With torch loaded, the interpreter's own teardown (freeing every module, then
libtorch's static destructors) takes about half a second after the program is
done. A shard, a trainer rank and every CLI command pay it on every exit, and
a test run starts hundreds of them. :func:`exit_finished_process` does what the
interpreter does first, in its order, and skips the rest:

1. wait for every non-daemon thread (``threading``'s own shutdown: executors
   are told to stop, then their workers are joined);
2. run the ``atexit`` callbacks (logging flushes and closes its handlers);
3. flush stdout and stderr;
4. ``os._exit`` with the status.

Files the program left open and unflushed would lose their buffered bytes, as
they would in a crash: Ember's own files are closed (and fsynced where it
matters) before the program returns.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_status(code: object) -> int:
    """The status a ``SystemExit(code)`` exits with, as the interpreter maps it: None is 0,
    an int is itself (mod 256), anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def exit_finished_process(status: int) -> NoReturn:
    """Exit with ``status`` once threads, ``atexit`` callbacks and the standard streams are
    done, skipping the teardown of loaded modules (see the module docstring)."""
    threading._shutdown()  # type: ignore[attr-defined]  # what interpreter exit runs first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written
            pass
    os._exit(status)
