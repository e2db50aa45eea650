"""`resstream verify` rendered: the table of checks it prints, and a `VerifyResult` in a notebook.

The printed table has one row per check (`CHECKS`): its verdict (pass, FAIL, or n/a where the
model offers nothing to compare with), its figure, the tolerance of the model's dtype and what
was compared. A notebook shows the same table and the figures per layer; `to_pandas()` is the
per-layer frame (`VERIFY_COLUMNS`, documented by `VerifyResult`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from resstream.analysis.verification import Check, VerifyResult
from resstream.reporting.notebook import NotebookView, frame_table, long_frame, register_result

if TYPE_CHECKING:
    import pandas

#: The columns of `VerifyResult.to_pandas()`, one row per layer 0..L.
VERIFY_COLUMNS = (
    "layer",
    "state_error",
    "state_relative",
    "decomposition_residual",
    "decomposition_relative",
    "components",
    "neurons",
    "lens_agreement",
    "router_agreement",
)
#: The columns of the table of checks (printed, and shown in a notebook).
CHECK_COLUMNS = ("check", "result", "figure", "tolerance", "compared")
#: Checks whose figure is an agreement (at least the tolerance); the others are errors (at most).
AGREEMENTS = ("lens", "router")


def verify_frame(result: VerifyResult) -> pandas.DataFrame:
    """`VerifyResult.to_pandas()`: one row per layer (`VERIFY_COLUMNS`)."""
    routed = {block.block + 1: block.agreement for block in result.router}
    rows = [
        (
            layer.layer,
            layer.state_error,
            layer.state_relative,
            layer.decomposition_residual,
            layer.decomposition_relative,
            layer.components,
            layer.neurons,
            layer.lens_agreement,
            routed.get(layer.layer),
        )
        for layer in result.layers
    ]
    return long_frame(
        VERIFY_COLUMNS,
        rows,
        integers=("layer", "components"),
        floats=("state_error", "state_relative", "lens_agreement", "router_agreement"),
    )


def verdict(check: Check) -> str:
    """A check's result as the table shows it: pass, FAIL or n/a."""
    if not check.applies:
        return "n/a"
    return "pass" if check.passed else "FAIL"


def figure_text(check: Check) -> str:
    """A check's figure (an agreement to three digits, an error in scientific notation)."""
    if check.value is None:
        return ""
    return f"{check.value:.3g}" if check.name in AGREEMENTS else f"{check.value:.1e}"


def tolerance_text(check: Check) -> str:
    """A check's tolerance with its direction: ≥ for an agreement, ≤ for an error."""
    if check.tolerance is None:
        return ""
    if check.name in AGREEMENTS:
        return f"≥ {check.tolerance:.3g}"
    return f"≤ {check.tolerance:.0e}"


def check_rows(result: VerifyResult) -> list[tuple[str, str, str, str, str]]:
    """The table of checks as text cells (`CHECK_COLUMNS`), one row per check."""
    return [
        (check.name, verdict(check), figure_text(check), tolerance_text(check), check.note)
        for check in result.checks
    ]


def checks_frame(result: VerifyResult) -> pandas.DataFrame:
    """The table of checks as a frame (`CHECK_COLUMNS`, text cells)."""
    return long_frame(CHECK_COLUMNS, check_rows(result))


def headline(result: VerifyResult) -> str:
    """One line: the model, its family, dtype and device, the text's length and the verdict."""
    verdict_text = "every check passed" if result.passed else f"FAILED: {', '.join(result.failed)}"
    return (
        f"{result.model} ({result.family}, {result.dtype} on {result.device}), "
        f"{result.tokens} tokens against the {result.reference}: {verdict_text}"
    )


def verify_lines(result: VerifyResult) -> list[str]:
    """What `resstream verify` prints: the headline, then the table of checks, aligned."""
    return [headline(result), *aligned([CHECK_COLUMNS, *check_rows(result)])]


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of text cells as lines, each column padded to its widest cell, two spaces apart
    (the last column unpadded)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]


def verify_view(result: VerifyResult) -> NotebookView:
    """The table of checks and the figures per layer."""
    return NotebookView(
        tables=[
            frame_table(headline(result), checks_frame(result)),
            frame_table("per layer (layer 0: the embedding)", verify_frame(result)),
        ]
    )


register_result(VerifyResult, verify_frame, verify_view)

__all__ = [
    "AGREEMENTS",
    "CHECK_COLUMNS",
    "VERIFY_COLUMNS",
    "aligned",
    "check_rows",
    "checks_frame",
    "figure_text",
    "headline",
    "tolerance_text",
    "verdict",
    "verify_frame",
    "verify_lines",
    "verify_view",
]
