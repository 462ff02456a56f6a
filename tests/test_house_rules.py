"""House rules a change could break silently: the modules' imports run one way and the core (core, staging, tiers, l3)
imports nothing of the demo, no module imports another's private name, re-exports another's names, replaces another's
attributes at run time or changes the process environment when it is imported, the package's modules stay short and
the notebooks' exported cells short unless a cell is one class written whole, and the demo and L3 modules patch few
methods onto their classes.

Every rule walks the whole package (`rglob`): a module is named by its dotted path under the package (`l3.tier`,
`demo.models.llama`), and the notebooks are those of nbs/ and its folders."""
import ast, re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / 'tokenspeed_lit'
LIB = PKG.name
CORE = ('core', 'staging', 'tiers', 'l3')           # what an engine imports; the demo and its models build on it


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    "`{dotted name: path}` of every module of the package, in subpackages too (the generated index and `__init__`s aside)."
    out = {}
    for p in sorted(pkg.rglob('*.py')):
        if p.name in ('_modidx.py', '__init__.py'): continue
        out['.'.join(p.relative_to(pkg).with_suffix('').parts)] = p
    return out

MODS = _modules()


def _imports(path: Path, pkg: Path = PKG) -> list[tuple[str, list[str]]]:
    """(module, names) for every import of a package module in `path`, at any depth (lazy imports count too), the module
    as a dotted name under the package: relative imports resolved against `path`'s own package, and
    `from pkg import mod` counted as an import of module `pkg.mod`."""
    package = list(path.relative_to(pkg).parent.parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(package): continue
                base = package[:len(package) - (node.level - 1)] + (node.module.split('.') if node.module else [])
            elif node.module == LIB or (node.module or '').startswith(LIB + '.'):
                base = node.module.split('.')[1:]
            else: continue
            names = []
            for a in node.names:
                sub = base + [a.name]
                if (pkg.joinpath(*sub).with_suffix('.py')).exists() or pkg.joinpath(*sub).is_dir():
                    out.append(('.'.join(sub), []))                 # a module (or a package) imported by name
                else: names.append(a.name)
            if names: out.append(('.'.join(base), names))
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix(LIB + '.'), []) for a in node.names if a.name.startswith(LIB + '.')]
    return out


def test_the_import_reader_resolves_every_form(tmp_path):
    "Relative imports at every depth, absolute ones, and `from package import module` all name the module imported."
    pkg = tmp_path / LIB
    for m in ('core/contract', 'core/device', 'demo/models/llama', 'demo/requests', 'demo/models/hybrid'):
        (pkg / m).parent.mkdir(parents=True, exist_ok=True); (pkg / f'{m}.py').write_text('')
    (pkg / 'demo' / 'models' / 'hybrid.py').write_text(
        'from ...core.contract import check_int\nfrom ..requests import DemoConfig\nfrom . import llama\n'
        'from ...core import device as _d\nimport tokenspeed_lit.core.device\nfrom tokenspeed_lit.demo.requests import _x\n'
        'def f():\n    from tokenspeed_lit.core.contract import InputTypeError\nimport torch\nfrom fastcore.basics import patch\n')
    assert sorted(_imports(pkg / 'demo' / 'models' / 'hybrid.py', pkg)) == sorted([
        ('core.contract', ['check_int']), ('demo.requests', ['DemoConfig']), ('demo.models.llama', []),
        ('core.device', []), ('core.device', []), ('demo.requests', ['_x']), ('core.contract', ['InputTypeError'])])


def _graph() -> dict[str, set[str]]:
    return {m: {d for d, _ in _imports(p) if d in MODS and d != m} for m, p in MODS.items()}

def test_imports_form_no_circle():
    graph, state = _graph(), {}
    def visit(m, path):
        if state.get(m) == 'done': return
        assert state.get(m) != 'open', f'import circle: {" -> ".join(path + [m])}'
        state[m] = 'open'
        for d in sorted(graph[m]): visit(d, path + [m])
        state[m] = 'done'
    for m in sorted(graph): visit(m, [])

