"""House rules a change could break silently: the modules' imports run one way, no module imports another's private
name or replaces another's attributes at run time, the package's modules stay short and the notebooks' exported cells
short unless a cell is one class written whole, and the demo and L3 modules patch few methods onto their classes."""
import ast, re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / 'tokenspeed_lit'

def _imports(path: Path) -> list[tuple[str, list[str]]]:
    "(module, names) for every import of a package module in `path`, at any depth (lazy imports count too)."
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ''
            if node.level == 0 and not mod.startswith('tokenspeed_lit'): continue
            if node.level == 0 and mod == 'tokenspeed_lit':        # from tokenspeed_lit import host_transport
                out += [(a.name, []) for a in node.names]; continue
            name = mod.removeprefix('tokenspeed_lit.')
            if not name: out += [(a.name, []) for a in node.names]   # from . import x
            else: out.append((name, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix('tokenspeed_lit.'), []) for a in node.names if a.name.startswith('tokenspeed_lit.')]
    return out

def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in PKG.glob('*.py') if not p.stem.startswith('_')}
    return {m: {d for d, _ in _imports(PKG / f'{m}.py') if d in mods and d != m} for m in mods}

def test_imports_form_no_circle():
    graph, state = _graph(), {}
    def visit(m, path):
        if state.get(m) == 'done': return
        assert state.get(m) != 'open', f'import circle: {" -> ".join(path + [m])}'
        state[m] = 'open'
        for d in sorted(graph[m]): visit(d, path + [m])
        state[m] = 'done'
    for m in sorted(graph): visit(m, [])

def test_no_private_names_across_modules():
    bad = [(p.stem, mod, n) for p in PKG.glob('*.py') if p.stem != '_modidx'
           for mod, names in _imports(p) for n in names if n.startswith('_') and not n.startswith('__')]
    assert not bad, f'modules importing private names of others: {bad}'

def test_the_mirror_module_alone_knows_every_transport():
    "A fresh process that imports only host_mirror can make a mirror with each transport: nothing registers later."
    import subprocess, sys
    code = ('import tokenspeed_lit.host_mirror as hm, tokenspeed_lit.host_transport as ht\n'
            'assert hm.TRANSPORTS is ht.TRANSPORTS\n'
            'print(sorted(hm.TRANSPORTS), ht.ACCEL_TRANSPORT in hm.TRANSPORTS)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split('\n')[0] == "['index', 'slices', 'staged', 'zero_copy'] True", out.stdout + out.stderr


def test_no_module_makes_names_through_globals():
    "A name a reader searches for is written where it is defined: no `globals()[...] = ...` in the package."
    bad = []
    for p in PKG.glob('*.py'):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Subscript) and isinstance(t.value, ast.Call)
                    and getattr(t.value.func, 'id', None) in ('globals', 'vars', 'locals') for t in node.targets):
                bad.append(f'{p.name}:{node.lineno}')
    assert not bad, f'names made through globals(): {bad}'


def test_no_module_reads_another_modules_private_attributes():
    "`obj._name` only where `_name` is defined in the same module (or `obj` is self/cls): a class's private state is its own."
    bad = []
    for p in PKG.glob('*.py'):
        if p.stem == '_modidx': continue
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
                bad.append(f'{p.name}:{n.lineno} .{n.attr}')
    assert not bad, f'reaches into another module\'s private attributes: {bad}'


def test_the_step_header_is_declared_once():
    "No module lays the header out again: no `H_*` constants, no second list of its fields."
    import tokenspeed_lit.step_plan as sp
    for p in PKG.glob('*.py'):
        src = p.read_text()
        assert not re.search(r'^H_[A-Z_]+ = ', src, re.M), f'{p.name} defines header constants'
        if p.stem != 'step_plan':
            assert "'s_extend_prefix'" not in src and "'o_input_ids'" not in src, f'{p.name} lists header fields'
    assert len(sp.STEP_HEADER.names) <= sp.STEP_HEADER.size


def test_no_benchmark_code_in_the_package():
    "The installed package holds what an engine imports: timing lives in bench/, and no module imports it."
    assert not (PKG / 'benchmarking.py').exists()
    users = [p.name for p in PKG.glob('*.py') for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, (ast.Import, ast.ImportFrom))
             and any((getattr(node, 'module', None) or a.name).split('.')[0] == 'bench' for a in node.names)]
    assert not users, f'package modules importing bench: {users}'


def test_notebook_numbers_follow_the_imports():
    "A module imports only modules whose notebooks come before its own: the notebooks read in import order."
    import json, re
    nbs = Path(__file__).resolve().parent.parent / 'nbs'
    number = {}
    for nb in nbs.glob('[0-9]*.ipynb'):
        for c in json.loads(nb.read_text())['cells']:
            m = re.match(r'#\|\s*default_exp\s+(\w+)', ''.join(c['source']))
            if m: number[m.group(1)] = int(nb.name.split('_')[0]); break
    late = [(m, d) for m, deps in _graph().items() for d in deps if m in number and d in number and number[d] >= number[m]]
    assert not late, f'modules importing a module of a later (or the same) notebook: {late}'


