"""exit_finished_process: threads, atexit and buffered output are finished; teardown is not.

Each case runs a small program in its own interpreter (torch is not loaded) and reads
what it printed: the exit is the last thing a process does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ember.cli.process_exit import exit_status

PRELUDE = (
    "import atexit, sys, threading\nfrom ember.cli.process_exit import exit_finished_process\n"
)


def run(program: str) -> subprocess.CompletedProcess[str]:
    """Run ``program`` after PRELUDE, its standard streams buffered as Python buffers pipes;
    what it printed and its status."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(program)],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def test_the_status_is_the_exit_status_and_buffered_output_and_atexit_callbacks_are_kept() -> None:
    done = run("""
        atexit.register(lambda: print("atexit ran"))
        sys.stdout.write("buffered, no newline; ")  # a pipe: block-buffered until flushed
        sys.stderr.write("to stderr")
        exit_finished_process(3)
    """)
    assert done.returncode == 3
    assert done.stdout == "buffered, no newline; atexit ran\n"
    assert done.stderr == "to stderr"


def test_a_non_daemon_thread_finishes_before_the_process_exits() -> None:
    # The thread blocks on stdin, which this side closes only after the process said it is
    # exiting: without the join, the process is gone before the thread can print.
    process = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent("""
            def finish():
                sys.stdin.read()
                print("thread done", flush=True)
            threading.Thread(target=finish).start()
            print("exiting", flush=True)
            exit_finished_process(0)
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline() == "exiting\n"
    process.stdin.close()
    assert process.stdout.read() == "thread done\n"
    assert process.wait(timeout=60) == 0


def test_an_executor_left_open_does_not_hold_the_exit_and_its_queued_work_runs() -> None:
    done = run("""
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(2)
        pool.submit(print, "queued work ran")
        exit_finished_process(0)
    """)
    assert (done.returncode, done.stdout) == (0, "queued work ran\n")


def test_loaded_modules_are_not_torn_down() -> None:
    done = run("""
        class Teardown:
            def __del__(self):
                print("torn down", flush=True)
        keep = Teardown()  # a module global: freed only by the interpreter's teardown
        exit_finished_process(0)
    """)
    assert (done.returncode, done.stdout) == (0, "")


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [(None, 0, ""), (0, 0, ""), (2, 2, ""), (256 + 7, 7, ""), (-1, 255, ""),
     ("ember ps: bad port", 1, "ember ps: bad port\n")],
)  # fmt: skip
def test_system_exit_codes_map_to_statuses_as_the_interpreter_maps_them(
    code: object, status: int, stderr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_status(code) == status
    assert capsys.readouterr().err == stderr
