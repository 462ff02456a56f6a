"""The README stays true: it is what `tools/nb2md.py` makes of `nbs/index.ipynb`, it stays short, its engine-side
example is the notebook's cell and prints what it shows, and every figure of its table is the figure of the results
file its row names.

The figures are recomputed here from `bench/results/*.json`, independently of the notebook cell that writes the table:
each number of a row (its "measured" and "result" cells, in order) must equal the record's value to the precision it
is printed with, and the row's GPU must be the record's."""
import json, math, os, re, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / 'README.md'
INDEX = ROOT / 'nbs' / 'index.ipynb'
RESULTS = ROOT / 'bench' / 'results'
MAX_LINES, MAX_LINE = 130, 400
HEADER = '| measured | result | GPU | record |'

sys.path.insert(0, str(ROOT / 'tools'))
from nb2md import nb2md              # noqa: E402
from nbcells import split_directives  # noqa: E402


def _record(name): return json.loads((RESULTS / f'{name}.json').read_text())
def _gpu(d): return d.get('gpu') or d['env']['device']
def _ints(text): return [int(x) for x in re.findall(r'\d+', text)]


# ---- the figures each row must show, from its record ---------------------------------------------------------------

def _positions(d):
    r = next(r for r in d['rows'] if r['batch'] == 8192)
    return [r['batch'], r['ours_us'], r['naive_us'], r['speedup_vs_naive']]

def _input_buffers(d):
    by = {r['path']: r for r in d['rows'] if r['batch'] == 256}
    ours, eng = by['InputBuffers'], by['engine']
    return [256, ours['host_issue_us'], ours['gpu_ops'], eng['host_issue_us'], eng['gpu_ops']]

def _host_overhead(d):
    r = next(r for r in d['rows'] if r['call'] == 'fill_input_buffers mixed 4x512+60')
    return _ints(r['call']) + [r['host_us'], r['host_us_numpy'], r['engine_us']]

def _serving_loop(d):
    by = {r['variant']: r['in_loop_us'] for r in d['rows'] if r['step'] == 'decode 256'}
    return [256, by['graph, staged'], by['lists'], by['engine']]

def _host_interference(d):
    rows = [r for r in d['rows'] if r['default']]
    pct = [100 * r['overlapped_GBps'] / r['dma_overlapped_GBps'] for r in rows]
    sizes = [r['page_size'] for r in rows]
    return [rows[0]['pages'], min(sizes), max(sizes), min(pct), max(pct)]

def _l3(d):
    rows = d['rows']
    gbs, x, mib = [r['tier_GBps'] for r in rows], [r['ratio'] for r in rows], [r['page_bytes'] / 2**20 for r in rows]
    return [rows[0]['pages'], min(mib), max(mib), min(gbs), max(gbs), min(x), max(x)]

def _demo(d):
    return [d['requests'], d['steps'], d['tokens_compared'], d['max_logit_diff'], d['max_kv_diff'], d['checks'],
            d['elapsed_s']]

def _demo_hybrid(d):
    l3, two = d['l3'], d['l3']['second_instance']
    return [d['requests'], l3['requests'], d['checks'], two['checks'], max(d['max_logit_diff'], two['max_logit_diff']),
            d['max_state_diff'], d['graph_replays'], l3['pages_hit'], l3['prefill_tokens_saved'], d['elapsed_s']]

EXPECTED = {'positions': _positions, 'input_buffers': _input_buffers, 'host_overhead': _host_overhead,
            'serving_loop': _serving_loop, 'host_interference': _host_interference, 'l3': _l3, 'demo': _demo,
            'demo_hybrid': _demo_hybrid}

# a figure: digits with thousands commas, decimals, an exponent; not part of a name (`L3Tier`, `H200`, `bench_l3`)
FIGURE = re.compile(r'(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?')


def figures(text: str) -> list[tuple[str, float, float]]:
    "`(as printed, value, half a unit of its last digit)` for every figure of `text`, in order."
    out = []
    for tok in FIGURE.findall(text):
        mant, _, exp = tok.replace(',', '').partition('e')
        decimals = len(mant.partition('.')[2])
        out.append((tok, float(tok.replace(',', '')), 0.5 * 10 ** (int(exp or 0) - decimals)))
    return out


def table(md: str) -> list[list[str]]:
    "The cells of the figures table's rows (the table under `HEADER`)."
    lines = md.splitlines()
    assert HEADER in lines, f'no figures table ({HEADER!r}) in the README'
    rows = []
    for line in lines[lines.index(HEADER) + 2:]:
        if not line.startswith('|'): break
        rows.append([c.strip() for c in line.strip().strip('|').split(' | ')])
    return rows


