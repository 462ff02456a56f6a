"""The documentation site from the notebooks, offline: nbdev's processing, then Sphinx + myst-nb.

    python tools/build_docs.py            # (what `make docs` runs) -> docs/_site/index.html

nbdev renders its sites with Quarto, which cannot be installed on a machine without access to its binary
downloads. This script keeps nbdev's half of the work and hands the result to Sphinx:

1. **nbdev processing** (what `nbdev_proc_nbs` does, into `_proc/`): frontmatter from the title cell, hidden and
   `#| export` cells dropped, a `show_doc` cell after every exported definition, `show_doc` cells executed (so
   the API entries carry the exported signatures and docstrings), backticked names linked to their entries.
   Where it differs from `nbdev_proc_nbs`, on purpose:
   - it does not try to install Quarto (with no `sudo`, nbdev's attempt ends in a `pip install -e .` into
     whatever `pip` is first on PATH: the system's, outside the project's venv);
   - cells marked with a test flag from settings.ini (`tst_flags`, e.g. `#| gpu`) are not run, as `nbdev_test`
     skips them; their saved outputs (GPU tables, plots) are shown as saved;
   - of a cell that mixes imports with other code only the imports run (nbdev runs it whole, which fails when
     the rest needs a variable from a cell it does not run, and replaces the cell's saved outputs);
   - a `show_doc` cell whose annotations name a class defined further down runs again at the end;
   - the `show_doc` cells nbdev adds after a cell that defines several names come in definition order.
2. **Conversion** (into `docs/_build/src/`): each processed notebook becomes a myst-nb notebook named like
   nbdev's page (`core/00_device.ipynb` -> `core/device.html`, in the folder of its subpackage): the frontmatter becomes the title, Quarto cell options
   (`#| echo: false`, ...) become myst-nb tags, every `show_doc` output becomes a Sphinx `py:function` /
   `py:class` entry (signature and docstring as nbdev rendered them, an anchor, an index entry, a search
   result), and nbdev's links to `doc_host` become cross-references to those entries.
3. **Sphinx** (`docs/conf.py`, theme furo) renders `docs/_build/src` into `docs/_site` with saved outputs
   only (nothing is executed), a whole build each time (seconds). Step 1, the slow one, is skipped for a
   notebook whose processed copy is newer than it, the package, settings.ini and this script.

Every notebook in nbs/ and its folders (as `nbdev_export` finds them) becomes a page, and so does every benchmark
notebook in bench/ (`bench_<name>`); the home page is nbs/index.ipynb. The sidebar lists the pages in `GROUPS`, each
group under its caption, in the order of the notebooks' numbers (the order of the imports): a notebook in a folder no
group names stops the build."""
import argparse, configparser, json, multiprocessing, os, re, shutil, subprocess, sys, time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'
SRC = DOCS / '_build' / 'src'        # generated Sphinx sources (git-ignored)
DOCTREES = DOCS / '_build' / 'doctrees'

def settings():
    cfg = configparser.ConfigParser(); cfg.read(ROOT / 'settings.ini')
    return cfg['DEFAULT']

def site_dir(): return ROOT / settings().get('doc_path', 'docs/_site')

BENCH = ROOT / 'bench'               # the benchmark notebooks (not part of the package): pages `bench_<name>`

# The sidebar's groups, in order: (caption, the folders of nbs/ whose notebooks it lists). '' is the top of nbs/
# (the home page aside), 'bench' the benchmark notebooks of bench/.
GROUPS = [('Library', ('core', 'staging')), ('Tiers', ('tiers',)), ('L3', ('l3',)), ('Models and demo', ('demo',)),
          ('Benchmarks', ('bench',)), ('Performance', ('',))]

def group(nb) -> int:
    "The index in `GROUPS` of notebook `nb`'s group (by the first folder of its path under nbs/, or bench/)."
    nb = Path(nb)
    if BENCH in nb.parents: folder = 'bench'
    else:
        parts = nb.relative_to(ROOT / settings().get('nbs_path', 'nbs')).parts
        folder = parts[0] if len(parts) > 1 else ''
    for i, (_, folders) in enumerate(GROUPS):
        if folder in folders: return i
    sys.exit(f'{nb}: no group of the sidebar lists the folder {folder!r} (tools/build_docs.py, GROUPS)')

def _number(nb) -> int:
    m = re.match(r'(\d+)_', Path(nb).name)
    return int(m.group(1)) if m else -1