def test_the_modules_are_where_their_concepts_are():
    "Every module sits in a subpackage of its concept; the package's top level holds none."
    assert set(MODS) and all(m.split('.')[0] in CORE + ('demo',) for m in MODS), sorted(MODS)

def test_the_core_imports_nothing_from_the_demo():
    "The layers an engine imports (core, staging, tiers, l3) import nothing of `demo` (its models included), lazily or not."
    bad = [(m, d) for m, p in MODS.items() if m.split('.')[0] in CORE
           for d, _ in _imports(p) if d == 'demo' or d.startswith('demo.')]
    assert not bad, f'core modules importing the demo: {bad}'

def _fresh_process(code: str):
    "`code` run by a fresh interpreter (`python -c`): its completed process, output captured."
    import subprocess, sys
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)

def test_the_staging_layer_imports_without_the_demo_or_its_extras():
    "A fresh process that imports the staging layer an engine uses loads neither `transformers`, Mooncake nor the demo."
    out = _fresh_process('import sys, tokenspeed_lit.staging.input_buffers, tokenspeed_lit.tiers.host_mirror\n'
                         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'mooncake') "
                         "or m.startswith('tokenspeed_lit.demo')))")
    assert out.returncode == 0 and out.stdout.strip() == '[]', out.stdout + out.stderr[-2000:]

def test_no_private_names_across_modules():
    bad = [(m, mod, n) for m, p in MODS.items() for mod, names in _imports(p) for n in names
           if n.startswith('_') and not n.startswith('__')]
    assert not bad, f'modules importing private names of others: {bad}'


def _reexported(path: Path) -> list[str]:
    "The names an `__all__` or nbdev's `_all_` of `path` lists that the module imports rather than defines."
    tree = ast.parse(path.read_text())
    imported = {(a.asname or a.name).split('.')[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    listed = [e.value for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id in ('__all__', '_all_') for t in n.targets)
              and isinstance(n.value, (ast.List, ast.Tuple)) for e in n.value.elts if isinstance(e, ast.Constant)]
    return [n for n in listed if n in imported]

def test_no_module_reexports_another_modules_names():
    "A name is imported from the module that defines it: no module's `__all__` (or nbdev's `_all_`) lists an imported name."
    bad = {m: r for m, p in MODS.items() if (r := _reexported(p))}
    assert not bad, f'modules re-exporting names of others: {bad}'

def test_the_reexport_check_sees_it(tmp_path):
    p = tmp_path / 'm.py'
    p.write_text("from .store import OK, MISS\nimport numpy as np\n__all__ = ['L3Tier', 'OK']\n_all_ = ['MISS', 'np']\n"
                 "class L3Tier: pass\n")
    assert _reexported(p) == ['OK', 'MISS', 'np']


# What a module may change in the process environment when it is imported, and why: Triton reads TRITON_INTERPRET when a
# kernel is decorated, so on a machine without an accelerator `core.device` (which every kernel module imports first)
# defaults it to the interpreter before any kernel module imports triton. Nothing else: a setting a program needs
# (`HF_HUB_OFFLINE` for the demo's models) is set by that program (`demo.cli.main`, the Makefile), when it runs.
ENV_AT_IMPORT = {'core.device': {'TRITON_INTERPRET'}}

def _environ_changes_at_import(path: Path) -> list[tuple[int, str]]:
    "(line, variable or '?') of every change to `os.environ` the module's import runs: its top level and class bodies, not its functions."
    tree = ast.parse(path.read_text())
    def env(node):       # os.environ, or `environ` imported from os
        return (isinstance(node, ast.Attribute) and node.attr == 'environ' and isinstance(node.value, ast.Name)
                and node.value.id == 'os') or (isinstance(node, ast.Name) and node.id == 'environ')
    def key(node): return node.value if isinstance(node, ast.Constant) else '?'
    out, todo = [], list(tree.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)): continue
        todo += list(ast.iter_child_nodes(n))
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for t in (n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]):
                if isinstance(t, ast.Subscript) and env(t.value): out.append((n.lineno, key(t.slice)))
                if env(t): out.append((n.lineno, '?'))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            f = n.func
            if env(f.value) and f.attr in ('setdefault', 'update', 'pop', 'popitem', 'clear', '__setitem__', '__delitem__'):
                out.append((n.lineno, key(n.args[0]) if n.args and f.attr != 'update' else '?'))
            elif isinstance(f.value, ast.Name) and f.value.id == 'os' and f.attr in ('putenv', 'unsetenv'):
                out.append((n.lineno, key(n.args[0]) if n.args else '?'))
    return sorted(out)

