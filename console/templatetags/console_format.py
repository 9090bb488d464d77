"""Template filters that write numbers as the console's Python and script do
(``console.display``): ``{% load console_format %}``, then ``{{ n|byte_size }}``."""

from __future__ import annotations

from django import template

from shunter.console import display

register = template.Library()


@register.filter
def byte_size(n: int | None) -> str:
    """``12.0 MiB``: binary units, named as such (Django's ``filesizeformat`` writes
    binary sizes as "MB")."""
    return display.byte_size(n)