def notebooks():
    "`(notebook, docname)` for every notebook nbdev would document and every benchmark notebook: index first, then by group and number."
    from nbdev.doclinks import _nbpath2html, nbglob
    nbs_path = ROOT / settings().get('nbs_path', 'nbs')
    nbs = sorted(nbglob(nbs_path, func=Path))
    pages = [(p, _nbpath2html(p.relative_to(nbs_path)).with_suffix('').as_posix()) for p in nbs]
    pages += [(p, 'bench_' + _nbpath2html(Path(p.name)).with_suffix('').as_posix()) for p in sorted(BENCH.glob('[0-9]*.ipynb'))]
    index = [o for o in pages if o[1] == 'index']
    rest = sorted((o for o in pages if o[1] != 'index'), key=lambda o: (group(o[0]), _number(o[0]), o[0].as_posix()))
    return index + rest

def sidebar(pages) -> list:
    "`[(caption, [docname])]`: the sidebar's groups in order, each with its pages (`notebooks()`' order), none empty."
    out = [(caption, [d for p, d in pages if d != 'index' and group(p) == i]) for i, (caption, _) in enumerate(GROUPS)]
    return [(c, ds) for c, ds in out if ds]

# ---- 1. nbdev processing -------------------------------------------------------------------------------

def _mixed_imports(cell):
    "The top-level import statements of a code cell that also does other things (None for any other cell)."
    import ast
    from nbdev.processors import _do_eval, _is_showdoc
    if cell.cell_type != 'code' or _is_showdoc(cell) or not _do_eval(cell): return None
    if cell.directives_.keys() & {'export', 'exports', 'exporti', 'exec_doc'}: return None
    try: body = ast.parse(cell.source).body
    except SyntaxError: return None    # IPython magics: left to nbdev
    imps = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imps or len(imps) == len(body): return None
    return '\n'.join(ast.get_source_segment(cell.source, n) for n in imps)

def _filter():
    "nbdev's processors, with flagged cells left unexecuted and `show_doc` cells in definition order."
    from nbdev.processors import FilterDefaults, exec_show_docs, add_show_docs
    from nbdev.processors import _want_doc, _show_docs, _get_nm, _def_names, _is_showdoc
    from nbdev.process import NbCell
    from execnb.nbio import mk_cell
    from fastcore.foundation import L
    flags = set(settings().get('tst_flags', '').split())

    class exec_unflagged(exec_show_docs):
        def begin(self):
            super().begin(); self.deferred = []

        def __call__(self, cell):
            if flags & set(cell.directives_): return
            imports = _mixed_imports(cell)
            if imports is not None:
                # nbdev runs a whole cell that imports, which fails when the rest of it uses a variable from a
                # cell nbdev does not run (and replaces its saved outputs). Only its imports matter to show_doc.
                if not self.nb.has_docs_ or not hasattr(self, 'k'): return
                self.k.run(imports)
                if self.k.exc: raise Exception(f'Error in cell {cell.idx_}:\n{imports}') from self.k.exc
                return
            try: super().__call__(cell)
            except Exception:
                # show_doc evaluates annotations; one naming a class defined further down (a forward reference)
                # only resolves once the rest of the notebook has run, as it does in the exported module.
                if not (_is_showdoc(cell) and isinstance(self.k.exc, NameError)): raise
                self.deferred.append(cell)
                self.k.exc = None     # else the next cell, run or not, re-raises it

        def end(self):
            for cell in self.deferred:
                self.k.cell(cell)
                if self.k.exc: raise Exception(f'Error in cell {cell.idx_}:\n{cell.source}') from self.k.exc
            super().end()

    class add_show_docs_in_order(add_show_docs):
        def begin(self):   # nbdev inserts each cell's show_docs at one index, which reverses them
            nb = self.nb
            exports = L(cell for cell in nb.cells if _want_doc(cell))
            shown = {_get_nm(t) for t in _show_docs(L(nb.cells).map(NbCell.parsed_).concat())}
            for cell in reversed(exports):
                for nm in reversed(_def_names(cell, shown)):
                    new = mk_cell(f'show_doc({nm})'); new.has_sd = True
                    nb.cells.insert(cell.idx_ + 1, new)
            nb.has_docs_ = shown or exports

    swap = {exec_show_docs: exec_unflagged, add_show_docs: add_show_docs_in_order}
    class Filter(FilterDefaults):
        def base_procs(self): return [swap.get(p, p) for p in super().base_procs()]
    return Filter

