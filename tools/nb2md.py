"""README.md from nbs/index.ipynb.

`nbdev_readme` renders through Quarto, which cannot be installed on machines without access to its
binary downloads. Where `quarto` is on PATH this script defers to `nbdev_readme`; otherwise it writes
the same GitHub-flavoured markdown itself: hidden cells dropped, `#|` directives removed, code in
python fences, text outputs in plain fences, markdown outputs inline."""
import json, re, shutil, subprocess, sys
from pathlib import Path

def _directives(src):
    d, body, head = {}, [], True
    for line in src.splitlines():
        m = re.match(r'^\s*#\s*\|\s*(.*)$', line) if head else None
        if m:
            parts = m.group(1).replace(':', ' ').split()
            if parts: d[parts[0]] = parts[1:]
            continue
        head = False
        body.append(line)
    return d, '\n'.join(body).strip('\n')

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
        d, body = _directives(src)
        if 'hide' in d or 'export' in d and 'hide' in d: continue
        echo = d.get('echo', ['true'])[0].lower() != 'false'
        if body and echo: parts.append('```python\n' + body + '\n```')
        if d.get('output', ['true'])[0].lower() != 'false':
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
