"""README.md from nbs/index.ipynb.

`nbdev_readme` renders through Quarto, which cannot be installed on machines without access to its
binary downloads. Where `quarto` is on PATH this script defers to `nbdev_readme`; otherwise it writes
the same GitHub-flavoured markdown itself: hidden cells dropped, `#|` directives removed, code in
python fences, text outputs in plain fences, markdown outputs inline."""
import json, shutil, subprocess, sys
from pathlib import Path
from nbcells import split_directives, is_false

def _output_md(o):
    if o.get('output_type') == 'stream': return '```\n' + ''.join(o['text']).rstrip('\n') + '\n```'
    data = o.get('data', {})
    if 'text/markdown' in data: return ''.join(data['text/markdown'])
    if 'text/plain' in data: return '```\n' + ''.join(data['text/plain']).rstrip('\n') + '\n```'
    return ''

def nb2md(nb_path):
    nb = json.loads(Path(nb_path).read_text())
    parts = []
    for c in nb['cells']:
        src = ''.join(c['source'])
        if c['cell_type'] == 'markdown': parts.append(src.strip('\n')); continue
        d, body = split_directives(src)
        body = body.strip('\n')
        if 'hide' in d: continue
        echo = not is_false(d.get('echo', 'true'))
        if body and echo: parts.append('```python\n' + body + '\n```')
        if not is_false(d.get('output', 'true')):
            parts += [m for m in map(_output_md, c.get('outputs', [])) if m]
    note = '<!-- generated from nbs/index.ipynb by `make readme`: do not edit -->\n\n'
    return note + '\n\n'.join(p for p in parts if p) + '\n'

if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    src, dest = args[0], args[1]
    if shutil.which('quarto') and '--no-quarto' not in sys.argv:
        sys.exit(subprocess.call(['nbdev_readme']))
    Path(dest).write_text(nb2md(src))
    print(f'wrote {dest}')