def test_no_module_changes_the_environment_at_import():
    "Importing a module sets, changes or removes no environment variable (but the one `ENV_AT_IMPORT` names, and why)."
    bad = {m: ch for m, p in MODS.items() if (ch := [c for c in _environ_changes_at_import(p)
                                                     if c[1] not in ENV_AT_IMPORT.get(m, set())])}
    assert not bad, f'modules that change os.environ when imported (line, variable): {bad}'
    for m, names in ENV_AT_IMPORT.items():      # the exception is still needed, and still that one
        assert {v for _, v in _environ_changes_at_import(MODS[m])} == names, m

def test_the_environment_check_sees_each_way(tmp_path):
    p = tmp_path / 'm.py'
    p.write_text("import os\nfrom os import environ\nos.environ['A'] = '1'\nos.environ.setdefault('B', '1')\n"
                 "environ.update(C='1')\ndel os.environ['D']\nos.putenv('E', '1')\nif True: os.environ.pop('F')\n"
                 "class K:\n    os.environ['G'] = '1'\n"
                 "def f():\n    os.environ['H'] = '1'\nx = lambda: os.environ.setdefault('I', '1')\n"
                 "y = os.environ.get('J')\n")
    assert _environ_changes_at_import(p) == [(3, 'A'), (4, 'B'), (5, '?'), (6, 'D'), (7, 'E'), (8, 'F'), (10, 'G')]


def test_the_mirror_module_alone_knows_every_transport():
    "A fresh process that imports only host_mirror can make a mirror with each transport: nothing registers later."
    out = _fresh_process('import tokenspeed_lit.tiers.host_mirror as hm, tokenspeed_lit.tiers.host_transport as ht\n'
                         'assert hm.TRANSPORTS is ht.TRANSPORTS\n'
                         'print(sorted(hm.TRANSPORTS), ht.ACCEL_TRANSPORT in hm.TRANSPORTS)')
    assert out.stdout.split('\n')[0] == "['index', 'slices', 'staged', 'zero_copy'] True", out.stdout + out.stderr


def test_no_module_makes_names_through_globals():
    "A name a reader searches for is written where it is defined: no `globals()[...] = ...` in the package."
    bad = []
    for m, p in MODS.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Subscript) and isinstance(t.value, ast.Call)
                    and getattr(t.value.func, 'id', None) in ('globals', 'vars', 'locals') for t in node.targets):
                bad.append(f'{m}:{node.lineno}')
    assert not bad, f'names made through globals(): {bad}'


def test_no_module_reads_another_modules_private_attributes():
    "`obj._name` only where `_name` is defined in the same module (or `obj` is self/cls): a class's private state is its own."
    bad = []
    for m, p in MODS.items():
        tree = ast.parse(p.read_text())
        own = set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): own.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store): own.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store): own.add(n.attr)
            elif isinstance(n, ast.arg): own.add(n.arg)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith('_'): own.add(n.value)
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and n.attr.startswith('_') and not n.attr.startswith('__')
                    and not (isinstance(n.value, ast.Name) and n.value.id in ('self', 'cls', 'torch'))
                    and n.attr not in own and not (isinstance(n.value, ast.Attribute) and n.value.attr == '_C')):
                bad.append(f'{m}:{n.lineno} .{n.attr}')
    assert not bad, f'reaches into another module\'s private attributes: {bad}'


