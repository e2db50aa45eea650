"""One self-contained HTML report of the causal-shift / residual-attenuation study.

`find_outputs(paths)` recognises what resstream commands left in each directory: shift
(shift.json), lens (lens.json), sweep (sweep.json), eval (eval.json), compare (compare.json),
misalignment (misalignment.json), or a whole reproduction (reproduce.json, whose stage folders
shift/*/, lens/*/, sweep/, eval/*/, compare/ and misalignment/ are searched instead).
`write_report(inputs, out_dir)` writes `report.html`: one file with every figure embedded as a
data: URI and its style inline, so it opens offline. It has a section for each kind of input
given, numbered as in the paper, each in its own module:

* Table I (`lens_table`): the decoded top-1 token of every layer at each position of a text,
  layers merged into one column where every position's decoding agrees (lens);
* Figure 2 (`shift_figures`): top-k match with the input and the next token by layer, 95%
  CIs (shift);
* Figure 3 (`shift_figures`): cosines and projection of every model on a relative-depth axis
  (shift);
* Figure 4 (`sweep_figures`): validation loss against the cut layer, baseline dotted (sweep);
* Figure 5 (`sweep_figures`): the learned gate's distribution over training (sweep);
* Table II (`benchmark_table`): baseline / best fixed cut / learned gate on the benchmarks,
  best in bold (compare, else the sweep's own scores), with pretrained models' rows (eval)
  beside them;
* Table III (`misalignment_table`): the misalignment of the trained variants (misalignment).

`inputs` finds and checks the outputs, `markup` holds the captions' shared HTML, `page`
assembles the page. Every caption states the scale (models, tokens, steps, seeds, read from
the inputs) and what the figure or table does and does not show. Every text that comes from
data is escaped. The numbers are the inputs' own; nothing here runs a model.
"""

from resstream.reporting.report.benchmark_table import compare_html
from resstream.reporting.report.inputs import (
    OUTPUT_FILES,
    REPRODUCTION_FILE,
    STAGE_FOLDERS,
    Output,
    ReportInputs,
    find_outputs,
)
from resstream.reporting.report.lens_table import layer_groups, lens_table_html
from resstream.reporting.report.misalignment_table import misalignment_html
from resstream.reporting.report.page import DEFAULT_TITLE, REPORT_FILE, report_html, write_report
from resstream.reporting.report.sweep_figures import sweep_scale

__all__ = [
    "DEFAULT_TITLE",
    "OUTPUT_FILES",
    "REPORT_FILE",
    "REPRODUCTION_FILE",
    "STAGE_FOLDERS",
    "Output",
    "ReportInputs",
    "compare_html",
    "find_outputs",
    "layer_groups",
    "lens_table_html",
    "misalignment_html",
    "report_html",
    "sweep_scale",
    "write_report",
]
