"""Sphinx configuration of the dslide-dask documentation.

Build it with ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (the
``docs`` extra installs what it needs); warnings are errors, and ``tests/test_docs.py``
builds it so.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import dslide_dask  # noqa: E402  (after the path: the package of this checkout)

project = "dslide-dask"
author = "dslide-dask developers"
copyright = "dslide-dask developers"  # noqa: A001  (Sphinx's name)
version = release = dslide_dask.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_parser",
]

# The guides are Markdown (docs/*.md, also read on GitHub); the index and the API pages
# are reStructuredText.
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

# -- API reference -----------------------------------------------------------------------
autosummary_generate = True
autosummary_generate_overwrite = True
autodoc_typehints = "none"  # the numpydoc sections give the types, in words
autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False
numpydoc_show_class_members = False  # the class template lists the members itself
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

#: scikit-learn's machinery every estimator inherits: documented there, not here.
_SKLEARN_MEMBERS = ("get_metadata_routing", "get_params")


def _skip_member(app, what, name, obj, skip, options):
    """Leave out of class pages what scikit-learn generates (``set_fit_request`` and the
    other metadata-routing setters) and what it documents; fitted attributes (names
    ending in ``_``) are in each class's Attributes section."""
    if what == "class" and (
        (name.startswith("set_") and name.endswith("_request"))
        or name in _SKLEARN_MEMBERS
        or (name.endswith("_") and not name.startswith("_"))
    ):
        return True
    return skip


#: Markdown files of the repository outside docs/ that the guides link to (the links work
#: where the guides are read as files): in the site, each is a page that includes it.
REPOSITORY_PAGES = {
    "../CHANGELOG.md": "changelog.md",
    "../workflows/k8s/README.md": "kubernetes-walkthrough.md",
}


def _link_repository_pages(app, docname, source):
    for target, page in REPOSITORY_PAGES.items():
        source[0] = source[0].replace(f"]({target})", f"]({page})")


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("source-read", _link_repository_pages)


# -- Markdown guides ---------------------------------------------------------------------
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# -- HTML --------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"dslide-dask {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
