"""Sphinx configuration of the API reference: pages generated from the docstrings (autodoc).

Build: ``pip install -e ".[docs]"`` then ``python -m sphinx -b html docs/api docs/api/_build``
(the tests build it with ``-W``: a docstring that Sphinx warns about fails them)."""
project = "spikerec"
author = "spikerec authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
exclude_patterns = ["_build"]
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "separated"
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_theme_options = {"description": "spiking and recurrent neural networks: the API reference"}
