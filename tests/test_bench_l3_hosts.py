"""bench/l3_hosts.py runs end to end at tiny sizes: loopback, then four network hosts with the store host's link
capped at 1 Gbit/s; every get byte-exact, nothing left behind (a smoke test of `python bench/l3_hosts.py`)."""
import importlib, json, subprocess
import pytest
from l3_hosts import hosts_unavailable
from tokenspeed_lit.l3.store import mooncake_available

pytestmark = [pytest.mark.skipif(not mooncake_available(), reason='Mooncake Store is not installed (pip install -e .[l3])'),
              pytest.mark.skipif(hosts_unavailable() is not None, reason=str(hosts_unavailable()))]


def test_bench_l3_hosts_tiny(tmp_path):
    bench = importlib.import_module('bench.l3_hosts')
    out = tmp_path / 'l3_hosts.json'
    assert bench.main(['--tiny', '--out', str(out)]) == 0
    res = json.loads(out.read_text())
    assert res['errors'] == [] and res['left'] == [] and 'no GPU' in res['machine']
    assert [(r['link'], r['cap']) for r in res['rows']] == [('loopback', None), ('hosts', '1gbit')]
    assert sorted(res['hosts']) == ['inst1', 'inst2', 'master', 'store']
    for r in res['rows']:
        for op in ('put', 'get'):
            assert 0 < r[f'{op}_GBps_median'] <= r[f'{op}_GBps'] and 0 < r[f'{op}_caller_us'] <= r[f'{op}_caller_us_max']
            assert len(r[f'{op}_GBps_all']) == 3                  # a warm-up round and two timed ones
    capped = res['rows'][1]
    # the cap holds: tbf passes a full bucket (Hosts.cap's burst, 256 KiB) at line rate, so a round of MiB moves in at
    # least (MiB - burst) / rate: at 1 MiB up to 4/3 of the rate (a round measured 0.14 GB/s at 0.125), 10% more for
    # the clock; loopback, uncapped, moved the same rounds at 0.2-0.55 GB/s
    bound = capped['cap_GBps'] * capped['MiB'] / (capped['MiB'] - 0.25)
    assert capped['cap_GBps'] == 0.125 and capped['put_GBps'] <= 1.1 * bound, (capped, bound)
    left = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    assert not any(h['namespace'] in left for h in res['hosts'].values())