def table_errors(md: str) -> list[str]:
    "Every way the README's table disagrees with the results files (empty: it agrees)."
    errors, seen = [], []
    for cells in table(md):
        if len(cells) != 4: errors.append(f'not a row of 4 cells: {cells}'); continue
        what, result, gpu, rec = cells
        m = re.fullmatch(r'`bench/results/(\w+)\.json`', rec)
        if not m or m.group(1) not in EXPECTED:
            errors.append(f'row {what!r}: its record {rec!r} is not a results file this test knows'); continue
        name = m.group(1); seen.append(name)
        d = _record(name)
        if gpu != _gpu(d): errors.append(f'{name}: GPU {gpu!r}, the record says {_gpu(d)!r}')
        shown, want = figures(f'{what} {result}'), EXPECTED[name](d)
        if len(shown) != len(want):
            errors.append(f'{name}: {len(shown)} figures shown {[s for s, _, _ in shown]}, {len(want)} in the record')
            continue
        for (tok, v, tol), w in zip(shown, want):
            if not math.isclose(v, w, abs_tol=tol * (1 + 1e-9)):
                errors.append(f'{name}: {tok} shown, the record has {w}')
    if sorted(seen) != sorted(EXPECTED): errors.append(f'the rows name {sorted(seen)}, expected one each of {sorted(EXPECTED)}')
    return errors


# ---- the tests --------------------------------------------------------------------------------------------------

def test_the_figures_are_the_records():
    errors = table_errors(README.read_text())
    assert not errors, 'the README table disagrees with bench/results:\n' + '\n'.join(errors)


def test_a_wrong_figure_is_caught():
    md = README.read_text()
    row = next(l for l in md.splitlines() if 'bench/results/demo.json' in l)
    n = re.search(r'(\d+) checks passed', row).group(1)
    assert table_errors(md.replace(row, row.replace(f'{n} checks', f'{int(n) + 1} checks')))
    assert table_errors(md.replace(row, row.replace('NVIDIA H200', 'NVIDIA H100')))
    assert table_errors(md.replace(row, row.replace('demo.json', 'demo_hybrid.json')))
    assert table_errors(md.replace(row + '\n', ''))                                   # a row gone
    assert figures('L3Tier 1,808 pages, 2.9e-6, 0.98-1.02x, 94-100%') == [
        ('1,808', 1808, 0.5), ('2.9e-6', 2.9e-6, 0.5e-7), ('0.98', 0.98, 0.005), ('1.02', 1.02, 0.005),
        ('94', 94, 0.5), ('100', 100, 0.5)]


def test_readme_is_generated_from_the_index_notebook():
    assert README.read_text() == nb2md(INDEX), 'README.md is not what `make readme` makes of nbs/index.ipynb'


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f'README.md has {len(lines)} lines (at most {MAX_LINES})'
    long = [i + 1 for i, l in enumerate(lines) if len(l) > MAX_LINE]
    assert not long, f'README.md lines over {MAX_LINE} characters: {long}'


def _example_cell():
    cells = json.loads(INDEX.read_text())['cells']
    i = next(i for i, c in enumerate(cells) if c['cell_type'] == 'code' and 'fill_input_buffers' in ''.join(c['source'])
             and 'hide' not in split_directives(''.join(c['source']))[0])
    return cells, i


def test_the_example_is_the_notebooks_and_is_checked():
    cells, i = _example_cell()
    src = ''.join(cells[i]['source']).strip('\n')
    md = README.read_text()
    assert f'```python\n{src}\n```' in md, "the README's example is not the notebook's cell"
    d, body = split_directives(''.join(cells[i + 1]['source']))
    assert 'hide' in d and 'test_eq' in body, 'the cell after the example must be a hidden cell that checks it'


def test_the_example_prints_what_the_readme_shows():
    cells, i = _example_cell()
    src = ''.join(cells[i]['source']).strip('\n')
    shown = re.search(re.escape(f'```python\n{src}\n```') + r'\n\n```\n(.*?)\n```', README.read_text(), re.S)
    assert shown, 'no output shown after the README example'
    p = subprocess.run([sys.executable, '-c', src], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, (str(ROOT), os.environ.get('PYTHONPATH'))))})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.rstrip('\n') == shown.group(1), f'the example prints\n{p.stdout}\nthe README shows\n{shown.group(1)}'
