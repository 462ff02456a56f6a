"""`make demo DEMO_ARGS="--model hybrid"` at sizes `make test` affords: a transformers Qwen3.5 whose Gated DeltaNet
states live in the pool's state slabs, checked every step (logits, K and V, working states, checkpoints, the padding
row); its faults caught; its decode steps replayed as captured graphs; two data-parallel ranks with dummy steps. Its L3
scenario (checkpoints loaded by a second instance) is in test_demo_hybrid_l3.py. A file of its own: pytest-xdist
(`--dist loadfile`) runs it beside the other demo tests."""
import json, re
import pytest
from demo_run import demo, hybrid_run, HYBRID_N, line


def test_hybrid_ranks_check_their_dummy_steps():
    """Two data-parallel hybrid ranks: a rank whose requests are done replays the agreed decode graph on dummy inputs,
    and that step's state check compares against the slabs before it (only the padding row may change), not before the
    rank's last real step, whose working rows changed then."""
    r = demo('--ranks', '2', '--model', 'hybrid', '--requests', str(HYBRID_N))
    assert r.returncode == 0 and 'all checks passed' in r.stdout, r.stdout + r.stderr
    assert int(re.search(r'(\d+) dummy decodes', line(r, 'steps ')).group(1)) > 0, line(r, 'steps ')




def test_demo_hybrid_model_passes_every_check():
    "`--model hybrid`: a transformers Qwen3.5 whose Gated DeltaNet states live in the pool's state slabs; its logits, K and V, working states and checkpoints checked every step (a small run: `make test`'s time)."
    r, _ = hybrid_run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'model: transformers Qwen3.5 (hybrid), 3 Gated DeltaNet + 1 full-attention layers' in r.stdout
    states, logits = line(r, 'states compared').split(), line(r, 'logits compared').split()
    tol = float(logits[logits.index('(tolerance') + 1].rstrip(');'))
    assert int(states[2]) > 0 and float(states[states.index('|difference|') + 1]) <= tol
    assert int(line(r, 'states compared').split(' checkpoints')[0].split()[-1]) > 0      # checkpoints written and compared
    assert int(line(r, 'steps').split('(')[1].split()[0]) > 0                      # padded decode steps ran
    assert int(line(r, 'states compared').split('written by each of ')[1].split()[0]) > 0   # with padded rows
    assert f"{HYBRID_N}, each output equal to generate's" in line(r, 'requests finished')
    w = line(r, 'prefix reuse').split()                                       # a shared system prompt resumed
    hits, saved, reused = int(w[2]), int(w[4]), int(w[w.index('reused') - 1])
    assert hits > 0 and saved >= hits * 4 and reused == hits
    assert int(w[w.index("decode") - 1]) > 0 and int(line(r, 'overrides').split('; ')[1].split()[0]) > 0   # verify width 2
    assert int(line(r, 'host tier').split()[2]) > 0       # idle requests took their state rows to the host and back


@pytest.mark.parametrize('fault', ['wrong-checkpoint', 'rejected-draft'])
def test_demo_hybrid_catches_state_faults(fault, tmp_path):
    "A request resuming a shared prefix from the checkpoint of the page before, or a rejected draft token's update left in a state: the logits or state check names the request."
    r = demo('--model', 'hybrid', '--no-l3', '--requests', str(HYBRID_N), '--fault', fault, '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 1, r.stdout + r.stderr
    v = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    assert ('logits of request' in v or 'working state of request' in v or 'copies) of request' in v) and 'tolerance' in v, v
    assert json.loads((tmp_path / 'r.json').read_text())['fault_fired'] >= 1     # counted where the model applied it


def test_demo_hybrid_catches_a_padded_row_staged_onto_a_live_row(tmp_path):
    "--fault padded-state-write: inside a replayed decode graph, a padded row is staged onto a live request's working state row; the checks name the row."
    r = demo('--model', 'hybrid', '--no-l3', '--requests', str(HYBRID_N), '--fault', 'padded-state-write',
             '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'Traceback' not in r.stderr, r.stderr
    v = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    assert re.search(r'state_write_req_pool_indices_buf\[\d+\] = \d+, expected \d+ \(padding|state row \d+', v), v
    assert json.loads((tmp_path / 'r.json').read_text())['fault_fired'] == 1


def test_demo_hybrid_decode_steps_are_graph_replays():
    "--model hybrid: its decode steps replay the captured decode graph, some of them padded; the report and its JSON count both (the run test_demo_hybrid_model_passes_every_check reads)."
    r, j = hybrid_run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert j['graph_replays'] == j['step_kinds']['graph_steps'] > 0 and 0 < j['padded_graph_steps'] <= j['graph_replays']
    assert f"{j['graph_replays']} replays of a captured graph, {j['padded_graph_steps']} of them padded" in r.stdout



def test_hybrid_padded_rows_must_write_the_padding_row():
    "A step with padded rows must change the padding state row (zeroed before it), and a step without them need not: the check alone, on the model's own bookkeeping after such steps."
    from tokenspeed_lit.demo.models.hybrid import HybridModel
    m = HybridModel.__new__(HybridModel)                # no weights needed: the rule reads which rows changed
    stats = dict(states_compared=0, checkpoints_written=0, checkpoints_reused=0, max_state_diff=0.0, padded_steps=0)
    m.padding, m.step_rows, m.marks, m.cow, m.work, m.cows, m.prefixes = 0, [5, 6], [], {}, {}, 0, {}
    m.padded, m.changed_rows = 2, lambda: [5, 6]        # what the slabs against before_step's would say
    assert '2 padded rows ran and the padding row (0) did not change' in m.check_states([], 1e-4, stats)
    m.step_rows, m.changed_rows = [5, 6], lambda: [0, 5, 6]
    assert m.check_states([], 1e-4, stats) is None and stats['padded_steps'] == 1
    m.step_rows, m.padded, m.changed_rows = [5, 6], 0, lambda: [5, 6]
    assert m.check_states([], 1e-4, stats) is None and stats['padded_steps'] == 1


def test_hybrid_prefix_hit_left_for_a_later_step_is_checked_by_its_checkpoint():
    "A request admitted on a prefix hit that the step's token budget leaves for a later step has no working state yet: the check reads the checkpoint its first step copies (the first GPU-sized run, 512 tokens a step, compared the zeroed row instead and stopped)."
    from tokenspeed_lit.demo.requests import DemoConfig
    from tokenspeed_lit.demo.scheduler import serve
    cfg = DemoConfig.for_device(gpu=False, model='hybrid', requests=16, max_num_tokens=48, chunk=48,
                                system_pages=(2, 6), arrivals_per_step=8)   # the CPU's sizes on any device
    stats = serve(cfg, progress=False)
    assert stats['prefix_hits'] > 0 and stats['checkpoints_reused'] == stats['prefix_hits'] and stats['finished'] == 16
