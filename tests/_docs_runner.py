"""Runs the documentation's Python blocks for tests/test_docs_examples.py, each in a process of its own.

Started once per test process. It imports the heavy modules (torch, repcap_fast, transformers,
matplotlib) once, runs nothing with them, then reads one request per line on stdin and forks a
child per block: the child is a fresh copy of this interpreter that runs the block as a script
(``__name__ == "__main__"``, ``sys.argv[0]`` its path, its folder first on ``sys.path``, the
request's working directory), with stdout and stderr in files, and exits with the block's status
through the normal interpreter exit (atexit handlers run). So each block sees exactly what a
fresh ``python block.py`` sees, less the 3-5 s import of torch. Blocks that start processes of
their own (``torch.multiprocessing.spawn``) work: runpy installs the block as ``__main__``, with
its ``__file__``, while it runs.

Protocol: a request is a JSON line ``{"script", "cwd", "stdout", "stderr", "timeout"}``; the answer
is a JSON line ``{"returncode"}`` (negative: killed by that signal; the timeout is SIGALRM).
"""

import importlib
import json
import os
import runpy
import signal
import sys
import traceback

PRELOAD = ("numpy", "torch", "scipy.stats", "matplotlib", "matplotlib.figure", "repcap_fast", "repcap_fast.models",
           "repcap_fast.report", "transformers")


def _run_block(req):
    """In the forked child: run one block as a script; returns its exit status."""
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.stdin = open(os.devnull)  # the block must not read our requests
    os.chdir(req["cwd"])
    sys.argv = [req["script"]]
    sys.path[0] = os.path.dirname(req["script"])
    signal.alarm(int(req["timeout"]))
    try:
        runpy.run_path(req["script"], run_name="__main__")
        return 0
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 -- reported as a script would report it
        traceback.print_exc()
        return 1


def main():
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # a block that needs it fails on its own import, with the real message
            pass
    requests = sys.stdin
    answers = sys.stdout
    for line in requests:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = _run_block(req)
            sys.stdout.flush()
            sys.stderr.flush()
            sys.exit(code)  # the normal exit of a script: atexit handlers, buffered output
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
