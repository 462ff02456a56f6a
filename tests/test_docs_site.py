"""The documentation site, opened in headless Chromium.

Setup does what CI has to: installs Debian's `chromium` with apt-get when /usr/bin/chromium is missing (CI runs as
root), builds the site with tools/build_docs.py (incremental: an up-to-date site is reused), and serves it on
localhost. The browser may reach nothing but that server: any other request fails the page that made it, so a
page that needs a CDN (MathJax, require.js, web fonts) fails here exactly as it would for a reader offline.

Every page is held to the site's rules: its outputs show results as tables or plots (no warning, no traceback, no raw
dump of a dict, JSON or a profiler's listing: `DUMP_CHARS`), no absolute path of the machine that built it
(`BUILD_PATH`), the sidebar in its groups (`SIDEBAR`), no section that repeats the page's title; a benchmark page ends
on what its output shows, not on a code cell with none. A failure names the page and shows the offending text.

Screenshots of the home page and of one module page go to test-artifacts/docs/ (git-ignored)."""
import functools, html.parser, importlib, json, os, re, shutil, subprocess, sys, threading, urllib.error, urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tools'))
import build_docs  # noqa: E402

CHROMIUM = os.environ.get('CHROMIUM', '/usr/bin/chromium')
ARTIFACTS = ROOT / 'test-artifacts' / 'docs'
# The flags a closed network needs: without them Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync']

PAGES = build_docs.notebooks()       # (notebook, docname): every notebook in nbs/ (and its folders) and bench/, index first
# What a saved output must not show a reader: a warning (Python's `...Warning`, matplotlib's `findfont:` lines) or a
# traceback. Outputs hold results; a warning's cause is fixed where it arises.
NOT_RESULTS = re.compile(r'Traceback \(most recent call last\)|\b[A-Z]\w*Warning\b|\bWarning:|\bfindfont:')
# Results are shown as tables or plots: a cell output whose text, its tables, images and API entries left out, runs
# past this many characters is a raw dump (a dict, JSON, a profiler's listing) that a reader cannot take in.
DUMP_CHARS = 2000
# The text of what a cell output shows, less its tables, images and API entries (`show_doc`'s `dl.py`), per output.
OUTPUT_TEXT_JS = """els => els.map(o => { const c = o.cloneNode(true);
    c.querySelectorAll('table, img, svg, dl.py').forEach(e => e.remove());
    return c.textContent.trim(); })"""
# An absolute path of the machine that ran a notebook or built the site (a profiler's file names, a printed path): it
# tells a reader nothing and leaks the build's layout. A path inside a URL or a relative one (`bench/results/`) is not.
BUILD_PATH = re.compile(r'(?<![\w.~/:-])/(?:work|tmp|home|root|opt|Users)/[^\s\'"),;]*')
MODULE_PAGE = next((d for nb, d in PAGES if build_docs.default_exp(nb)), None)

def _modidx(): return build_docs._modidx()['syms']

def exported():
    "`{docname: [(name, fully qualified name)]}`: the names in each module's `__all__`, on the page nbdev gives them."
    out = {}
    for mod, syms in _modidx().items():
        for name in getattr(importlib.import_module(mod), '__all__', []):
            fq = f'{mod}.{name}'
            if fq in syms: out.setdefault(syms[fq][0].split('#')[0][:-len('.html')], []).append((name, fq))
    return out

def _importable(mod):
    try: importlib.import_module(mod); return True
    except ImportError: return False

# ---- setup ---------------------------------------------------------------------------------------------------

def ensure_chromium():
    if Path(CHROMIUM).exists(): return
    if not shutil.which('apt-get') or os.geteuid() != 0:
        pytest.fail(f'{CHROMIUM} is missing: install Debian\'s chromium (as root: apt-get install -y chromium)')
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    subprocess.run(['apt-get', 'update', '-q'], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(['apt-get', 'install', '-y', '-q', 'chromium'], check=True, env=env, stdout=subprocess.DEVNULL)
    assert Path(CHROMIUM).exists()

@pytest.fixture(scope='module')
def site():
    subprocess.run([sys.executable, str(ROOT / 'tools' / 'build_docs.py')], check=True, cwd=ROOT)
    out = build_docs.site_dir()
    assert (out / 'index.html').exists()
    return out

class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *a): pass

