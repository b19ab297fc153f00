"""``ember ps`` that dies by SIGKILL in one phase of its next automatic checkpoint: run as
``python crashing_checkpoint_shard.py ARMED PHASE [ember ps flags]``. While the file ARMED
exists, the shard deletes it and kills itself on reaching PHASE:

* ``files``: the row files are written, the manifest is not;
* ``manifest``: the manifest is durable, the log does not name it as its base yet;
* ``base``: the log names it, the segments it covers are not deleted yet;
* ``prune``: old checkpoints are renamed for deletion, not deleted yet.

For the tests that a crash anywhere in an automatic checkpoint loses nothing."""

import os
import signal
import sys
from pathlib import Path

from ember.ps_server.durability import retention
from ember.ps_server.durability.checkpoint_format import Manifest
from ember.ps_server.durability.write_log import WriteLog

from ember.cli.main import main

armed, phase = Path(sys.argv[1]), sys.argv[2]
targets = {
    "files": (Manifest, "write"),
    "manifest": (WriteLog, "record_base"),
    "base": (WriteLog, "drop_segments_before"),
    "prune": (retention, "_delete"),
}
owner, name = targets[phase]
real = getattr(owner, name)


def crash_when_armed(*args, **kwargs):
    if armed.exists():
        armed.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)


setattr(owner, name, crash_when_armed)
sys.exit(main(["ps", *sys.argv[3:]]))
