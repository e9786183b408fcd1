"""``python -m tessera.dist.supervise --max-restarts 3 -- mpiexec -n 4 python train.py``: run a
job started from a shell again when it fails (a rank killed or crashed takes the whole MPI job
down), up to ``--max-restarts`` times; a ``ts.checkpoint`` loop in it resumes from its last
complete checkpoint, so the job goes on where it stopped. (``dist.launch`` does the same for a
function marked ``ts.fault_tolerant``.) Its exit code is the job's last."""
from __future__ import annotations

import argparse
import subprocess
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.dist.supervise",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--max-restarts", type=int, default=3, help="starts after the first")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command line")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or a.max_restarts < 0:
        ap.error("give a command after --, and --max-restarts of 0 or more")
    for attempt in range(a.max_restarts + 1):
        rc = subprocess.call(cmd)
        if rc == 0:
            return 0
        if attempt < a.max_restarts:
            print(f"tessera.dist.supervise: the job ended with exit code {rc}; starting it "
                  f"again (restart {attempt + 1} of {a.max_restarts})", file=sys.stderr,
                  flush=True)
    print(f"tessera.dist.supervise: the job failed {a.max_restarts + 1} times; giving up",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
