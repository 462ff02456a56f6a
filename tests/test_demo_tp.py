"""`make demo DEMO_ARGS="--tp 2"` on the CPU (issue 52), processes over gloo: every check passes on each tensor-parallel
rank and the run is the one-process run step for step, with data-parallel ranks too; a rank computing with another
rank's shard is caught. Its L3 scenario is in test_demo_l3.py. A file of its own, beside test_demo.py: pytest-xdist
(`--dist loadfile`) runs them side by side."""
import json
from demo_run import demo, line


def test_tensor_parallel_passes_every_check_step_for_step(tmp_path):
    """`--tp 2`: two processes, each with half the Llama's query heads, KV heads and MLP rows and a pool of its one KV
    head, all-reducing o_proj's and down_proj's partial sums. Every check passes on each (logits against transformers'
    unsharded forward, K and V against the reference's heads of that rank, outputs against generate's), and the run
    is the one-process run step for step: the same steps, tokens, requests, logits and KV positions compared."""
    one, two = tmp_path / 'tp1.json', tmp_path / 'tp2.json'
    r1 = demo('--requests', '12', '--no-l3', '--report', str(one))
    r = demo('--tp', '2', '--requests', '12', '--no-l3', '--report', str(two))
    assert r1.returncode == 0 and r.returncode == 0, r1.stdout + r.stdout + r.stderr
    assert line(r, 'ranks ') == ('ranks                1 data-parallel x 2 tensor-parallel (2 processes; every check '
                                 'on every tensor-parallel rank, of its own shard)')
    assert line(r, 'model: ').endswith('tensor parallel over 2 ranks (each holds 1/2 of the heads, KV heads and MLP rows)')
    assert line(r, 'L3 tier').endswith('skipped: turned off (--no-l3)')
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert (a['config']['tp'], b['config']['tp'], b['passed']) == (1, 2, True)
    for k in ('requests', 'steps', 'tokens', 'tokens_compared', 'kv_compared', 'checks'):
        assert a[k] == b[k] > 0, (k, a[k], b[k])
    # the same decode steps replayed as graphs, where a graph can hold the shards' all-reduce (NCCL, or the CPU's
    # graphs, which run their function); two shards on one GPU sum over gloo, on the host: their decode runs eagerly
    from tokenspeed_lit.core.device import HAS_ACCEL
    from tokenspeed_lit.demo.ranks import dist_backend
    graphed = not HAS_ACCEL or dist_backend(2) == 'nccl'
    assert a['graph_replays'] > 0 and b['graph_replays'] == (a['graph_replays'] if graphed else 0), (a, b)
    tol = 1e-4
    assert b['max_logit_diff'] <= tol and b['max_kv_diff'] <= tol, b
    assert "each output equal to generate's" in line(r, 'requests finished')


def test_tensor_parallel_with_data_parallel_ranks():
    "`--ranks 2 --tp 2`: four processes, two data-parallel ranks of two tensor-parallel shards each; every request of both ranks finished and checked once."
    r = demo('--ranks', '2', '--tp', '2', '--requests', '5')
    assert r.returncode == 0, r.stdout + r.stderr
    assert line(r, 'ranks ').startswith('ranks                2 data-parallel x 2 tensor-parallel (4 processes;')
    assert line(r, 'requests finished').startswith("requests finished    10, each output equal to generate's")
    assert line(r, 'L3 tier').endswith('skipped: --ranks 2 (the L3 scenario runs with one rank)')
    logits = line(r, 'logits compared').split()
    assert int(logits[2]) > 0 and float(logits[logits.index('|difference|') + 1]) <= 1e-4


def test_a_rank_with_another_ranks_shard_is_caught(tmp_path):
    "`--fault wrong-shard`: tensor-parallel rank 1 computes with rank 0's heads and MLP rows; the first step's check fails, naming the step, the tensor-parallel rank, the request and position, and the run exits 1."
    r = demo('--tp', '2', '--requests', '4', '--no-l3', '--fault', 'wrong-shard', '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 1, r.stdout + r.stderr
    v = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    assert 'step 1 (tensor-parallel rank ' in v and ' of 2): ' in v, v
    assert ("differ from transformers'" in v or "differs from transformers'" in v) and 'of request' in v, v
    rep = json.loads((tmp_path / 'r.json').read_text())
    assert not rep['passed'] and rep['config']['tp'] == 2 and rep['config']['fault'] == 'wrong-shard'


def test_a_llama_whose_all_reduce_cannot_be_captured_runs_its_decode_eagerly(monkeypatch):
    "Where a graph cannot hold the shards' all-reduce (two shards on one GPU, over gloo), `LlamaModel` is not capturable: the same run passes every check with its decode steps launched from ring slots and run eagerly, no graph replayed (the path `--tp 2` takes on a one-GPU machine, here with one rank)."
    from tokenspeed_lit.demo.ranks import TensorParallel
    from tokenspeed_lit.demo.requests import DemoConfig
    from tokenspeed_lit.demo.scheduler import serve
    cfg = DemoConfig.for_device(requests=3, max_steps=60)
    graphed = serve(cfg, progress=False)
    monkeypatch.setattr(TensorParallel, 'capturable', lambda self, device: False)
    eager = serve(cfg, progress=False)
    assert graphed['graph_replays'] > 0 and eager['graph_replays'] == 0, (graphed['graph_replays'], eager['graph_replays'])
    for k in ('finished', 'steps', 'graph_steps', 'tokens', 'checks'):
        assert eager[k] == graphed[k] > 0, (k, eager[k], graphed[k])