def test_the_step_header_is_declared_once():
    "No module lays the header out again: no `H_*` constants, no second list of its fields."
    import tokenspeed_lit.staging.step_plan as sp
    for m, p in MODS.items():
        src = p.read_text()
        assert not re.search(r'^H_[A-Z_]+ = ', src, re.M), f'{m} defines header constants'
        if m != 'staging.step_plan':
            assert "'s_extend_prefix'" not in src and "'o_input_ids'" not in src, f'{m} lists header fields'
    assert len(sp.STEP_HEADER.names) <= sp.STEP_HEADER.size


def test_no_benchmark_code_in_the_package():
    "The installed package holds what an engine imports: timing lives in bench/, and no module imports it."
    assert not list(PKG.rglob('benchmarking.py'))
    users = [m for m, p in MODS.items() for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, (ast.Import, ast.ImportFrom))
             and any((getattr(node, 'module', None) or a.name).split('.')[0] == 'bench' for a in node.names)]
    assert not users, f'package modules importing bench: {users}'


def test_notebook_numbers_follow_the_imports():
    "A module imports only modules whose notebooks come before its own: the notebooks read in import order (nbs/ and its folders)."
    import json, re
    nbs = Path(__file__).resolve().parent.parent / 'nbs'
    number = {}
    for nb in nbs.rglob('[0-9]*.ipynb'):
        for c in json.loads(nb.read_text())['cells']:
            m = re.match(r'#\|\s*default_exp\s+([\w.]+)', ''.join(c['source']))
            if m: number[m.group(1)] = int(nb.name.split('_')[0]); break
    assert set(number) == set(MODS), f'modules without a numbered notebook, or notebooks without a module: {set(number) ^ set(MODS)}'
    late = [(m, d) for m, deps in _graph().items() for d in deps if m in number and d in number and number[d] >= number[m]]
    assert not late, f'modules importing a module of a later (or the same) notebook: {late}'


# ---- size: short modules, short cells, few patched methods where classes grew by patching ----------------------------

ROOT = PKG.parent
MAX_MODULE_LINES, MAX_CELL_LINES, MAX_DEMO_L3_PATCHES = 600, 60, 30


