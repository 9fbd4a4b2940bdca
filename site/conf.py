"""Sphinx's configuration of the course's site: ``make site`` (tools/build_site.py) copies it into the staged
source tree and builds ``build/site/`` from there.

What the site is built from, and how:

1. the committed notebooks, rendered as they are — ``nb_execution_mode = "off"``: no cell runs, the outputs and
   figures are those ``notebooks/build.py`` stored; the collapsed ``checks`` cells stay collapsed (their inputs
   behind a toggle);
2. nothing is fetched at build time or when a page is read: no launch buttons, no widget JavaScript from a CDN,
   no MathJax (the course writes no TeX; Sphinx loads MathJax, from a CDN, only on a page with math, and such a
   page would fail the browser test's console check offline);
3. links (``_ext/zerokit_site.py``): one to a file of the repository that is not a page of the site
   (``../solutions/…``) becomes that file's path, in code; one to a heading spelled as JupyterLab spells its
   anchors (``01_collectives.ipynb#Why-gloo's-times-are-not-a-ring's``) or as GitHub does reaches that heading; a
   link to nothing at all stays a warning, and ``tools/build_site.py`` builds with warnings as errors.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "zerokit"
author = "zerokit"
copyright = "zerokit's authors"
html_title = "zerokit — distributed training, measured"

extensions = ["myst_nb", "zerokit_site"]  # _ext/zerokit_site.py: the links, below
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# the committed outputs, as they are
nb_execution_mode = "off"
nb_ipywidgets_js: dict = {}  # the notebooks store no widget state; never load the widget manager from a CDN
nb_merge_streams = True  # a cell's stdout as one block, as JupyterLab shows it
myst_enable_extensions = ["html_image", "colon_fence"]
myst_heading_anchors = 4  # `page.ipynb#a-heading` links resolve to the heading's section
suppress_warnings = ["myst.header"]  # lessons open with "# Title" then "## …" and sometimes jump a level

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_favicon = "_static/favicon.svg"  # a browser asks for /favicon.ico otherwise: a 404 in its console
html_context = {"default_mode": "auto"}  # light or dark as the reader's system; the theme's script needs it set
html_theme_options = {
    "logo": {"text": "zerokit"},
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "use_download_button": False,  # the .ipynb is the repository's; the site shows the page
    "use_fullscreen_button": False,
    "launch_buttons": {},
    "home_page_in_toc": True,
}
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
