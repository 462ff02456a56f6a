"""bench/l3.py runs end to end with tiny sizes (a smoke test of the GPU benchmark: real servers, every check on)."""
import importlib.util, json, os
import pytest
from tokenspeed_lit.l3.store import mooncake_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not mooncake_available(), reason='Mooncake Store is not installed (pip install -e .[l3])')
def test_bench_l3_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location('bench_l3', os.path.join(ROOT, 'bench', 'l3.py'))
    bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
    out = tmp_path / 'l3.json'
    assert bench.main(['--tiny', '--repeats', '3', '--out', str(out)]) == 0
    res = json.loads(out.read_text())
    assert {'gpu', 'torch', 'mooncake', 'rows', 'pipelined'} <= set(res) and res['errors'] == []
    assert [(r['op'], r['page_size']) for r in res['rows']] == [('put', 2), ('get', 2), ('put', 4), ('get', 4)]
    for r in res['rows']:
        assert {'tier_GBps', 'raw_GBps', 'caller_us', 'match_us_per_key', 'pages'} <= set(r)
        assert r['tier_GBps'] > 0 and r['raw_GBps'] > 0 and r['caller_us'] > 0 and r['match_us_per_key'] > 0
        assert r['caller_us_hot'] > 0 and r['caller_us_in_loop'] > 0
        assert 0 < r['caller_us_serving'] <= r['caller_us_serving_max'] and r['caller_us_first'] > 0
        assert r['caller_first_pages'] == r['pages']
    assert [p['page_size'] for p in res['pipelined']] == [2, 4]
    for p in res['pipelined']: assert p['l3_get_ms'] > 0 and p['h2d_ms'] > 0 and p['total_ms'] > 0
    # the serving loop makes every call once, in order, each after the last one's handle is done and released
    made = []
    times = bench.serving_calls([lambda i=i: made.append(i) for i in range(5)], 'cpu')
    assert made == list(range(5)) and len(times) == 5 and min(times) > 0
