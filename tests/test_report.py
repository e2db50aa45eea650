"""`resstream report`: finding outputs, the page's sections, captions, bold, escaping, the CLI."""

from __future__ import annotations

import html
import json
import math
import re
from html.parser import HTMLParser

import pytest

from resstream.analysis.shift.alignment import AlignmentResult
from resstream.analysis.shift.lens import LensResult, PositionTrajectory
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.reporting import report as rp
from resstream.reporting import tables
from resstream.training.records import load_runs, load_sweep
from tests.cli_support import assert_nothing_written, expect_usage_error
from tests.report_fixtures import (
    HOSTILE_MODEL,
    alignment_entry,
    write_compare,
    write_eval,
    write_everything,
    write_full_sweep,
    write_json,
    write_lens,
    write_misalignment,
    write_reproduction,
    write_shift,
)

HEADINGS = {
    "lens": "Table I. Decoded tokens by layer",
    "shift": "Figure 2. Match rates by layer",
    "similarity": "Figure 3. Similarity to the input and the next token by relative depth",
    "val_loss": "Figure 4. Validation loss against the cut layer",
    "gate": "Figure 5. The learned gate over training",
    "benchmarks": "Table II. Benchmarks",
    "misalignment": "Table III. Misalignment of the trained variants",
}


class Tables(HTMLParser):
    """Every table of a page: rows of (cell text, bold?) pairs; and every <h2>."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, bool]]]] = []
        self.headings: list[str] = []
        self._cell: list[str] | None = None
        self._bold = False
        self._h2: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell, self._bold = [], False
        elif tag == "strong" and self._cell is not None:
            self._bold = True
        elif tag == "h2":
            self._h2 = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(("".join(self._cell), self._bold))
            self._cell = None
        elif tag == "h2" and self._h2 is not None:
            self.headings.append("".join(self._h2))
            self._h2 = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._h2 is not None:
            self._h2.append(data)


def parse(page: str) -> Tables:
    parser = Tables()
    parser.feed(page)
    return parser


def page_of(*directories, **options) -> str:
    return rp.report_html(rp.find_outputs(list(directories)), **options)


def caption_after(page: str, heading: str) -> str:
    """The text of the section under `heading`, tags removed."""
    section = page.split(f"<h2>{heading}</h2>", 1)[1].split("<h2>", 1)[0]
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<img[^>]*>", "", section)))


# --------------------------------------------------------------------------- readers
def test_alignment_and_lens_results_read_back_from_their_json(tmp_path):
    entry = alignment_entry()
    entry["in_match_ci"][0] = [None, None]  # nan CI of a single sequence, as to_dict writes it
    result = AlignmentResult.from_dict(entry)
    assert math.isnan(result.in_match_ci[0][0]) and result.layers == (0, 1, 2)
    assert result.to_dict() == entry
    lens = LensResult(
        model="m",
        decoder="logit-lens",
        top_k=1,
        num_layers=1,
        trajectories=(
            PositionTrajectory(
                0, 5, 6, ((5,), (6,)), (0, 1), (1, 0), ((0.5,), (0.6,)), (0.5, 0.1), (0.2, 0.6)
            ),
        ),
        texts=((5, "<a>"), (6, " b")),
    )
    back = LensResult.from_dict(lens.to_dict())
    assert back.to_dict() == lens.to_dict() and back.token_text(5) == "<a>"


def test_load_sweep_reads_runs_config_and_gate_histories(tmp_path):
    sweep = load_sweep(write_full_sweep(tmp_path / "sweep"))
    assert (sweep.n_layer, sweep.alpha, sweep.seeds, sweep.layers) == (3, 0.5, (0, 1), (0, 1, 2))
    assert len(sweep.runs) == 10 and sweep.config["run"]["max_steps"] == 20
    assert sweep.gate_histories[1].p[-1] == (0.2, 0.2, 0.61) and sweep.gate_histories[0].steps == (1, 2, 3)
    with pytest.raises(UsageError, match="is not a sweep directory"):
        load_sweep(tmp_path)


def test_compare_table_reads_back_from_compare_json(tmp_path):
    write_full_sweep(tmp_path / "sweep")
    table = tables.compare_table(load_runs([tmp_path / "sweep"]), ("wikitext-2", "lambada"))
    back = tables.CompareTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert back.to_dict() == table.to_dict() and back.to_markdown() == table.to_markdown()


def test_a_pretrained_models_row_has_its_scores_and_no_val_loss():
    columns = tables.compare_columns([], ("wikitext-2",))
    record = tables.model_record("gpt2", {"wikitext-2": {"perplexity": 30.0}})
    row = tables.model_row(record, columns)
    assert row.label == "gpt2" and row.n == 1 and row.cells["val_loss"] is None
    assert row.cells["wikitext-2/perplexity"] == tables.Stat((30.0,))


# --------------------------------------------------------------------------- finding outputs
@pytest.mark.parametrize(
    ("kind", "writer"),
    [
        ("lens", write_lens),
        ("shift", write_shift),
        ("sweep", write_full_sweep),
        ("compare", write_compare),
        ("eval", write_eval),
        ("misalignment", write_misalignment),
    ],
)
def test_find_outputs_recognises_each_kind(tmp_path, kind, writer):
    directory = writer(tmp_path / "d")
    found = rp.find_outputs([directory])
    assert [(o.kind, o.directory) for o in found.outputs] == [(kind, directory)]
    assert found.reproductions == ()


def test_find_outputs_searches_a_reproductions_stage_folders(tmp_path):
    root = write_reproduction(tmp_path / "repro")
    found = rp.find_outputs([root, root / "compare"])  # a folder given twice counts once
    assert [(o.kind, str(o.directory.relative_to(root))) for o in found.outputs] == [
        ("lens", "lens/reference"),
        ("shift", "shift/reference"),  # misalignment/seed-0/shift.json is not a pretrained model's
        ("sweep", "sweep"),
        ("compare", "compare"),
        ("eval", "eval/reference"),
        ("misalignment", "misalignment"),
    ]
    assert found.reproductions[0].data["scale"] == "tiny"
    assert "<strong>Scale:</strong> a reproduction at the tiny scale" in rp.report_html(found)


def test_a_directory_without_outputs_is_refused_naming_what_was_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError) as error:
        rp.find_outputs([tmp_path / "empty"])
    assert str(error.value) == (
        f"the directory {str(tmp_path / 'empty')!r} holds none of the outputs `resstream report` reads; "
        "looked for lens.json, shift.json, sweep.json, compare.json, eval.json, misalignment.json "
        "or reproduce.json"
    )
    write_json(tmp_path / "repro" / "reproduce.json", {"format": "resstream-reproduce/1", "stages": {}})
    with pytest.raises(
        UsageError, match=r"the reproduction .* looked for lens/\*/lens.json, shift/\*/shift.json"
    ):
        rp.find_outputs([tmp_path / "repro"])
    write_json(tmp_path / "tuned" / "lens.json", {"format": "resstream-tuned-lens/1"})  # a tuned lens
    with pytest.raises(
        UsageError, match=r"lens.json' is not the lens.json `resstream lens` writes \(no 'positions'"
    ):
        rp.find_outputs([tmp_path / "tuned"])


# --------------------------------------------------------------------------- the page
def test_every_section_appears_with_every_input(tmp_path):
    page = page_of(*write_everything(tmp_path), title="T <&>", scale_note="laptop & more")
    assert parse(page).headings == list(HEADINGS.values())
    assert "<title>T &lt;&amp;&gt;</title>" in page and "laptop &amp; more" in page
    assert page.count("<img ") == 2 + 1 + 1 + 1 + 1  # a Figure 2 per model and both together, 3, 4, 5
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r"src='([^']*)'", page))
    assert not re.search(r"https?://", page)


def test_missing_sections_are_left_out(tmp_path):
    page = page_of(write_misalignment(tmp_path / "m"))
    assert parse(page).headings == [HEADINGS["misalignment"]]
    assert "<img" not in page and "figure-2" not in page
    page = page_of(write_eval(tmp_path / "e"))
    assert parse(page).headings == [HEADINGS["benchmarks"]]


def test_captions_state_the_scale(tmp_path):
    page = page_of(*write_everything(tmp_path))
    sweep = caption_after(page, HEADINGS["val_loss"])
    assert (
        "10 runs of 3-layer models (d_model 32, 12,345 parameters, context 32); 20 steps × 8 sequences × "
        "32 tokens = 5,120 training tokens of 'shakespeare' per run; seeds 0, 1; fixed cuts at layers "
        "0, 1, 2 with α = 0.5; a learned gate per seed." in sweep
    )
    assert "Not shown:" in sweep
    shift = caption_after(page, HEADINGS["shift"])
    assert (
        "reference (L = 2): 100 positions in 4 sequences (4 of 50 non-overlapping 26-token windows" in shift
    )
    assert "top-5, logit-lens decoder" in shift and "other (L = 4)" in shift
    assert '3 positions of the text “<b> & "q"”' in caption_after(page, HEADINGS["lens"])
    assert "at most 500 tokens per benchmark" in caption_after(page, HEADINGS["benchmarks"])
    assert "gpt2: scored tokens wikitext-2 300, lambada 300." in caption_after(page, HEADINGS["benchmarks"])
    misalignment = caption_after(page, HEADINGS["misalignment"])
    assert "32 sequences × 64 tokens of 'wikitext-2', top-5, logit-lens decoder; seeds 0, 1." in misalignment
    assert "less misalignment = lower final_in_match" in misalignment


def test_one_models_results_under_two_decoders_are_told_apart(tmp_path):
    directory = write_shift(tmp_path / "s")
    data = json.loads((directory / "shift.json").read_text())
    data["models"].append({**data["models"][0], "decoder": "tuned"})
    write_json(directory / "shift.json", data)
    page = page_of(directory)
    assert "Figure 2 (reference (logit-lens))." in page and "Figure 2 (reference (tuned))." in page


def test_bold_marks_the_best_value_of_each_column_among_trained_rows(tmp_path):
    page = page_of(write_compare(tmp_path / "c"), write_eval(tmp_path / "e"))
    rows = parse(page).tables[0]
    assert [cell for cell, _ in rows[0]] == [
        "model",
        "n",
        "val loss",
        "wikitext-2 ppl",
        "lambada last-word acc (%)",
    ]
    # baseline: lowest val loss (2 < 3); learned: lowest perplexity (8 < 10), highest accuracy (30 > 20)
    assert rows[1] == [
        ("baseline", False),
        ("1", False),
        ("2.000", True),
        ("10.000", False),
        ("20.000", False),
    ]
    assert rows[2] == [
        ("learned gate", False),
        ("1", False),
        ("3.000", False),
        ("8.000", True),
        ("30.000", True),
    ]
    assert rows[3][0][0].startswith("pretrained models (not ranked")
    # gpt2's 45% and ppl 30 would not win anyway; its better-than-all accuracy must still not be bold
    assert rows[4] == [("gpt2", False), ("1", False), ("—", False), ("30.000", False), ("45.000", False)]


def test_the_benchmark_table_comes_from_the_sweep_without_compare(tmp_path):
    page = page_of(write_full_sweep(tmp_path / "s"))
    rows = parse(page).tables[0]
    assert [r[0][0] for r in rows[1:]] == ["baseline", "best fixed cut (k=1, α=0.5)", "learned gate"]
    assert rows[1][2] == ("3.000 ± 1.414", False) and rows[2][2] == ("2.600 ± 0.141", True)


def test_the_misalignment_table_gives_mean_std_and_counts_shifts(tmp_path):
    rows = parse(page_of(write_misalignment(tmp_path / "m"))).tables[0]
    assert [cell for cell, _ in rows[0]][:3] == ["variant", "n", "final_in_match"]
    assert [cell for cell, _ in rows[1]] == [
        "baseline", "2", "0.300 ± 0.141", "0.500 ± 0.000", "0.110 ± 0.014", "0.300 ± 0.000", "0.600 ± 0.000",
        "2.000 ± 0.707 (2 of 2 seeds)",
    ]  # fmt: skip
    assert [cell for cell, _ in rows[2]][-1] == "1.000 (1 of 2 seeds)"
    data = json.loads((tmp_path / "m" / "misalignment.json").read_text())
    data["variants"][1]["shift_layer"] = {"mean": None, "std": None, "n": 0, "values": []}
    write_json(tmp_path / "never" / "misalignment.json", data)
    assert parse(page_of(tmp_path / "never")).tables[0][2][-1] == ("never (0 of 2 seeds)", False)


def test_token_strings_and_names_from_data_are_escaped(tmp_path):
    page = page_of(write_lens(tmp_path / "l"))
    assert "<b>" not in page and HOSTILE_MODEL not in page
    assert "&lt;b&gt;" in page and "␣&amp;" in page and "␣&quot;q&quot;" in page
    assert f"<h3>{'tiny &lt;b&gt;&amp;&quot;model&quot;'}</h3>" in page
    rows = parse(page).tables[0]
    # layers 1 and 2 decode the same at every position: one column "1–2"
    assert [cell for cell, _ in rows[1]] == ["pos", "input", "next", "0", "1–2", "3"]
    assert [cell for cell, _ in rows[2]] == ["0", "<b>", "␣&", "<b>", "␣the", "␣&"]


def test_layer_groups_merge_layers_that_agree_at_every_position(tmp_path):
    result = LensResult.from_dict(json.loads((write_lens(tmp_path / "l") / "lens.json").read_text()))
    assert rp.layer_groups(result) == [(0, 0), (1, 2), (3, 3)]


# --------------------------------------------------------------------------- the command
def test_report_command_end_to_end_on_handmade_outputs(tmp_path, capsys):
    out = tmp_path / "out"
    directories = write_everything(tmp_path / "in")
    assert main(["report", *map(str, directories), "--out", str(out), "--title", "My study"]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "run.json"]
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["command"] == "report" and record["config"]["title"] == "My study"
    assert "<h1>My study</h1>" in (out / "report.html").read_text()


def test_report_command_refuses_a_directory_without_outputs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    expect_usage_error(
        ["report", str(write_shift(tmp_path / "shift")), str(tmp_path / "empty")],
        tmp_path / "out",
        capsys,
        f"the directory {str(tmp_path / 'empty')!r} holds none of the outputs",
        "looked for lens.json, shift.json, sweep.json, compare.json, eval.json, misalignment.json or "
        "reproduce.json",
    )
    expect_usage_error(["report", str(tmp_path / "nowhere")], tmp_path / "out", capsys, "does not exist")
    assert_nothing_written(tmp_path / "out")


# --------------------------------------------------------------------------- from real outputs
@pytest.fixture(scope="module")
def real_outputs(tmp_path_factory):
    """Outputs of the real commands at the smallest scale: shift of the reference model on two
    sequences, a 2-layer sweep with 2 seeds and cuts at both layers, and its comparison on a
    tiny local benchmark (the built-in corpora would take a minute to tokenise)."""
    from tests.test_cli_sweep_compare import TINY
    from tests.test_sweep import write_corpus, write_data_dir

    root = tmp_path_factory.mktemp("real")
    corpus, data = write_corpus(root), write_data_dir(root)
    shift = ["shift", "--dataset", corpus, "--num-seqs", "2", "--seq-len", "32", "--out", root / "shift"]
    sweep = ["sweep", "--preset", "tiny", "--dataset", corpus, "--cache-dir", root / "cache", *TINY]
    sweep += ["--seeds", "0,1", "--layers", "0,1", "--out", root / "sweep"]
    compare = ["compare", root / "sweep", "--benchmarks", "openwebtext", "--data-dir", data]
    compare += ["--max-eval-tokens", "100", "--out", root / "cmp"]
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            patch.setenv(name, "1")
        patch.delenv("RESSTREAM_DATA", raising=False)
        for argv in (shift, sweep, compare):
            assert main([*map(str, argv), "--quiet"]) == 0, argv
    return root


@pytest.mark.slow
def test_report_command_end_to_end_on_real_outputs(real_outputs, capsys):
    root, out = real_outputs, real_outputs / "report"
    capsys.readouterr()
    assert (
        main(["report", str(root / "shift"), str(root / "sweep"), str(root / "cmp"), "--out", str(out)]) == 0
    )
    assert capsys.readouterr().out == f"{out / 'report.html'}\n"
    page = (out / "report.html").read_text(encoding="utf-8")
    parsed = parse(page)
    assert parsed.headings == [HEADINGS[k] for k in ("shift", "similarity", "val_loss", "gate", "benchmarks")]
    assert page.count("<img ") == 4 and not re.search(r"https?://", page)
    rows = parsed.tables[0]
    assert [row[0][0] for row in rows[1:]] == ["baseline", rows[2][0][0], "learned gate"]
    assert rows[2][0][0].startswith("best fixed cut (k=")
    assert "3 steps × 4 sequences × 16 tokens = 192 training tokens" in caption_after(
        page, HEADINGS["val_loss"]
    )
    assert "reference (L = 6): " in caption_after(page, HEADINGS["shift"])