def proc_nb(src, dst):
    "Run nbdev's processors over notebook `src`, write the result to `dst` (like `nbdev_proc_nbs`)."
    os.chdir(ROOT)
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))     # the benchmark notebooks import `bench`
    os.environ['IN_TEST'] = '1'
    import warnings
    warnings.filterwarnings('ignore', message='Found cells containing imports')   # nbdev's FAQ hint, per cell
    from execnb.nbio import read_nb, write_nb
    nb = read_nb(src)
    _filter()()(nb)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    write_nb(nb, dst)
    Path(dst).touch()      # write_nb leaves an unchanged file alone; its time marks when it was checked
    return str(src)

# ---- 2. conversion to myst-nb ---------------------------------------------------------------------------

from nbcells import split_directives, is_false as _false   # noqa: E402  (tools/ is on sys.path)

class Links:
    "nbdev's links to `doc_host` pages and entries, as Sphinx cross-references."
    def __init__(self, cfg, pages):
        host = (cfg.get('doc_host', '') + cfg.get('doc_baseurl', '/')).rstrip('/') + '/'
        self.re_link = re.compile(r'\[([^\]\n]*)\]\(' + re.escape(host) + r'([^)#\s]*\.html)(#[^)\s]*)?\)')
        self.pages = {d + '.html' for d in pages}
        self.entries = {}   # 'core.html#copy_to' -> ('tokenspeed_lit.core', 'tokenspeed_lit.core.copy_to')
        for mod, syms in _modidx()['syms'].items():
            for fq, (url, _) in syms.items(): self.entries.setdefault(url, (mod, fq))
        for page in pages:                  # the benchmark modules have no _modidx: their entries from __all__
            if page.startswith('bench_'): self._bench_entries(page)

    def _bench_entries(self, page):
        import importlib, inspect
        if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
        mod = f'bench.{page[len("bench_"):]}'
        m = importlib.import_module(mod)
        for name in getattr(m, '__all__', []):
            self.entries.setdefault(f'{page}.html#{name.lower()}', (mod, f'{mod}.{name}'))
            obj = getattr(m, name)
            if inspect.isclass(obj):
                for k in vars(obj):
                    if not k.startswith('_'):
                        self.entries.setdefault(f'{page}.html#{name.lower()}.{k.lower()}', (mod, f'{mod}.{name}.{k}'))

    def entry(self, page, anchor): return self.entries.get(f'{page}#{anchor}', (None, None))

    def _sub(self, m):
        text, page, anchor = m.group(1), m.group(2), (m.group(3) or '#')[1:]
        title = text.strip('`').replace('<', r'\<').replace('`', '')
        fq = self.entry(page, anchor)[1] if anchor else None
        if fq: return f'{{py:obj}}`{title} <{fq}>`'
        if page in self.pages and not anchor: return f'{{doc}}`{title} </{page[:-5]}>`'
        return m.group(0)    # left as an absolute link: the browser test reports it

    def __call__(self, md): return self.re_link.sub(self._sub, md)

def _modidx():
    lib = settings().get('lib_name')
    ns = {}
    exec((ROOT / settings().get('lib_path', lib) / '_modidx.py').read_text(), ns)
    return ns['d']

_re_showdoc = re.compile(
    r'^\s*(?:---\s*\n)?\s*(?:\[source\]\((?P<src>[^)]*)\)(?:\{[^}\n]*\})?\s*\n)?\s*'
    r'#{2,4} (?P<name>[^\n]+)\n\s*```python\n(?P<sig>.*?)\n```\n?(?P<rest>.*)$', re.S)

def _obj_kind(fq):
    "The py domain directive for a fully qualified name (class, method, property, ...), by importing it."
    import importlib, inspect
    parts = fq.split('.')
    for i in range(len(parts) - 1, 0, -1):
        try: obj = importlib.import_module('.'.join(parts[:i]))
        except ImportError: continue
        owner = None
        try:
            for p in parts[i:]: owner, obj = obj, getattr(obj, p)
        except AttributeError: return 'function'
        if inspect.isclass(obj): return 'class'
        if inspect.isclass(owner):
            raw = inspect.getattr_static(owner, parts[-1], None)
            if isinstance(raw, property): return 'property'
            if isinstance(raw, (staticmethod,)): return 'staticmethod'
            if isinstance(raw, classmethod): return 'classmethod'
            return 'method'
        return 'function'
    return 'function'

