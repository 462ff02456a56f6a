"""House rules of issue 15 that a change could break silently: the modules' imports run one way, and no module
imports another's private name."""
import ast
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

def test_the_package_registers_every_transport():
    import tokenspeed_lit.host_mirror as hm
    assert {'slices', 'index', 'zero_copy', 'staged'} <= set(hm.TRANSPORTS)
    assert hm.ACCEL_TRANSPORT in hm.TRANSPORTS
