"""Two gloo ranks built a transformers model after `dist_init`, which imported
`torch.distributed.nn.functional` while the group existed; ten of its functions took the group as a default argument,
so `dist_close` did not end it, and its threads were torn down with the interpreter: now and then a gloo worker, still
releasing the last all-reduce's tensors, needed the GIL of a finalizing interpreter and the rank aborted with
"terminate called without an active exception". Each rank here does what a demo rank does (build both models, then
all-reduce) and reports its threads of torch.distributed before and after `dist_close`: after, there must be none, and
every run must exit cleanly. Each rank writes its report to a file of its own: two processes printing to one pipe
can interleave their lines."""
import json, os, subprocess, sys
import pytest

# Both ranks run this script (torch.multiprocessing, forked or spawned as the demo's `start_method` says: forked on a
# CPU, where this script's process has one thread); each writes OUT/rank{rank}.json.
RANKS_SCRIPT = '''
import json, os, socket, sys
import torch, torch.multiprocessing as mp
from tokenspeed_lit.demo.ranks import dist_init, dist_all_reduce, dist_close, start_method

def dist_threads():
    "This process's threads of torch.distributed (gloo's workers and TCP loop, the store server), by name."
    names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]
    return sorted(n for n in names if n.startswith(('pt_gloo', 'gloo_', 'pt_tcpstore')))

def rank_main(rank, world, port, out):
    torch.set_num_threads(1)
    dist_init(rank, world, port)
    from tokenspeed_lit.demo.models.llama import tiny_llama
    from tokenspeed_lit.demo.models.hybrid import tiny_qwen35
    tiny_llama(layers=1, device='cpu'); tiny_qwen35(device='cpu')   # transformers' imports, after the group exists
    for i in range(20): total = dist_all_reduce([rank + 1, i], 'sum')
    before = dist_threads()
    dist_close()
    with open(os.path.join(out, f'rank{rank}.json'), 'w') as f:
        json.dump(dict(rank=rank, total=total, before=before, after=dist_threads()), f)

if __name__ == '__main__':
    with socket.socket() as sk:
        sk.bind(('127.0.0.1', 0)); port = sk.getsockname()[1]
    mp.start_processes(rank_main, args=(2, port, sys.argv[1]), nprocs=2, start_method=start_method())
'''


@pytest.mark.skipif(not os.path.isdir('/proc/self/task'), reason='reads thread names from /proc')
def test_two_ranks_end_their_group_in_dist_close(tmp_path):
    script = tmp_path / 'two_ranks.py'
    script.write_text(RANKS_SCRIPT)
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'HF_HUB_OFFLINE': '1', 'CUDA_VISIBLE_DEVICES': ''}   # gloo
    # two runs, side by side (each is mostly three interpreters importing torch and transformers)
    outs = [tmp_path / f'run{run}' for run in range(2)]
    procs = []
    for out in outs:
        out.mkdir()
        procs.append(subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    try: done = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None: p.kill(); p.wait()
    for run, (out, p, (stdout, stderr)) in enumerate(zip(outs, procs, done)):
        r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        assert r.returncode == 0 and 'terminate called' not in r.stderr, (run, r.stdout, r.stderr)
        lines = [json.loads(p.read_text()) for p in sorted(out.glob('rank*.json'))]
        assert sorted(l['rank'] for l in lines) == [0, 1], r.stdout + r.stderr
        for l in lines:
            assert l['total'] == [3, 38]
            assert any('gloo' in t for t in l['before']), l      # gloo's threads ran (their names vary by build)
            assert l['after'] == [], l                  # joined in dist_close, none left for the interpreter's exit


# Two tensor-parallel ranks of one data-parallel rank (issue 52): each schedules steps 1 to 3; at step 3 rank 1's row
# has another cached length. Each rank writes what `check_schedules_agree` said at each step.
TP_SCRIPT = '''
import json, os, socket, sys
import torch, torch.multiprocessing as mp
from types import SimpleNamespace
from tokenspeed_lit.demo.ranks import dist_init, dist_groups, dist_close, start_method
from tokenspeed_lit.demo.requests import DemoViolation
from tokenspeed_lit.demo.scheduler import check_schedules_agree

def rank_main(rank, world, port, out):
    torch.set_num_threads(1)
    dist_init(rank, world, port)
    dp, tp = dist_groups(1, 2)
    said = []
    for step in (1, 2, 3):
        r = SimpleNamespace(uid=5, cache_len=8 + (rank == 1 and step == 3), pages=[2, 3])
        try: check_schedules_agree(step, [(r, 2, False)], tp); said.append('agree')
        except DemoViolation as e: said.append(str(e))
    with open(os.path.join(out, f'rank{rank}.json'), 'w') as f:
        json.dump(dict(rank=rank, dp=dp, tp=[tp.rank, tp.size], said=said), f)
    del tp
    dist_close()

if __name__ == '__main__':
    with socket.socket() as sk:
        sk.bind(('127.0.0.1', 0)); port = sk.getsockname()[1]
    mp.start_processes(rank_main, args=(2, port, sys.argv[1]), nprocs=2, start_method=start_method())
'''


def test_tensor_parallel_ranks_that_schedule_apart_are_caught(tmp_path):
    "Two tensor-parallel ranks (gloo) agree on steps 1 and 2; at step 3 one schedules another cached length, and both fail, naming the step and their rank."
    script = tmp_path / 'tp_ranks.py'
    script.write_text(TP_SCRIPT)
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'HF_HUB_OFFLINE': '1', 'CUDA_VISIBLE_DEVICES': ''}   # gloo
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and 'terminate called' not in r.stderr, (r.stdout, r.stderr)
    lines = sorted((json.loads(p.read_text()) for p in tmp_path.glob('rank*.json')), key=lambda l: l['rank'])
    assert [(l['dp'], l['tp']) for l in lines] == [(0, [0, 2]), (0, [1, 2])], lines
    for l in lines:
        assert l['said'][:2] == ['agree', 'agree'], l
        assert l['said'][2].startswith(f"step 3: tensor-parallel rank {l['tp'][0]} of 2 scheduled other rows than another "
                                       f"rank of its group"), l


def test_capturable_answers_without_a_process_group():
    "A tensor-parallel place built alone (to shard weights, as 30_llama shows rank 1 of 2) has no group to sum over: on a GPU its decode is not capturable, and asking does not raise; one rank or the CPU always is."
    import torch.distributed as dist
    from tokenspeed_lit.demo.ranks import TensorParallel
    assert not (dist.is_available() and dist.is_initialized())
    assert TensorParallel().capturable('cuda') and TensorParallel(1, 2).capturable('cpu')
    assert TensorParallel(1, 2).capturable('cuda') is False
