"""Sphinx configuration of the documentation site (`make docs`; see tools/build_docs.py).

The sources are generated: tools/build_docs.py runs nbdev's processing over nbs/ and writes myst-nb notebooks to
docs/_build/src. Nothing here loads an asset from the network: the theme (furo) ships its CSS, JS and icons,
search runs on a local index, math is rendered to MathML at build time, and ipywidgets' CDN scripts are off. The
"source" link of each API entry is `sphinx.ext.viewcode`'s page of the exported module, on this site (the package
has no public repository to link to)."""
import configparser, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent / '_ext'))
_cfg = configparser.ConfigParser(); _cfg.read(ROOT / 'settings.ini'); _s = _cfg['DEFAULT']

project = _s.get('title', _s['lib_name'])
author = _s.get('author', '')
copyright = _s.get('copyright', '')
release = version = _s.get('version', '')

extensions = ['myst_nb', 'mathml', 'sphinx.ext.viewcode']
viewcode_line_numbers = True              # each API entry's [source] link: the exported module's code, on this site
root_doc = 'index'
exclude_patterns = ['**.ipynb_checkpoints']

# myst-nb: show the outputs saved in the notebooks, never execute (nbdev already ran the show_doc cells).
nb_execution_mode = 'off'
nb_render_markdown_format = 'myst'        # markdown outputs (show_doc entries, benchmarking.Table) as MyST
nb_merge_streams = True
nb_ipywidgets_js = {}                     # would be require.js and the widget manager from CDNs
myst_enable_extensions = ['colon_fence', 'attrs_inline', 'attrs_block', 'dollarmath', 'amsmath']
myst_dmath_allow_space = False           # `$5 and $6` stays text, as in Pandoc
myst_dmath_allow_digits = False
html_math_renderer = 'mathml'             # docs/_ext/mathml.py: no MathJax from a CDN

html_theme = 'furo'
html_title = project
html_static_path = ['_static']
html_css_files = ['site.css']
html_copy_source = False
html_show_sourcelink = False
python_display_short_literal_types = True
add_module_names = False                  # `copy_to(...)`, not `tokenspeed_lit.core.copy_to(...)`
toc_object_entries_show_parents = 'hide'
suppress_warnings = ['mystnb.unknown_mime_type']
html_favicon = '_static/favicon.svg'      # else browsers ask for /favicon.ico and log a 404

def setup(app):
    def outputs_under_build(app):
        # myst-nb writes image outputs beside the output folder (docs/jupyter_execute): keep them in docs/_build.
        app.env.mystnb_config = app.env.mystnb_config.copy(output_folder=str(ROOT / 'docs' / '_build' / 'outputs'))
    app.connect('builder-inited', outputs_under_build, priority=900)
