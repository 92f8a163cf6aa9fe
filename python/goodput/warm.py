"""A warm trainer interpreter: started by the node agent ahead of a restart with the job's imports
done, it waits for the restart's orders and then runs the trainer's script in itself, so that the
restart skips starting Python and importing torch.

    python3 -m goodput.warm [MODULE ...]      # the job's `preload` (torch by default)

It imports the modules, then reads one JSON line from standard input:

    {"argv": ["train.py", "--flag"], "env": {...}, "cwd": "/dir", "stdout": PATH, "stderr": PATH}

("argv" may also be ["-m", "package.module", ...]). It takes the environment and the output files,
then runs the script as `python3 SCRIPT ARGS` would (runpy, as __main__, sys.path[0] the script's
directory). Standard input closed before the orders come (the agent has gone, or chose a cold
start) ends it with nothing run.

One use only, and only clean: it refuses to run (exit 3) once anything it imported has started a
process group or touched CUDA, since neither can be undone in the process; the agent starts a new
one for the next restart.
"""

import importlib
import json
import os
import runpy
import sys
import traceback

REFUSED = 3  # the agent's sign that this interpreter was not fit to run the trainer


def _dirty():
    """Why this process can no longer be handed a trainer, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "a process group was initialised"
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "CUDA was initialised"
    return None


def _redirect(fd, path):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(target, fd)
    os.close(target)


def main(preload):
    for name in preload:
        importlib.import_module(name)
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # no orders: the agent started this trainer cold, or is gone
    order = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    sys.stderr.flush()
    _redirect(1, order["stdout"])
    _redirect(2, order["stderr"])
    why = _dirty()
    if why:
        sys.stderr.write(f"goodput.warm: this interpreter cannot run the trainer: {why}\n")
        return REFUSED
    os.environ.clear()
    os.environ.update(order["env"])
    if order.get("cwd"):
        os.chdir(order["cwd"])
    argv = order["argv"]
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1]] + argv[2:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except SystemExit:
        raise
    except BaseException:  # as the interpreter reports an uncaught exception: traceback, exit 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