def api_entry(md, page, links, seen):
    "A `show_doc` markdown output as a Sphinx API entry (MyST), or None when it is not one nbdev made."
    m = _re_showdoc.match(md)
    if not m: return None
    name = m.group('name').strip()
    mod, fq = links.entry(page + '.html', name.lower())
    if fq is None: return None
    kind, qual = _obj_kind(fq), fq[len(mod) + 1:]
    sig = re.sub(r'^(?:async\s+)?(?:def|class)\s+', '', m.group('sig').strip()).rstrip(':').strip()
    sig = re.sub(r'\s*\n\s*', ' ', sig)                    # nbdev wraps long signatures
    sig = re.sub(r'\(\s+', '(', re.sub(r'\s+\)', ')', sig))
    opts = [f':module: {mod}']
    if kind == 'property':
        ret = re.search(r'\)\s*->\s*(.+)$', sig)
        sig = qual
        if ret: opts.append(f':type: {ret.group(1).strip()}')
    else: sig = re.sub(r'^[\w.]+', qual, sig)
    if fq in seen: opts.append(':no-index:')   # shown twice on one page (e.g. a property's getter and setter)
    seen.add(fq)
    body = m.group('rest').strip('\n')
    src = ''   # nbdev's link points at a repository host; sphinx.ext.viewcode links the module's source on the site
    fence = ':' * max(4, max((len(r) for r in re.findall(r'^:{3,}', body, re.M)), default=0) + 1)
    return f'{fence}{{py:{kind}}} {sig}\n' + '\n'.join(opts) + f'\n\n{src}{links(body)}\n{fence}\n'

def frontmatter(nb):
    "The YAML frontmatter nbdev put in a raw cell, removed from the notebook."
    import yaml
    for i, c in enumerate(nb['cells']):
        if c['cell_type'] == 'raw':
            text = ''.join(c['source']).strip()
            if text.startswith('---'):
                del nb['cells'][i]
                return yaml.safe_load(text.strip('-\n')) or {}
    return {}

def _md_cell(text): return {'cell_type': 'markdown', 'metadata': {}, 'source': text}