# ---- size: short modules, short cells, few patched methods where classes grew by patching ----------------------------

ROOT = PKG.parent
MAX_MODULE_LINES, MAX_CELL_LINES, MAX_DEMO_L3_PATCHES = 600, 60, 30


def _exported_cells():
    "(notebook, cell id, source) of every exported code cell of the notebooks in nbs/ and bench/."
    import json
    for nb in sorted((ROOT / 'nbs').glob('*.ipynb')) + sorted((ROOT / 'bench').glob('[0-9]*.ipynb')):
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
    long = [f'{nb.parent.name}/{nb.name} cell {cid}: {len(src.splitlines())} lines'
            for nb, cid, src in _exported_cells() if len(src.splitlines()) > MAX_CELL_LINES and not _one_class(src)]
    assert not long, f'exported cells over {MAX_CELL_LINES} lines:\n' + '\n'.join(long)


def test_the_cell_rule_tells_a_class_from_a_long_cell():
    cls = '#| export\nclass A:\n' + '    x = 1\n' * 70
    assert _one_class(cls) and not _one_class(cls + 'y = 2\n') and not _one_class('#| export\n' + 'y = 2\n' * 70)


def test_no_module_is_over_600_lines():
    "A module a reader can hold: every module of the package (the generated index aside) is at most 600 lines."
    long = {p.name: n for p in PKG.glob('*.py') if p.stem != '_modidx'
            and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f'modules over {MAX_MODULE_LINES} lines: {long}'


def test_the_demo_and_l3_modules_patch_at_most_30_methods():
    "The demo's and the L3 tier's classes are written in their class bodies: `@patch` decorators there total at most 30."
    counts = {p.name: len(re.findall(r'^@patch\b', p.read_text(), re.M))
              for p in sorted(PKG.glob('demo*.py')) + sorted(PKG.glob('l3*.py'))}
    assert sum(counts.values()) <= MAX_DEMO_L3_PATCHES, f'{sum(counts.values())} @patch decorators: {counts}'


# ---- no module replaces another's attributes at run time ----------------------------------------------------------

def _replaced_attributes(path: Path) -> list[str]:
    """Where `path` sets an attribute of something it did not define: `setattr(x, ...)` unless `x` is `self`, `cls`
    or a class of this module (the documented uses: `input_buffers` makes `InputBuffers`' read-only properties in a
    loop, `l3_keys` its own class's), `name.attr = ...` on a name imported from the package, or `@patch` onto a class
    of another module."""
    tree = ast.parse(path.read_text())
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    imported = {a.asname or a.name.split('.')[0] for n in ast.walk(tree) for a in getattr(n, 'names', ())   # the package's
                if isinstance(n, ast.ImportFrom) and (n.level or (n.module or '').startswith('tokenspeed_lit'))
                or isinstance(n, ast.Import) and a.name.startswith('tokenspeed_lit')}
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == 'setattr' and n.args:
            target = ast.unparse(n.args[0])
            if target not in classes | {'self', 'cls'}: bad.append(f'{path.name}:{n.lineno} setattr({target}, ...)')
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported:
                    bad.append(f'{path.name}:{n.lineno} {ast.unparse(t)} = ...')
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.args.args and any(
                ast.unparse(d).split('(')[0] == 'patch' for d in n.decorator_list):
            ann = n.args.args[0].annotation
            owners = {ast.unparse(e) for e in (ann.elts if isinstance(ann, ast.Tuple) else [ann])} if ann else set()
            if owners - classes: bad.append(f'{path.name}:{n.lineno} @patch {n.name} onto {sorted(owners - classes)}')
    return bad


def test_no_module_replaces_another_modules_attributes():
    "A class's methods and a module's names are what their own module says: no module sets them from outside."
    bad = [b for p in sorted(PKG.glob('*.py')) if p.stem != '_modidx' for b in _replaced_attributes(p)]
    assert not bad, 'attributes of another module set at run time:\n' + '\n'.join(bad)


def test_the_replacement_check_sees_each_way(tmp_path):
    p = tmp_path / 'm.py'
    p.write_text('from fastcore.basics import patch\nfrom .graphs import Captured\nfrom . import contract as _c\n'
                 'class Own: pass\nsetattr(Own, "a", 1)\nsetattr(Captured, "replay", None)\n'
                 'Captured.replay = None\n_c.CHECK = True\n@patch\ndef f(self: Captured): pass\n'
                 '@patch\ndef g(self: Own): pass\n')
    assert sorted(b.split(' ', 1)[1] for b in _replaced_attributes(p)) == sorted([
        'setattr(Captured, ...)', 'Captured.replay = ...', '_c.CHECK = ...', "@patch f onto ['Captured']"])
