"""How every result object shows itself in a notebook and as a table: the `Displayable` mixin.

A result class (a frozen dataclass anywhere in the package) inherits `Displayable` and gains
`_repr_html_` (Jupyter calls it to display the object) and `to_pandas()` (a long-format
DataFrame whose columns its class documents). Both are drawn by `resstream.reporting`, the
layer that renders results, through the registries of `resstream.reporting.notebook`. A class
names the module that registers its view and frame, `class R(Displayable,
renderer="resstream.reporting.shift")`; the mixin imports it when first called, so an analysis
module never imports the reporting layer above it (imports still point downward; only this
call goes up, by name). The short plain repr stays the class's own (`resstream.reprs.summary`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import pandas

#: The module whose registries hold each result class's view and frame.
_REGISTRIES = "resstream.reporting.notebook"


class Displayable:
    """Mixin: `_repr_html_()` and `to_pandas()` of a result object, drawn by the reporting layer
    with the same renderers as the command's files."""

    __slots__ = ()
    #: The module that registers this class's view and frame (imported before either is drawn).
    _renderer: ClassVar[str | None] = None

    def __init_subclass__(cls, renderer: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if renderer is not None:
            cls._renderer = renderer

    def _repr_html_(self) -> str:
        """A self-contained HTML fragment (tables and figures inline, nothing fetched) that a
        notebook shows for this result."""
        return _registries(self).result_html(self)

    def to_pandas(self) -> pandas.DataFrame:
        """This result as one long-format DataFrame (one row per observation; the columns are
        documented by the result's class)."""
        return _registries(self).tidy_frame(self)


def _registries(result: Displayable) -> Any:
    """`resstream.reporting.notebook`, after the module that registers `result`'s class."""
    if result._renderer is not None:
        importlib.import_module(result._renderer)
    return importlib.import_module(_REGISTRIES)


__all__ = ["Displayable"]
