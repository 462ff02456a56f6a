"""Run a command and fail if it changed anything under nbs/, tokenspeed_lit/, bench/ or README.md.

`make test` uses it to prove that `nbdev_export` and `nbdev_clean` have nothing left to do,
without depending on git state (a developer's uncommitted work is not a failure)."""
import hashlib, subprocess, sys
from pathlib import Path

WATCH = ['nbs', 'tokenspeed_lit', 'bench', 'README.md']

def snapshot():
    out = {}
    for w in WATCH:
        p = Path(w)
        files = [p] if p.is_file() else sorted(f for f in p.rglob('*') if f.is_file() and '__pycache__' not in f.parts
                                                   and 'results' not in f.relative_to(p).parts[:1])
        for f in files: out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out

if __name__ == '__main__':
    cmd = sys.argv[sys.argv.index('--') + 1:]
    before = snapshot()
    subprocess.run(cmd, check=True)
    after = snapshot()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    name = Path(cmd[0]).name
    if changed:
        print(f'FAIL: `{name}` changed {len(changed)} file(s): ' + ', '.join(changed))
        print('Edit the notebooks, run nbdev_export and nbdev_clean, and commit the result.')
        sys.exit(1)
    print(f'ok: `{name}` left no diff')
