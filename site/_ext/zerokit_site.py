"""The site's links, as the course writes them for JupyterLab and GitHub: a Sphinx extension (site/conf.py).

Three post-transforms run on every page before MyST resolves its links (MyST's resolver runs at priority 9):

- :class:`AnchorSpellings` (priority 7): a link to a heading of another page reaches that heading however its anchor
  is spelled — JupyterLab's (``#Why-gloo's-times-are-not-a-ring's``: the heading's text, spaces made dashes),
  GitHub's (``#why-gloos-times-are-not-a-rings``) or MyST's own; the spellings are compared with case, spaces and
  punctuation dropped, and one that matches no heading, or two, is left to MyST (a warning, an error in the
  build);
- :class:`RepositoryFileLinks` (priority 8): a link to a file of the repository that the site does not render
  (``../solutions/02_naive_ddp.ipynb``, ``../zerokit/theory/memory.py``) becomes the link's text followed by the
  file's path in code, ``(…, in the repository)``; a link whose file does not exist is left to MyST;
- :class:`OutputLinks` (priority 8): the links of a cell's markdown output, which myst-nb leaves as they were
  written (``05_zero2.ipynb``), the same way: to the page, its heading, or the repository file's path; a link to
  nothing is a warning.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)


def spelling(anchor: str) -> str:
    """An anchor with case, spaces and punctuation dropped: JupyterLab's, GitHub's and MyST's spellings of one
    heading's anchor all come to this."""
    return re.sub(r"[\W_]+", "", anchor.casefold())


class AnchorSpellings(SphinxPostTransform):
    """Point a ``page#anchor`` link at the one heading of ``page`` whose anchor is the same but for spelling."""

    default_priority = 7

    def run(self, **kwargs) -> None:
        for node in self.document.findall(addnodes.pending_xref):
            if node.get("reftype") != "myst" or node.get("refdomain") != "doc" or not node.get("reftargetid"):
                continue
            slugs = self.env.metadata.get(node["reftarget"], {}).get("myst_slugs", {})
            wanted = node["reftargetid"]
            if wanted in slugs:
                continue
            same = [slug for slug in slugs if spelling(slug) == spelling(wanted)]
            if len(same) == 1:
                node["reftargetid"] = same[0]


class RepositoryFileLinks(SphinxPostTransform):
    """A link to a file of the repository that the site does not render: its text, then the file's path in code
    (``… (solutions/02_naive_ddp.ipynb, in the repository)``), no link."""

    default_priority = 8

    def run(self, **kwargs) -> None:
        repository = Path(self.config.zerokit_repository).resolve()
        for node in list(self.document.findall(addnodes.pending_xref)):
            target = node.get("reftarget", "")
            if node.get("reftype") != "myst" or node.get("refdomain") is not None \
                    or "://" in target or target.startswith(("#", "mailto:")):
                continue  # a page of the site, a URL or an anchor: MyST resolves it
            here = posixpath.dirname(node.get("refdoc", self.env.docname))
            path = (repository / posixpath.normpath(posixpath.join(here, target.split("#", 1)[0]))).resolve()
            if not path.exists() or repository not in path.parents:
                continue
            node.replace_self(_repository_file(node, path.relative_to(repository).as_posix()))


class OutputLinks(SphinxPostTransform):
    """A link in a cell's markdown output (``[lesson 05](05_zero2.ipynb)``, printed by a cell: myst-nb renders it
    as a plain reference, never resolved) reaches the page of the notebook or page it names, and the heading its
    anchor names; a link to a repository file the site does not render becomes its path, as above; a link to
    nothing is a warning."""

    default_priority = 8

    def run(self, **kwargs) -> None:
        repository = Path(self.config.zerokit_repository).resolve()
        here = posixpath.dirname(self.env.docname)
        for node in list(self.document.findall(nodes.reference)):
            uri = node.get("refuri", "")
            if not uri or re.match(r"^[a-z][a-z0-9+.-]*:", uri) or uri.startswith(("#", "/")):
                continue  # a URL, an anchor of this page, or a link Sphinx made
            path, _, fragment = uri.partition("#")
            stem, suffix = posixpath.splitext(posixpath.normpath(posixpath.join(here, path)))
            if suffix in (".ipynb", ".md") and stem in self.env.all_docs:
                slugs = self.env.metadata.get(stem, {}).get("myst_slugs", {})
                same = [slug for slug in slugs if spelling(slug) == spelling(fragment)] if fragment else []
                target = "#" + slugs[same[0]][1] if len(same) == 1 else ("#" + fragment if fragment else "")
                if fragment and len(same) != 1:
                    logger.warning("a link to %s: no heading of %s is %r", uri, stem, fragment, location=node)
                node["refuri"] = self.app.builder.get_relative_uri(self.env.docname, stem) + target
                continue
            file = (repository / posixpath.normpath(posixpath.join(here, path))).resolve()
            if path and file.exists() and repository in file.parents:
                node.replace_self(_repository_file(node, file.relative_to(repository).as_posix()))
            elif path and not (Path(self.env.srcdir) / posixpath.normpath(posixpath.join(here, path))).exists():
                logger.warning("a link to %s: no page of the site and no file of the repository", uri,
                               location=node)


def _repository_file(node: nodes.Element, shown: str) -> nodes.inline:
    """A link's text, then the repository file's path in code: ``text (path, in the repository)``."""
    replacement = nodes.inline("", "", classes=["repository-file"])
    if node.astext().strip().strip("`") != shown:
        replacement += node[0].deepcopy() if len(node) else nodes.Text(node.astext())
        replacement += nodes.Text(" (")
        replacement += nodes.literal(shown, shown)
        replacement += nodes.Text(", in the repository)")
    else:
        replacement += nodes.literal(shown, shown)
        replacement += nodes.Text(" (in the repository)")
    return replacement


def setup(app):
    app.add_config_value("zerokit_repository", "", "env", types=[str])
    app.add_post_transform(AnchorSpellings)
    app.add_post_transform(RepositoryFileLinks)
    app.add_post_transform(OutputLinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
