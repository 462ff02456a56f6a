"""The demo's L3 scenario beyond its default run: it survives its Mooncake master killed mid-run, it runs across
network hosts (Linux namespaces) where they can be made and is refused naming why where they cannot, and without
Mooncake it says in one line that it skips the scenario. A file of its own: pytest-xdist (`--dist loadfile`) runs it
beside the other demo tests."""
import json, os, subprocess, sys, time
import pytest
from l3_servers import mooncake_missing
from l3_hosts import hosts_unavailable
from demo_run import ENV, demo, line, servers_stopped


@mooncake_missing
def test_demo_survives_l3_master_killed(tmp_path):
    "--fault l3-down: the master dies mid-run of instance 2; lookups fail, requests recompute, every check passes."
    r = demo('--fault', 'l3-down', '--requests', '16', '--report', str(tmp_path / 'report.json'))
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'all checks passed' in r.stdout
    fault = line(r, 'L3 fault')
    assert 'master' in fault and 'killed at step' in fault and 'serving went on' in fault
    failed = int(line(r, 'L3 failed gets').split()[3])
    assert failed > 0 and f'{failed} pages failed, {failed * 4} prefill tokens recomputed' in fault
    rep = json.loads((tmp_path / 'report.json').read_text())
    assert rep['passed'] and rep['l3']['pages_failed'] == failed and rep['l3']['master_killed_at_step'] > 0
    assert rep['fault_fired'] == 1 and 'fault                l3-down: injected 1 time' in r.stdout    # the master, once
    assert rep['l3']['pages_hit'] > 0                               # the requests admitted before the outage
    assert set(rep) >= {'gpu', 'torch', 'triton', 'prep_us', 'parts'}
    assert set(rep['prep_us']) == {'decode_median', 'mixed_median', 'decode_hot', 'mixed_hot'}
    assert rep['prep_us']['decode_median'] > 0 and rep['prep_us']['mixed_median'] > 0
    d = rep['parts']['decode']
    assert d['steps'] > 0 and d['fill_input_buffers_us'] == rep['prep_us']['decode_median'] > 0
    assert servers_stopped(r)


@mooncake_missing
@pytest.mark.skipif(hosts_unavailable() is not None, reason=str(hosts_unavailable()))
def test_demo_l3_scenario_across_hosts(tmp_path):
    """--l3-hosts: the master, the store process and each instance on a network namespace of its own, the store's link
    capped, instance 2 cut off from the store host for two steps. Every check of the scenario passes; the printed and
    the JSON report name the hosts (namespace and address), the cap and the partition; nothing outlives the run."""
    t0 = time.monotonic()
    r = demo('--l3-hosts', '--requests', '8', '--report', str(tmp_path / 'r.json'))
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'all checks passed' in r.stdout and 'a network host of its own' in line(r, 'L3 tier')
    rep = json.loads((tmp_path / 'r.json').read_text())
    hosts, part = rep['l3']['hosts'], rep['l3']['partitions']
    assert rep['passed'] and sorted(hosts) == ['inst1', 'inst2', 'master', 'store'] and rep['l3']['caps'] == {'store': '1gbit'}
    shown = line(r, 'L3 hosts')
    for name, h in hosts.items(): assert f"{name} {h['address']} (netns {h['namespace']})" in shown
    assert len({h['address'] for h in hosts.values()}) == 4 and 'store 1gbit' in shown
    assert line(r, 'L3 tier').split('(')[1].startswith(hosts['master']['address'] + ':')    # the master on its host
    cut = line(r, 'L3 partition')
    assert part[0]['between'] == ['inst2', 'store'] and part[0]['pages_failed'] > 0
    assert f"cut at step {part[0]['cut_at_step']} of instance 2, healed at step {part[0]['healed_at_step']}: " \
           f"{part[0]['pages_failed']} pages failed meanwhile" in cut
    assert rep['l3']['pages_failed'] >= part[0]['pages_failed'] and rep['l3']['pages_hit'] > 0     # loads before the cut
    assert rep['l3']['pages_byte_checked'] == rep['l3']['pages_hit'] and "each output equal to generate's" in line(r, 'instance 2 ')
    assert servers_stopped(r)
    left = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    assert not any(h['namespace'] in left for h in hosts.values()), left
    print(f'--l3-hosts --requests 8: {took:.1f} s')


