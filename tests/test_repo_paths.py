"""Every repository path the text names exists: the notebooks (their sources and saved outputs), the README, the
settings, the Makefile and the pinned requirements name notebooks, modules, tests, tools and results, and a renamed
or removed file leaves its old name behind in them.

A path is a run of path characters starting at one of the repository's folders (`nbs/staging/15_fused_decode.ipynb`,
`tests/test_positions.py`, `bench/results/l3.json`, a source link's `blob/main/tokenspeed_lit/l3/tier.py`), or a
notebook named by its stem alone (`14_staging_ring`, `21_host_transport.ipynb`): a notebook of that name must be in
`nbs/` (or one of its folders) or `bench/`. A path with a `*` must match something; what the build writes (the site, the test artifacts) is not
checked."""
import json, re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIRS = ('nbs', 'tests', 'tools', 'bench', 'tokenspeed_lit', 'docs')
TEXTS = ('README.md', 'settings.ini', 'Makefile', 'requirements-dev.txt')
GENERATED = ('docs/_site', 'docs/_build', 'test-artifacts', '_proc')      # written by make docs and the tests
# a path starts at a folder of the repository, after a character that cannot be part of a longer path (or after a
# GitHub source link's blob/<branch>/); the placeholders of run commands (nbs/NN_name.ipynb) are not paths
PATH = re.compile(r'(?:(?<![\w./$-])|(?<=/blob/main/))((?:' + '|'.join(DIRS) + r')/[\w./*-]*)')
STEM = re.compile(r'(?<![\w./$-])(\d\d_[a-z][a-z0-9_]*)(?:\.ipynb)?\b')
PLACEHOLDER = re.compile(r'NN_|/NAME|<')


MD_ESCAPE = re.compile(r'\\([\\`*_\[\]|<>])')    # a Markdown output's escapes (a table's `tests/test\_x.py`)

def _notebook_text(path: Path) -> str:
    "A notebook's cell sources and saved outputs (streams, text, Markdown as it reads, HTML, tracebacks), as one text."
    out = []
    for c in json.loads(path.read_text())['cells']:
        out.append(''.join(c['source']))
        for o in c.get('outputs', []):
            out.append(''.join(o.get('text', '')) + ''.join(o.get('traceback', [])))
            for k, v in o.get('data', {}).items():
                if isinstance(v, (str, list)): out.append(MD_ESCAPE.sub(r'\1', ''.join(v)) if k == 'text/markdown' else ''.join(v))
    return '\n'.join(out)


def texts() -> list[Path]:
    nbs = sorted((ROOT / 'nbs').rglob('*.ipynb')) + sorted((ROOT / 'bench').glob('*.ipynb'))
    return nbs + [ROOT / t for t in TEXTS if (ROOT / t).exists()]


def named_paths(text: str) -> set[str]:
    "The repository paths `text` names: folder-rooted paths, and notebook stems as `<stem>.ipynb`."
    paths = set()
    for m in PATH.finditer(text):
        p = m.group(1).rstrip('.')
        if PLACEHOLDER.search(p) or p.startswith(GENERATED): continue
        paths.add(p)
    paths |= {f'{m.group(1)}.ipynb' for m in STEM.finditer(text)}
    return paths


def exists(p: str) -> bool:
    if p.endswith('.ipynb') and '/' not in p:          # a notebook by its stem: in nbs/ (or a folder of it) or bench/
        return any((ROOT / 'nbs').rglob(p)) or (ROOT / 'bench' / p).exists()
    if '*' in p: return any(ROOT.glob(p))
    return (ROOT / p).exists()


def test_the_extraction():
    text = ('see `nbs/staging/15_fused_decode.ipynb`, tests/test_positions.py. and (bench/results/l3.json); '
            '[src](https://github.com/o/r/blob/main/tokenspeed_lit/l3/tier.py#L3) `14_staging_ring` 21_host_transport.ipynb '
            '/opt/x/tools/y.py nbs/NN_name.ipynb docs/_site/index.html tests/test_l3*.py $(BIN)/nbdev_test')
    assert named_paths(text) == {'nbs/staging/15_fused_decode.ipynb', 'tests/test_positions.py', 'bench/results/l3.json',
                                 'tokenspeed_lit/l3/tier.py', '14_staging_ring.ipynb', '21_host_transport.ipynb',
                                 'tests/test_l3*.py'}
    assert exists('14_staging_ring.ipynb') and exists('06_serving_loop.ipynb') and exists('tests/test_l3*.py')
    assert exists('nbs/staging/15_fused_decode.ipynb') and exists('tokenspeed_lit/l3/tier.py')
    assert not exists('99_nowhere.ipynb') and not exists('nbs/99_nowhere.ipynb')
    assert not exists('nbs/15_fused_decode.ipynb') and not exists('tokenspeed_lit/l3_store.py')   # the flat layout's


def test_a_markdown_output_names_paths_as_it_reads(tmp_path):
    "A table output escapes Markdown's characters: `bench/01\\_baselines.ipynb` names bench/01_baselines.ipynb."
    nb = tmp_path / 'x.ipynb'
    nb.write_text(json.dumps({'cells': [{'cell_type': 'code', 'source': [], 'outputs': [{'output_type': 'execute_result',
        'data': {'text/markdown': ['| bench/01\\_baselines.ipynb | tests/test\\_docs\\_site.py |']}}]}]}))
    assert named_paths(_notebook_text(nb)) == {'bench/01_baselines.ipynb', 'tests/test_docs_site.py'}

@pytest.mark.parametrize('path', texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_exists(path):
    text = _notebook_text(path) if path.suffix == '.ipynb' else path.read_text()
    missing = sorted(p for p in named_paths(text) if not exists(p))
    assert not missing, f'{path.relative_to(ROOT)} names paths that do not exist: {missing}'