def convert(proc_path, page, links, toctree=None, module=None):
    "A processed notebook as a myst-nb source notebook (JSON text)."
    nb = json.loads(Path(proc_path).read_text())
    fm = frontmatter(nb)
    head = [f"# {fm.get('title', page)}"]
    if fm.get('description'): head.append('{.nb-description}\n' + fm['description'].strip())
    if module: head.append(f':::{{py:module}} {module}\n:no-index:\n:::')
    cells, seen = [_md_cell('\n\n'.join(head))], set()
    for c in nb['cells']:
        src = ''.join(c['source'])
        if c['cell_type'] == 'markdown':
            if src.strip().startswith('<!-- WARNING: THIS FILE WAS AUTOGENERATED'): continue
            if src.strip(): cells.append(_md_cell(links(src)))
            continue
        if c['cell_type'] != 'code': continue
        d, body = split_directives(src)
        tags = []
        if _false(d.get('include', True)): continue
        if _false(d.get('echo', True)) or not body.strip(): tags.append('remove-input')
        if _false(d.get('output', True)): tags.append('remove-output')
        outs = []
        for o in c.get('outputs', []):
            data = o.get('data', {})
            if 'text/markdown' in data:
                md = ''.join(data['text/markdown'])
                entry = api_entry(md, page, links, seen) if 'show_doc' in body else None
                data = dict(data, **{'text/markdown': entry if entry is not None else links(md)})
                o = dict(o, data=data)
            outs.append(o)
        if not body.strip() and not outs: continue
        meta = {'tags': tags} if tags else {}
        cells.append({'cell_type': 'code', 'execution_count': c.get('execution_count'), 'metadata': meta,
                      'source': body, 'outputs': outs})
    for caption, docs in toctree or []:      # the home page's sidebar: one toctree per group, under its caption
        cells.append(_md_cell(f':::{{toctree}}\n:hidden:\n:maxdepth: 1\n:caption: {caption}\n\n' + '\n'.join(docs) + '\n:::'))
    nb['cells'] = cells
    nb['metadata'] = {'kernelspec': {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'},
                      'language_info': {'name': 'python'}}
    nb.setdefault('nbformat', 4); nb['nbformat_minor'] = max(nb.get('nbformat_minor', 5), 5)
    for i, c in enumerate(nb['cells']): c['id'] = f'cell-{i}'
    return json.dumps(nb, indent=1, ensure_ascii=False) + '\n'

def default_exp(nb_path):
    "The module a notebook exports to (`#| default_exp x` -> `lib.x`), or None."
    lib = 'bench' if BENCH in Path(nb_path).resolve().parents else settings().get('lib_name')
    for c in json.loads(Path(nb_path).read_text())['cells']:
        if c['cell_type'] != 'code': continue
        d, _ = split_directives(''.join(c['source']))
        if d.get('default_exp'): return f"{lib}.{d['default_exp'].split()[0]}"
    return None

def write_if_changed(path, text):
    path = Path(path)
    if path.exists() and path.read_text() == text: return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True

# ---- 3. build --------------------------------------------------------------------------------------------

def build(workers=2, clean=False, quiet=True):
    t0 = time.time()
    cfg = settings()
    proc = ROOT / '_proc'
    out = site_dir()
    if clean:
        for d in (proc, DOCS / '_build', out): shutil.rmtree(d, ignore_errors=True)
    pages = notebooks()
    if not pages: sys.exit('no notebooks found')
    nbs_path = ROOT / cfg.get('nbs_path', 'nbs')
    procd = {p: proc / (p.relative_to(ROOT) if BENCH in p.parents else p.relative_to(nbs_path)) for p, _ in pages}
    # A processed notebook is reused while it is newer than its notebook, the package (show_doc reads the
    # signatures there), settings.ini and this script.
    deps = ([ROOT / 'settings.ini', Path(__file__).resolve()] + list((ROOT / cfg.get('lib_path')).rglob('*.py'))
            + list(BENCH.glob('*.py')))
    newest = max(p.stat().st_mtime for p in deps)
    todo = {s: d for s, d in procd.items() if not (d.exists() and d.stat().st_mtime >= max(newest, s.stat().st_mtime))}
    # One fresh interpreter per worker (as nbdev does): the show_doc cells import the package and torch.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import build_docs    # workers find `proc_nb` by module name, whatever `__main__` is
    ctx = multiprocessing.get_context('spawn')
    if todo:
        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(todo))), mp_context=ctx) as ex:
            list(ex.map(build_docs.proc_nb, todo, todo.values()))
    t1 = time.time()
    links = Links(cfg, [d for _, d in pages])
    wanted = set()
    for p, doc in pages:
        toc = sidebar(pages) if doc == 'index' else None
        text = convert(procd[p], doc, links, toctree=toc, module=default_exp(p))
        write_if_changed(SRC / f'{doc}.ipynb', text)
        wanted.add(SRC / f'{doc}.ipynb')
    for stale in SRC.rglob('*.ipynb'):          # a notebook that was renamed or removed
        if stale not in wanted: stale.unlink()
    t2 = time.time()
    # A fresh output folder, so that the page of a renamed or removed notebook does not linger.
    if out.is_dir() and out.resolve() != ROOT and ROOT in out.resolve().parents: shutil.rmtree(out)
    # -E -a: always a whole build (a few seconds). Sphinx's incremental mode leaves the sidebar of unchanged
    # pages stale when a notebook is added, renamed or retitled. One process (-j 1): on a 2-core machine Sphinx's
    # parallel read and write (forked workers, their doctrees pickled back) took more CPU and no less time, 45 pages
    # three runs each, alternating: -j 2 17.6-18.3 s, 22.4-24.1 CPU-s; -j 1 14.5-16.9 s, 14.6-17.0 CPU-s.
    cmd = [sys.executable, '-m', 'sphinx', '-E', '-a', '-b', 'html', '-c', str(DOCS), '-d', str(DOCTREES), '-j', '1',
           str(SRC), str(out)] + (['-q'] if quiet else [])
    subprocess.run(cmd, check=True, cwd=ROOT)
    t3 = time.time()
    print(f'docs: {len(pages)} pages in {out.relative_to(ROOT)}/  ({len(todo)} notebooks processed by nbdev in {t1 - t0:.1f}s, '
          f'conversion {t2 - t1:.1f}s, sphinx {t3 - t2:.1f}s)')
    return out

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--clean', action='store_true', help='start from scratch (drop _proc, docs/_build, the site)')
    ap.add_argument('--workers', type=int, default=2, help='processes for nbdev\'s processing of the notebooks')
    ap.add_argument('-v', '--verbose', action='store_true', help="Sphinx's progress output (warnings always show)")
    a = ap.parse_args()
    build(a.workers, a.clean, quiet=not a.verbose)