@mooncake_missing
def test_demo_l3_hosts_refused_where_namespaces_cannot_be_made():
    "Without `ip` on PATH no namespace can be made: --l3-hosts is a usage error that says why, before anything starts."
    env = ENV | {'PATH': os.path.dirname(sys.executable)}
    r = subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo', '--l3-hosts'], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == '', r.stdout + r.stderr
    assert 'argument --l3-hosts: network hosts cannot be made here: ' in r.stderr
    assert ('no `ip`/`tc` (iproute2) on PATH' if os.geteuid() == 0 else 'need root') in r.stderr


def test_demo_without_mooncake():
    "Mooncake hidden: the demo runs one instance, says in one line that it skips the L3 scenario, and passes."
    code = ("import sys; sys.modules['mooncake'] = None; sys.modules['mooncake.store'] = None\n"
            "from tokenspeed_lit.demo.cli import main; sys.exit(main(['--requests', '4']))")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [l for l in r.stdout.splitlines() if l.startswith('L3')] == [
        "L3 tier              skipped: Mooncake Store is not installed: pip install -e '.[l3]' (the wheel "
        "mooncake-transfer-engine-non-cuda needs Debian's libibverbs1 libnuma1 librdmacm1)"]
    assert 'all checks passed' in r.stdout and 'second engine instance' not in r.stdout


@mooncake_missing
def test_demo_l3_with_tensor_parallel_ranks(tmp_path):
    """`--tp 2` with the L3 scenario (issue 52): each instance is two tensor-parallel processes; each rank puts its
    shard (one KV head of two) under keys with its own tp_rank, and rank r of instance 2 loads rank r's pages, byte
    for byte (rank r's digests), its K and V checked against the reference's heads of rank r; no key is put by two
    ranks, and nothing outlives the run."""
    r = demo('--tp', '2', '--requests', '12', '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'each instance as 2 tensor-parallel processes' in line(r, 'L3 tier')
    assert line(r, 'L3 per rank').endswith("each rank's shard under keys of its own tp_rank, none shared")
    rep = json.loads((tmp_path / 'r.json').read_text())
    ranks = rep['l3']['tp_ranks']
    assert [t['rank'] for t in ranks] == [0, 1] and rep['passed'] and rep['config']['tp'] == 2
    for t in ranks:
        assert t['pages_put'] == t['keys'] > 0 and 0 < t['pages_loaded'] == t['pages_checked'], t
        assert f"tensor-parallel rank {t['rank']}: {t['pages_put']} pages put, {t['pages_loaded']} loaded" in line(r, 'L3 per rank')
    assert rep['l3']['pages_hit'] == ranks[0]['pages_loaded'] and rep['l3']['loaded_kv_compared'] > 0
    assert int(line(r, 'L3 failed gets').split()[3]) == 0
    assert servers_stopped(r)


@mooncake_missing
def test_a_rank_asking_for_another_ranks_keys_is_caught(tmp_path):
    "--fault l3-wrong-rank: rank 1 of instance 2 looks its pages up under rank 0's keys; the match is refused (keys rank 1 of instance 1 never put), naming the step and the rank, and the run exits 1."
    r = demo('--tp', '2', '--requests', '8', '--fault', 'l3-wrong-rank', '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 1, r.stdout + r.stderr
    v = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    assert 'instance 2: step ' in v and '(tensor-parallel rank 1 of 2): L3 holds page 0 of request' in v, v
    assert "under a key instance 1 never put" in v, v
    rep = json.loads((tmp_path / 'r.json').read_text())
    assert not rep['passed'] and rep['fault_fired'] == 1 and 'l3-wrong-rank: injected 1 time' in r.stdout
