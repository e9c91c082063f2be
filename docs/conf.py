"""Sphinx configuration: MyST markdown, API reference from the docstrings."""

from importlib.metadata import version as _version

project = "memable"
author = "the memable developers"
release = _version("memable-engine")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
# attrs generates __init__ and friends; their signatures add nothing to the text.
autodoc_class_signature = "separated"

# No intersphinx: the docs build must not depend on the network.

html_theme = "alabaster"
html_title = f"memable {release}"