def _exported_cells():
    "(notebook, cell id, source) of every exported code cell of the notebooks in nbs/ and bench/."
    import json
    for nb in sorted((ROOT / 'nbs').rglob('*.ipynb')) + sorted((ROOT / 'bench').glob('[0-9]*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] == 'code' and re.match(r'\s*#\|\s*exports?\b', src):
                yield nb, c.get('id'), src


def _one_class(src: str) -> bool:
    "Whether a cell's code is one class definition (its directives and comments aside): a concept written whole."
    body = ast.parse('\n'.join(l for l in src.splitlines() if not l.lstrip().startswith('#|'))).body
    return len(body) == 1 and isinstance(body[0], ast.ClassDef)


def test_no_exported_cell_is_over_60_lines():
    "A cell a reader takes in at once: every exported cell, directive included, is at most 60 lines, unless it is one class written whole (a class that is one concept is not cut into bases or patches for a line count)."
    long = [f'{nb.relative_to(ROOT)} cell {cid}: {len(src.splitlines())} lines'
            for nb, cid, src in _exported_cells() if len(src.splitlines()) > MAX_CELL_LINES and not _one_class(src)]
    assert not long, f'exported cells over {MAX_CELL_LINES} lines:\n' + '\n'.join(long)


def test_the_cell_rule_tells_a_class_from_a_long_cell():
    cls = '#| export\nclass A:\n' + '    x = 1\n' * 70
    assert _one_class(cls) and not _one_class(cls + 'y = 2\n') and not _one_class('#| export\n' + 'y = 2\n' * 70)


def test_no_module_is_over_600_lines():
    "A module a reader can hold: every module of the package (the generated index aside) is at most 600 lines."
    long = {m: n for m, p in MODS.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f'modules over {MAX_MODULE_LINES} lines: {long}'


def test_the_demo_and_l3_modules_patch_at_most_30_methods():
    """The demo's and the L3 tier's classes are written in their class bodies: `@patch` decorators there total at most 30
    (the demo's models aside, as before they moved into `demo.models`: the hybrid model's paged forward is patched on
    in 12 steps)."""
    counts = {m: len(re.findall(r'^@patch\b', p.read_text(), re.M)) for m, p in MODS.items()
              if m.split('.')[0] in ('demo', 'l3') and not m.startswith('demo.models.')}
    assert {'demo.cli', 'demo.scheduler', 'l3.tier'} <= set(counts), sorted(counts)
    assert sum(counts.values()) <= MAX_DEMO_L3_PATCHES, f'{sum(counts.values())} @patch decorators: {counts}'


# ---- no module replaces another's attributes at run time ----------------------------------------------------------

def _replaced_attributes(path: Path) -> list[str]:
    """Where `path` sets an attribute of something it did not define: `setattr(x, ...)` unless `x` is `self`, `cls`
    or a class of this module (the documented uses: `input_buffers` makes `InputBuffers`' read-only properties in a
    loop, `l3.keys` its own class's), `name.attr = ...` on a name imported from the package, or `@patch` onto a class
    of another module."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(PKG).as_posix() if path.is_relative_to(PKG) else path.name
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    imported = {a.asname or a.name.split('.')[0] for n in ast.walk(tree) for a in getattr(n, 'names', ())   # the package's
                if isinstance(n, ast.ImportFrom) and (n.level or (n.module or '').startswith('tokenspeed_lit'))
                or isinstance(n, ast.Import) and a.name.startswith('tokenspeed_lit')}
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == 'setattr' and n.args:
            target = ast.unparse(n.args[0])
            if target not in classes | {'self', 'cls'}: bad.append(f'{where}:{n.lineno} setattr({target}, ...)')
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported:
                    bad.append(f'{where}:{n.lineno} {ast.unparse(t)} = ...')
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.args.args and any(
                ast.unparse(d).split('(')[0] == 'patch' for d in n.decorator_list):
            ann = n.args.args[0].annotation
            owners = {ast.unparse(e) for e in (ann.elts if isinstance(ann, ast.Tuple) else [ann])} if ann else set()
            if owners - classes: bad.append(f'{where}:{n.lineno} @patch {n.name} onto {sorted(owners - classes)}')
    return bad


def test_no_module_replaces_another_modules_attributes():
    "A class's methods and a module's names are what their own module says: no module sets them from outside."
    bad = [b for p in MODS.values() for b in _replaced_attributes(p)]
    assert not bad, 'attributes of another module set at run time:\n' + '\n'.join(bad)


def test_the_replacement_check_sees_each_way(tmp_path):
    p = tmp_path / 'm.py'
    p.write_text('from fastcore.basics import patch\nfrom .graphs import Captured\nfrom . import contract as _c\n'
                 'class Own: pass\nsetattr(Own, "a", 1)\nsetattr(Captured, "replay", None)\n'
                 'Captured.replay = None\n_c.CHECK = True\n@patch\ndef f(self: Captured): pass\n'
                 '@patch\ndef g(self: Own): pass\n')
    assert sorted(b.split(' ', 1)[1] for b in _replaced_attributes(p)) == sorted([
        'setattr(Captured, ...)', 'Captured.replay = ...', '_c.CHECK = ...', "@patch f onto ['Captured']"])
