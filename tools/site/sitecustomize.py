"""Triton's CPU interpreter, without its repeated patching: loaded by every Python process `make` starts (the Makefile
puts this folder on PYTHONPATH), and active only where TRITON_INTERPRET=1, i.e. on a machine without a GPU.

With TRITON_INTERPRET=1 every launch of a kernel patches `triton.language` so that its builtins run on numpy arrays,
and restores it when the launch ends. It also patches it again at every call of a `@triton.jit` function from inside
a kernel (a helper such as `_decode_rows`, or `tl.sum`, `tl.zeros`, `tl.cumsum`, which are jit functions themselves),
and each of those patches walks every member of `triton.language`, `tl.tensor` and `tl.math` with `inspect.getmembers`
(about 1.4 ms on a 2-core CI machine). The package's kernels call such helpers: in a CPU run of the Llama demo, 433
launches patched `triton.language` 3,581 times. Inside a launch the modules are patched already, so a nested call
that needs no module beyond those patches nothing here; a nested call that does (the first `tl.core` function of a
launch) patches as Triton does, and its modules count as patched until the launch ends. Each thread keeps its own
count, so a launch on another thread patches for itself, as Triton does. The kernel tests then take about a quarter
less CPU time (tests/test_fused_decode.py and tests/test_positions.py: 36.3 s -> 27.7 s), and the numbers they compute
are the same: tests/test_interpreter_site.py runs a kernel with nested helpers both ways against its expected values.

Only what Triton exposes as `triton.runtime.interpreter._patch_lang` is wrapped, when that module is first imported;
a Triton without it is left as it is."""
import os, sys

if os.environ.get('TRITON_INTERPRET') == '1':
    import importlib.abc, importlib.util, threading

    def _skip_nested_patches(interpreter):
        "Wrap `interpreter._patch_lang`: inside a launch, patch only modules the launch has not patched yet."
        patch = getattr(interpreter, '_patch_lang', None)
        if patch is None: return
        import triton.language as tl
        mine = threading.local()                  # mine.langs: the modules patched by this thread's launch, or None

        def langs_of(fn) -> set:
            return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

        class _Nothing:
            def restore(self): pass
        nothing = _Nothing()                      # the scope of a nested call that patched nothing

        class _Launch:
            "The launch's own patch scope: restoring it ends the launch."
            def __init__(self, scope): self.scope = scope
            def restore(self):
                mine.langs = None
                self.scope.restore()

        def _patch_lang(fn):
            langs, need = getattr(mine, 'langs', None), langs_of(fn)
            if langs is not None and need <= langs: return nothing     # a nested call: patched already
            scope = patch(fn)
            if langs is not None:                    # a nested call needing another module: patched by Triton,
                langs |= need                        # which never restores a nested call's patches
                return scope
            mine.langs = need                        # a launch
            return _Launch(scope)

        interpreter._patch_lang = _patch_lang

    class _OnImport(importlib.abc.MetaPathFinder):
        "Wraps the interpreter's module right after it is first imported (importing Triton here would slow every process)."
        def find_spec(self, name, path, target=None):
            if name != 'triton.runtime.interpreter': return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None: return spec
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                _skip_nested_patches(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _OnImport())
