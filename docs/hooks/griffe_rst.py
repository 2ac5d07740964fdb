"""Griffe extension: the reStructuredText markup of jaxvb's docstrings as Markdown.

The docstrings are Google style, written to read well in ``help()`` and to run as
doctests; a few reStructuredText habits in them would show as raw text on the site:

* ``:func:`jaxvb.fit``` (and ``:class:``, ``:meth:``, ...) becomes a link to the
  object's API entry where the site has one, else inline code;
* an ``Example:`` section is read as ``Examples:``, so its ``>>>`` lines render as code;
* a paragraph ending in ``::`` ends in ``:`` (its indented block is code either way),
  and a ``.. math::`` directive leaves its indented formula as a code block.

It also reads a package the way Python does where a package imports a function over
the submodule of the same name (``jaxvb.methods.gradient`` is the function
``gradient``, not the module ``gradient.py``): Griffe would otherwise document the
module under that name and leave the function out.
"""

from __future__ import annotations

import re

import griffe


def _shadow_submodules(module: griffe.Module) -> None:
    """Where a package's name is both a submodule and, imported from it, an object of
    the same name, the name means the object (as ``import`` leaves it at run time)."""
    for name, member in list(module.members.items()):
        if member.is_alias or not member.is_module:
            continue
        _shadow_submodules(member)
        inner = member.members.get(name)  # defined there: an import is left alone
        if module.is_init_module and inner is not None and not inner.is_alias:
            module.set_member(name, griffe.Alias(name, inner, parent=module))


ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")
EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
LITERAL = re.compile(r"(\S)::$", re.M)
MATH = re.compile(r"^\s*\.\. math::\s*$", re.M)


class RstMarkup(griffe.Extension):
    """Rewrites the package's docstrings once it is loaded, then its shadowed names."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        _rewrite(pkg, set())
        _shadow_submodules(pkg)


def _rewrite(obj: griffe.Object, seen: set[int]) -> None:
    """Every docstring of ``obj`` and of what it defines, each once."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if obj.docstring is not None:
        obj.docstring.value = _markdown(obj, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _rewrite(member, seen)


def _markdown(obj: griffe.Object, text: str) -> str:
    def role(match: re.Match) -> str:
        short, name = match.group(1), match.group(2).strip()
        target = name
        try:
            target = obj.resolve(name) if "." not in name else name
        except Exception:  # an unknown name stays inline code
            pass
        shown = name.rsplit(".", 1)[-1] if short else name
        return f'<autoref identifier="{target}" optional>`{shown}`</autoref>'

    text = ROLE.sub(role, text)
    text = EXAMPLE.sub(r"\1Examples:", text)
    text = MATH.sub("", text)
    return LITERAL.sub(r"\1:", text)
