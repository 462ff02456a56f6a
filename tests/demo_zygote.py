"""A process that imports what a run of `python -m tokenspeed_lit.demo` imports (torch, triton, transformers' Llama and
Qwen3.5, the package's demo) once, then runs each demo it is asked for in a fork of itself (tests/demo_run.py).

On a 2-core CI machine a fresh interpreter spends 6-7 CPU-seconds importing those before a run does anything, and
`make test` starts about 30 demo runs: a fork starts with them imported. The run itself is the demo's own code, as
`python -m` runs it (`runpy`, `__main__` set, so its ranks' `spawn` finds the module by name); its ranks and its second
instance are still fresh processes of their own.

JSON lines on stdin: {"args": [...], "stdout": path, "stderr": path}; answers {"pid": pid} when the run starts, then
{"code": exit status} when it ends (a negative status: killed by that signal). Each run is a process group of its own,
so whoever asked can kill it whole at a timeout. Stdin closing ends the zygote; it dies with its parent.
"""
import ctypes, json, os, signal, sys


def _die_with_parent():
    try: ctypes.CDLL(None).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    except Exception: pass


def preload():
    "Import what a demo run imports; the number of threads this process has then (a fork copies only the caller's)."
    import importlib.metadata, runpy  # noqa: F401
    import torch, triton  # noqa: F401
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3_5TextConfig, Qwen3_5ForCausalLM, DynamicCache  # noqa: F401
    import transformers.models.qwen3_5.modeling_qwen3_5  # noqa: F401
    import tokenspeed_lit.demo.cli  # noqa: F401
    return len(os.listdir('/proc/self/task'))


def run_child(job) -> int:
    "In the fork: the demo's command line with `job`'s arguments, its output to `job`'s files; its exit status."
    import runpy, traceback
    os.setpgid(0, 0)
    for fd, path in ((1, job['stdout']), (2, job['stderr'])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.dup2(f, fd); os.close(f)
    null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
    sys.stdin = open(0, closefd=False)
    sys.stdout, sys.stderr = open(1, 'w', closefd=False), open(2, 'w', closefd=False)
    sys.argv = ['-m', *job['args']]
    try:
        runpy.run_module('tokenspeed_lit.demo', run_name='__main__', alter_sys=True)
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int): code = e.code or 0
        else: print(e.code, file=sys.stderr); code = 1
    except BaseException:
        traceback.print_exc(); code = 1
    sys.stdout.flush(); sys.stderr.flush()
    return code


def main():
    _die_with_parent()
    threads = preload()
    print(json.dumps(dict(ready=True, threads=threads)), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0: sys.exit(run_child(job))        # and the interpreter ends as `python -m` does: atexit, threads joined
        print(json.dumps(dict(pid=pid)), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps(dict(code=os.waitstatus_to_exitcode(status))), flush=True)


if __name__ == '__main__':
    main()