@pytest.fixture(scope='module')
def base_url(site):
    srv = ThreadingHTTPServer(('127.0.0.1', 0), partial(_Quiet, directory=str(site)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{srv.server_address[1]}/'
    srv.shutdown(); srv.server_close()

@pytest.fixture(scope='module')
def browser():
    ensure_chromium()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()

class Page:
    "A browser page that records console errors, uncaught exceptions, failed and off-site requests."
    def __init__(self, browser, base_url):
        self.ctx = browser.new_context(viewport={'width': 1280, 'height': 900})
        self.errors, self.offsite, self.base_url = [], [], base_url
        def route(r):
            if r.request.url.startswith(base_url) or r.request.url.startswith('data:'): r.continue_()
            else: self.offsite.append(r.request.url); r.abort()
        self.ctx.route('**/*', route)
        self.page = self.ctx.new_page()
        self.page.on('console', lambda m: m.type == 'error' and self.errors.append(f'console: {m.text} {m.location}'))
        self.page.on('pageerror', lambda e: self.errors.append(f'exception: {e}'))
        self.page.on('requestfailed', self._failed)
        self.page.on('response', lambda r: r.status >= 400 and self.errors.append(f'HTTP {r.status}: {r.url}'))

    def _failed(self, r):
        # ERR_ABORTED: a request cut short by the next navigation (a missing file shows as an HTTP 404 instead)
        if r.url.startswith(self.base_url) and 'ERR_ABORTED' not in (r.failure or ''):
            self.errors.append(f'failed: {r.url} ({r.failure})')

    def goto(self, url):
        self.page.goto(url, wait_until='load')
        return self.page

    def check_clean(self, what):
        assert not self.offsite, f'{what} asked for off-site resources: {self.offsite}'
        assert not self.errors, f'{what}: ' + '\n'.join(self.errors)

    def close(self): self.ctx.close()

@pytest.fixture
def page(browser, base_url):
    p = Page(browser, base_url)
    yield p
    p.close()

# ---- link checking (targets fetched over HTTP, anchors looked up in the target's HTML) ------------------------

class _Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.ids = set()
    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ('id', 'name') and v: self.ids.add(v)

_fetched = {}
def _target(url):
    "(HTTP status, set of element ids) of a page on the test server, cached."
    if url not in _fetched:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body, status = r.read(), r.status
        except urllib.error.HTTPError as e: body, status = b'', e.code
        ids = _Ids()
        if url.endswith('.html') or url.endswith('/'): ids.feed(body.decode('utf-8', 'replace'))
        _fetched[url] = status, ids.ids
    return _fetched[url]

def broken_links(hrefs, base_url):
    bad = []
    for href in sorted(set(hrefs)):
        if not href.startswith(base_url): continue           # external links are links, not assets: not fetched
        url, frag = urldefrag(href)
        status, ids = _target(url)
        if status != 200: bad.append(f'{href} -> HTTP {status}')
        elif frag and unquote(frag) not in ids: bad.append(f'{href} -> no element with id {unquote(frag)!r}')
    return bad

# ---- the tests ---------------------------------------------------------------------------------------------------

def test_every_notebook_is_a_page():
    nbs = [p for p in (ROOT / 'nbs').rglob('*.ipynb')
           if not any(part.startswith(('.', '_')) for part in p.relative_to(ROOT / 'nbs').parts)]
    nbs += list((ROOT / 'bench').glob('[0-9]*.ipynb'))          # the benchmark notebooks are pages too
    assert sorted(p for p, _ in PAGES) == sorted(nbs)
    assert PAGES[0][1] == 'index' and len({d for _, d in PAGES}) == len(PAGES)

def test_what_counts_as_a_warning():
    for shown in ("/x/torch/profiler/profiler.py:224: UserWarning: Warning: Profiler clears events",
                  "findfont: Font family ['STIXGeneral'] not found. Falling back to DejaVu Sans.",
                  'Traceback (most recent call last):', 'DeprecationWarning: old', 'Warning: a cycle'):
        assert NOT_RESULTS.search(shown), shown
    for shown in ('warnings 0, errors 0', 'a warning is a result here', 'fenced load 1.2 ms'):
        assert not NOT_RESULTS.search(shown), shown

def raw_dumps(texts) -> list[str]:
    "The start of each output text (`OUTPUT_TEXT_JS`) longer than `DUMP_CHARS`, with its length."
    return [f'{len(t)} characters: {t[:200]!r}' for t in texts if len(t) > DUMP_CHARS]

def build_paths(text: str) -> list[str]:
    "Each absolute build-machine path in `text`, with a little of the text around it."
    return [repr(text[max(0, m.start() - 60):m.end() + 20]) for m in BUILD_PATH.finditer(text)]

def test_what_counts_as_a_build_path():
    for shown in ('    280  0.096 /work/main/tokenspeed_lit/core.py:272(__call__)', 'see /tmp/x.json',
                  '/opt/torch/.venv/lib/python3.12/site-packages/numpy/lib/x.py:1413(diff)', "open('/home/u/a')",
                  '(/root/.cache)', '/Users/me/repo'):
        assert build_paths(shown), shown
    for shown in ('bench/results/l3.json', 'https://example.com/home/x', 'nbs/tiers/21_host_transport.ipynb',
                  'a/work/b', '~/work/x', 'file:///work/x', 'tokenspeed_lit/core/device.py:12(f)'):
        assert not build_paths(shown), shown

def test_what_counts_as_a_dump(page):
    "In a page like Sphinx's: a long text output is a dump; as long a table, a plot or an API entry is not."
    rows = ''.join(f'<tr><td>row {i}</td><td>{i * 1.5}</td></tr>' for i in range(300))
    long = 'x' * (DUMP_CHARS + 1)
    page.page.set_content(f'''<article>
      <div class="cell_output"><div class="output stream"><pre>{{'a': 1, 'b': '{long}'}}</pre></div></div>
      <div class="cell_output"><p>{long}</p></div>
      <div class="cell_output"><p><strong>title</strong></p><div class="table-wrapper"><table>{rows}</table></div></div>
      <div class="cell_output"><img src="data:," alt="{long}"></div>
      <div class="cell_output"><dl class="py class"><dd>{long}</dd></dl></div>
      <div class="cell_output"><pre>{'y' * DUMP_CHARS}</pre></div></article>''')
    texts = page.page.eval_on_selector_all('article .cell_output', OUTPUT_TEXT_JS)
    assert [len(t) > DUMP_CHARS for t in texts] == [True, True, False, False, False, False]
    assert len(raw_dumps(texts)) == 2 and "{'a': 1" in raw_dumps(texts)[0]

def test_no_asset_from_the_network(site):
    "Static check of what the browser test cannot see on one visit: no script, style, font or image from http(s)."
    pat = re.compile(r'''<(?:script|img|iframe|source|embed)\b[^>]*\bsrc=["']?(?:https?:)?//'''
                     r'''|<link\b(?=[^>]*\brel=["']?(?:stylesheet|preload|icon|modulepreload))[^>]*\bhref=["']?(?:https?:)?//'''
                     r'''|url\(\s*["']?(?:https?:)?//|@import\s+(?:url\()?["']?(?:https?:)?//''', re.I)
    bad = [f'{f.relative_to(site)}: {m.group(0)[:120]}'
           for f in site.rglob('*') if f.suffix in ('.html', '.css', '.js')
           for m in pat.finditer(f.read_text(errors='replace'))]
    assert not bad, '\n'.join(bad)

# Pages opened ahead of the tests that check them: each page waits for a quiet network (500 ms without a request, so
# that a late request's failure is seen) after it loads; AHEAD pages do their loading and waiting in the background
# while a test checks the page before them, each in a context of its own as before.
AHEAD = 4

@pytest.fixture(scope='module')
def opened(request, browser, base_url):
    "`opened(doc)`: a `Page` on `doc`, loaded and quiet, the next AHEAD pages of this run's `test_page` opened meanwhile."
    order = [i.callspec.params['doc'] for i in request.session.items
             if i.originalname == 'test_page' and i.path == request.path]
    started = {}
    def start(doc):
        if doc not in started:
            started[doc] = Page(browser, base_url)
            started[doc].page.goto(f'{base_url}{doc}.html', wait_until='commit')
    def get(doc):
        after = order[order.index(doc) + 1:][:AHEAD] if doc in order else []
        for d in [doc, *after]: start(d)
        page = started.pop(doc)
        page.page.wait_for_load_state('load')
        page.page.wait_for_load_state('networkidle')
        return page
    yield get
    for page in started.values(): page.close()

# The links from backticked names on each page `test_page` checked: test_api_names_link_to_their_entries reads them
# instead of loading every page again.
_name_links = {}
NAME_LINKS = 'article a.reference.internal:has(code)'

@pytest.mark.parametrize('nb,doc', PAGES, ids=[d for _, d in PAGES])
def test_page(nb, doc, opened, base_url):
    page = opened(doc)
    try: check_page(page, doc, base_url)
    finally: page.close()

def check_page(page, doc, base_url):
    "Every rule of the site on the open page `doc`: each failure names the page and the rule and shows what broke it."
    p = page.page
    page.check_clean(f'{doc}.html')
    assert p.locator('article h1').first.is_visible()
    # the navigation sidebar lists every page
    nav = p.eval_on_selector_all('.sidebar-tree a.reference', 'els => els.map(e => e.href)')
    missing = [d for _, d in PAGES if d not in ('index', doc) and f'{base_url}{d}.html' not in nav]
    assert not missing, f'sidebar of {doc}.html lacks {missing}'
    # every exported name of the page's module has an API entry: signature and docstring
    for name, fq in exported().get(doc, []):
        entry = p.locator(f'dt[id="{fq}"]')
        assert entry.count() == 1, f'{doc}.html has no API entry for {fq}'
        assert entry.locator('.sig-name').inner_text().strip().endswith(name.split('.')[-1])
        obj = importlib.import_module(fq[:-len(name) - 1])
        for part in name.split('.'): obj = getattr(obj, part)
        if (vars(obj).get('__doc__') if isinstance(obj, type) else getattr(obj, '__doc__', None)):
            doc_text = p.locator(f'dt[id="{fq}"] + dd').inner_text().strip()
            assert doc_text, f'{fq}: empty docstring on {doc}.html'
    # saved outputs show results: no warning, no traceback
    shown = p.eval_on_selector_all('article .cell_output', 'els => els.map(e => e.innerText)')
    bad = [line.strip()[:160] for text in shown for line in text.splitlines() if NOT_RESULTS.search(line)]
    assert not bad, f'{doc}.html shows warnings or tracebacks in its outputs:\n' + '\n'.join(bad)
    # results as tables or plots, not raw dumps; no path of the machine that built it
    bad = raw_dumps(p.eval_on_selector_all('article .cell_output', OUTPUT_TEXT_JS))
    assert not bad, f'{doc}.html shows a raw dump (an output over {DUMP_CHARS} characters that is no table or image):\n' + '\n'.join(bad)
    bad = build_paths(p.inner_text('body'))
    assert not bad, f'{doc}.html shows absolute paths of a build machine:\n' + '\n'.join(bad)
    # the sidebar in its groups, on every page
    check_sidebar_groups(p, doc, base_url)
    # no section repeats the page's title (on a benchmark page, not even a part of it)
    h1 = _heading(p.locator('article h1').first.text_content())
    for h2 in map(_heading, p.eval_on_selector_all('article h2', 'els => els.map(e => e.textContent)')):
        assert h2.lower() != h1.lower(), f'{doc}.html: the section {h2!r} repeats the page title'
        assert not (doc.startswith('bench_') and h2.lower() in h1.lower()), \
            f'{doc}.html: the section {h2!r} repeats part of the page title {h1!r}'
    # a benchmark page does not end on a code cell that shows nothing: it ends by saying what its output is
    if doc.startswith('bench_'):
        last = p.evaluate(LAST_BLOCK_JS)
        assert not (last['cell'] and not last['output']), \
            f'{doc}.html ends on a code cell with no output: {last["text"][:200]!r}'
    # images (saved plots) decoded
    broken_imgs = p.eval_on_selector_all('article img', 'els => els.filter(e => !e.complete || e.naturalWidth == 0)'
                                         '.map(e => e.src)')
    assert not broken_imgs, f'{doc}.html: images that did not load: {broken_imgs}'
    # no broken internal link
    hrefs = p.eval_on_selector_all('a[href]', 'els => els.map(e => e.href)')
    bad = broken_links(hrefs, base_url)
    assert not bad, f'{doc}.html has broken links:\n' + '\n'.join(bad)
    if doc == 'index' or doc == MODULE_PAGE:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(ARTIFACTS / f'{"home" if doc == "index" else "module-" + doc}.png'), full_page=True)
    _name_links[doc] = p.eval_on_selector_all(NAME_LINKS, 'els => els.map(e => e.href)')

SIDEBAR = ['Library', 'Tiers', 'L3', 'Models and demo', 'Benchmarks', 'Performance']

def _heading(text): return re.sub(r'\s+', ' ', text.replace('\u00b6', '').replace('#', '')).strip()

# The last block of a page's article (in its innermost last section): is it a code cell, and does it show output?
LAST_BLOCK_JS = """() => { let el = document.querySelector('article section');
    while (el.lastElementChild && el.lastElementChild.tagName == 'SECTION') el = el.lastElementChild;
    const last = el.lastElementChild;
    return {cell: last.matches('div.cell'), output: !!last.querySelector('.cell_output'), text: last.textContent.trim()}; }"""

@functools.cache
def _sidebar(): return build_docs.sidebar(PAGES)      # (it reads settings.ini for every page: once per run)

def check_sidebar_groups(p, doc, base_url):
    "The sidebar of the open page shows the groups' captions in order, each over exactly its pages."
    shown = p.eval_on_selector_all('.sidebar-tree p.caption', """els => els.map(e => {
        let ul = e.nextElementSibling;
        return [e.textContent.trim(), ul ? [...ul.querySelectorAll(':scope > li > a.reference')].map(a => a.href) : []];
    })""")
    assert [c for c, _ in shown] == SIDEBAR, f'{doc}.html: sidebar captions {[c for c, _ in shown]}, not the groups {SIDEBAR}'
    for (caption, hrefs), (_, docs) in zip(shown, _sidebar()):
        hrefs = [urldefrag(h)[0] for h in hrefs]      # the current page's own entry links to '#'
        assert hrefs == [f'{base_url}{d}.html' for d in docs], f'{doc}.html: the {caption} group lists {hrefs}'

def test_the_sidebar_groups_every_page():
    "Each page is in one group of the sidebar, the groups in the order a reader takes them; its folder decides its group."
    groups = build_docs.sidebar(PAGES)
    assert [c for c, _ in groups] == [c for c, _ in build_docs.GROUPS] == SIDEBAR
    listed = [d for _, ds in groups for d in ds]
    assert sorted(listed) == sorted(d for _, d in PAGES if d != 'index') and len(set(listed)) == len(listed)
    where = {d: c for c, ds in groups for d in ds}
    assert {where[d] for d in listed if d.startswith(('core/', 'staging/'))} == {'Library'}
    assert {where[d] for d in listed if d.startswith('demo/')} == {'Models and demo'}
    assert {where[d] for d in listed if d.startswith('bench_')} == {'Benchmarks'} and where['performance'] == 'Performance'

@pytest.mark.parametrize('doc', ['index', 'staging/input_buffers', 'demo/models/llama', 'bench_timing'])
def test_the_sidebar_shows_the_groups(doc, page, base_url):
    "On the home page and on pages in folders, the sidebar shows the groups' captions in order, each over its pages."
    p = page.goto(f'{base_url}{doc}.html')
    check_sidebar_groups(p, doc, base_url)
    page.check_clean(f'{doc}.html')

def test_api_names_link_to_their_entries(opened, base_url):
    "nbdev's links from backticked names (here in show_doc docstrings and prose) land on the entry."
    links = []
    for _, doc in PAGES:
        if doc not in _name_links:          # a page test_page did not check in this run
            page = opened(doc)
            try: _name_links[doc] = page.page.eval_on_selector_all(NAME_LINKS, 'els => els.map(e => e.href)')
            finally: page.close()
        links += _name_links[doc]
    entries = [h for h in links if '#' in h and urldefrag(h)[1].startswith(build_docs.settings()['lib_name'] + '.')]
    assert entries, 'no link from a name to its API entry anywhere on the site'
    assert not broken_links(entries, base_url)

def _search_names():
    "(name, fully qualified name) of every exported name; FlatHostMirror's where its module is in the tree."
    names = sorted({(n, fq) for v in exported().values() for n, fq in v if n != 'FlatHostMirror'})
    host = 'tokenspeed_lit.tiers.host_mirror'
    return names + ([('FlatHostMirror', f'{host}.FlatHostMirror')] if _importable(host) else [])

def _box_cases():
    "A few names (the first, middle and last) typed into the search box as a reader does."
    names = _search_names()
    return [pytest.param(n, fq, id=n) for n, fq in (names[0], names[len(names) // 2], names[-1])]

# The search page's own search (searchtools.js: what the box runs on search.html), for each of `names`: the links of
# its results, made as its results list makes them (document, link suffix, anchor).
SEARCH_JS = """names => names.map(name => {
    const [query, terms, excluded, highlight, objects] = Search._parseQuery(name);
    return Search._performSearch(query, terms, excluded, highlight, objects).map(([docName, , anchor]) =>
        new URL(docName + DOCUMENTATION_OPTIONS.LINK_SUFFIX + anchor, location.href).href); })"""

def _entry_hits(name, results): return [h for h in results if urldefrag(h)[1].endswith('.' + name)]

@pytest.fixture(scope='module')
def search_page(browser, base_url):
    "One page for all the searches: each starts from the search box of the page the previous one left."
    p = Page(browser, base_url)
    p.goto(f'{base_url}index.html')
    yield p
    p.close()

def search_box(page, name) -> list:
    "Type `name` into the sidebar's search box of the open page, press Enter: the links of the results shown."
    p = page.page
    p.fill('.sidebar-search', name)
    p.press('.sidebar-search', 'Enter')
    p.wait_for_url(re.compile(r'/search\.html\?q=' + re.escape(name) + r'(&|$)'))
    p.wait_for_selector('#search-results .search-summary:not(:empty)', timeout=15000)
    return p.eval_on_selector_all('#search-results ul.search li a', 'els => els.map(e => e.href)')

@pytest.mark.parametrize('name,fq', _box_cases())
def test_search_box_finds(name, fq, search_page, base_url):
    """Typed into the sidebar's search box, the name's API entry is among the results shown; they are the results the
    search page's own search gives (`SEARCH_JS`, which test_search_finds_every_name runs for every name)."""
    page = search_page
    page.errors.clear(); page.offsite.clear()
    results = search_box(page, name)
    hits = _entry_hits(name, results)
    assert hits, f'search for {name!r} did not find its entry; results: {results}'
    page.check_clean(f'search for {name}')
    assert not broken_links(hits, base_url)
    assert sorted(page.page.evaluate(SEARCH_JS, [name])[0]) == sorted(results)

def test_search_finds_every_name(search_page, base_url):
    """Searched for on the search page, every exported name's API entry is among the results: all names in one page
    (a page load and rendering per name cost half a second each); test_search_box_finds checks that these are the
    results the search box shows."""
    page = search_page
    if '/search.html' not in page.page.url: search_box(page, _search_names()[0][0])    # the search page, as a reader opens it
    page.errors.clear(); page.offsite.clear()
    names = [n for n, _ in _search_names()]
    found = dict(zip(names, page.page.evaluate(SEARCH_JS, names)))
    missing = [f'{n!r}; results: {r[:8]}' for n, r in found.items() if not _entry_hits(n, r)]
    assert not missing, f'search did not find the entry of {len(missing)} of {len(names)} names:\n' + '\n'.join(missing)
    page.check_clean('the searches')
    assert not broken_links([h for n, r in found.items() for h in _entry_hits(n, r)], base_url)
