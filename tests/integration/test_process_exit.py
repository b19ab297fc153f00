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

from ember.cli.process_exit import system_exit_status, teardown_asked

PRELUDE = textwrap.dedent("""
    import atexit, ctypes, sys, threading
    from ember.cli.process_exit import exit_finished_process
    class Teardown:
        def __del__(self):
            print("torn down", flush=True)
    keep = Teardown()  # a module global: freed only by the interpreter's teardown
""")


def run(program: str, shell_suffix: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``program`` after PRELUDE (via bash, ``shell_suffix`` after the command), its
    standard streams buffered as Python buffers pipes; what it printed and its status."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    command = f'"{sys.executable}" -c "$PROGRAM" {shell_suffix}'
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False,
        env=environment | {"PROGRAM": PRELUDE + textwrap.dedent(program)},
    )  # fmt: skip


def test_the_status_buffered_output_and_atexit_callbacks_are_kept_and_teardown_skipped() -> None:
    done = run("""
        atexit.register(lambda: print("atexit ran"))
        sys.stdout.write("buffered, no newline; ")  # a pipe: block-buffered until flushed
        ctypes.CDLL(None).printf(b"from C stdio; ")  # C's own buffer, flushed apart
        sys.stderr.write("to stderr")
        exit_finished_process(3)
    """)
    assert done.returncode == 3
    assert done.stdout == "buffered, no newline; atexit ran\nfrom C stdio; "
    assert done.stderr == "to stderr"  # and no "torn down"


def test_a_non_daemon_thread_finishes_before_the_process_exits() -> None:
    # The thread blocks on stdin, which this side closes only after the process said it is
    # exiting: without the join, the process is gone before the thread can print.
    with subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent("""
            def finish():
                sys.stdin.read()
                print("thread done", flush=True)
            threading.Thread(target=finish).start()
            print("exiting", flush=True)
            exit_finished_process(0)
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        assert process.stdout.readline() == "exiting\n"
        out, _ = process.communicate(timeout=60)  # closes stdin
    assert (process.returncode, out) == (0, "thread done\n")


def test_an_executor_left_open_does_not_hold_the_exit_and_its_queued_work_runs() -> None:
    done = run("""
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(2)
        pool.submit(print, "queued work ran")
        exit_finished_process(0)
    """)
    assert (done.returncode, done.stdout) == (0, "queued work ran\n")


def test_output_that_cannot_be_written_fails_the_exit_as_the_interpreter_does() -> None:
    full = run('print("a report"); exit_finished_process(0)', "> /dev/full")
    assert full.returncode == 120
    assert "could not write standard output at exit" in full.stderr
    closed = run("exit_finished_process(4)", ">&-")  # sys.stdout is None
    assert (closed.returncode, closed.stderr) == (4, "")


@pytest.mark.parametrize(
    "program",
    [
        "sys.settrace(lambda *args: None)",
        "sys.setprofile(lambda *args: None)",
        "del threading._shutdown  # a Python without the hook",
        "del atexit._run_exitfuncs",
        "TEARDOWN = True",
    ],
    ids=["under-a-tracer", "under-a-profiler", "no-thread-hook", "no-atexit-hook", "asked-for"],
)
def test_the_usual_exit_runs_where_something_needs_it(program: str) -> None:
    done = run(
        "TEARDOWN = False\n" + program + "\ntry:\n    exit_finished_process(5, TEARDOWN)\n"
        "except SystemExit as stop:\n    print('the usual exit with', stop.code)"
    )  # fmt: skip
    assert done.stdout.startswith("the usual exit with 5\n")


def test_a_closed_stdout_is_skipped_as_the_interpreter_skips_it() -> None:
    done = run("sys.stdout.close(); exit_finished_process(6)")
    assert (done.returncode, done.stderr) == (6, "")


@pytest.mark.parametrize(
    ("value", "asked"), [("1", True), ("0", False), ("", False), ("maybe", None)]
)
def test_the_teardown_variable_is_a_boolean_and_anything_else_is_refused(
    value: str, asked: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_EXIT_TEARDOWN", value)
    if asked is None:
        with pytest.raises(ValueError, match="EMBER_EXIT_TEARDOWN"):
            teardown_asked()
    else:
        assert teardown_asked() is asked


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [(None, 0, ""), (0, 0, ""), (2, 2, ""), (256 + 7, 7, ""), (-1, 255, ""), (True, 1, ""),
     (False, 0, ""), (2**63, 255, ""), (-(2**63) - 1, 255, ""),
     ("ember ps: bad port", 1, "ember ps: bad port\n")],
)  # fmt: skip
def test_system_exit_codes_map_to_statuses_as_the_interpreter_maps_them(
    code: object, status: int, stderr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert system_exit_status(SystemExit(code)) == status
    assert capsys.readouterr().err == stderr
