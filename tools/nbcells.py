"""Cell options shared by the tools: nbdev's `extract_directives`, in the form the tools use."""
from fastcore.basics import AttrDict
from nbdev.process import extract_directives

def split_directives(src):
    "A cell's `#|` options as `{key: value}` (Quarto's `key: value` and nbdev's flags alike) and the rest of its source."
    cell = AttrDict(source=src)
    d = {k.rstrip(':'): ' '.join(v).strip('"\'') for k, v in extract_directives(cell, remove=True).items()}
    lines = cell.source.splitlines()
    while lines and lines[0].lstrip().startswith('#|'): lines.pop(0)   # Quarto options nbdev leaves for Quarto
    return d, '\n'.join(lines)

def is_false(v): return str(v).lower() in ('false', 'no', '0')
