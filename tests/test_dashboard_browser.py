"""End to end: the generated dashboard opened in headless Chromium (Debian's `chromium`).

A copy of the page gets a probe script at the top of <head> that records every JavaScript
error (window errors, unhandled rejections, console.error), waits for the page to render,
then switches every control through all its values, counting after each switch the plotly
figures that drew an SVG. It writes its findings into a <pre> that ``--dump-dom`` returns.
A screenshot of the untouched page is saved under tmp_path and kept at the printed path
(``$SPECSIM_SCREENSHOT_DIR``, default ``<tmp>/specsim-dashboard``).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
pytestmark = [pytest.mark.skipif(CHROMIUM is None,
                                 reason="headless browser test needs Debian's chromium "
                                        "(apt-get install -y chromium)"),
              # the page is conftest's, which test_dashboard reads too: one pytest-xdist
              # worker runs both, building it once
              pytest.mark.xdist_group("dashboard")]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--mute-audio"]

PROBE = """<script>
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push('error: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) {
    errors.push('unhandled rejection: ' + e.reason); });
  var consoleError = console.error;
  console.error = function () {
    errors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
    return consoleError.apply(console, arguments);
  };
  function count() {
    var plots = document.querySelectorAll('.js-plotly-plot'), drawn = 0, titled = 0;
    plots.forEach(function (p) {
      if (p.querySelector('svg.main-svg .cartesianlayer, svg.main-svg .heatmaplayer')) drawn++;
      var t = p.querySelector('.gtitle');
      if (t && t.textContent.trim()) titled++;
    });
    return {plots: plots.length, drawn: drawn, titled: titled};
  }
  function finish(result) {
    result.errors = errors;
    var banner = document.getElementById('errors');
    result.banner = banner ? banner.textContent : null;
    var pre = document.createElement('pre');
    pre.id = 'e2e-result';
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
  function exercise() {
    var result = {initial: count(), cards: document.querySelectorAll('.card .fig').length,
                  states: []};
    document.querySelectorAll('.controls select').forEach(function (sel) {
      var first = sel.value;
      Array.prototype.forEach.call(sel.options, function (opt) {
        sel.value = opt.value;
        sel.dispatchEvent(new Event('change'));
        var c = count();
        c.control = sel.name; c.value = opt.value;
        c.headline = document.getElementById('headline').textContent;
        result.states.push(c);
      });
      sel.value = first;
      sel.dispatchEvent(new Event('change'));
    });
    finish(result);
  }
  var tries = 0;
  function wait() {
    if (document.body && document.body.getAttribute('data-rendered') === 'true') exercise();
    else if (++tries < 200) setTimeout(wait, 50);
    else finish({timeout: true, initial: count()});
  }
  window.addEventListener('load', function () { setTimeout(wait, 0); });
})();
</script>"""


def chromium(args, user_dir, timeout=90):
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={user_dir}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def page(tmp_path_factory, sparse_dashboard):
    """conftest's page written to a file, and its figures."""
    path = sparse_dashboard.write(tmp_path_factory.mktemp("dashboard") / "report.html")
    return path, len(sparse_dashboard.page.slots())


def probe(html: str, tmp_path) -> dict:
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("<head>", "<head>" + PROBE, 1))
    run = chromium(["--virtual-time-budget=30000", "--dump-dom", probed.as_uri()],
                   tmp_path / "profile")
    m = re.search(r'<pre id="e2e-result">(.*?)</pre>', run.stdout, re.S)
    assert m, f"no probe result; chromium exit {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<")
                      .replace("&gt;", ">").replace("&amp;", "&"))


def test_page_renders_every_figure_without_javascript_errors(page, tmp_path):
    path, n_figures = page
    result = probe(path.read_text(), tmp_path)
    assert not result.get("timeout"), result
    assert result["errors"] == [] and not result["banner"], result
    assert result["cards"] == n_figures == 8
    assert result["initial"] == {"plots": 8, "drawn": 8, "titled": 8}
    seen = {(s["control"], s["value"]) for s in result["states"]}
    assert {("hardware", "a100-80gb"), ("batch", "1"), ("context", "16384"),
            ("policy", "quest")} <= seen
    for state in result["states"]:
        assert (state["plots"], state["drawn"], state["titled"]) == (8, 8, 8), state
        assert state["headline"].startswith("Best here:"), state


def test_probe_sees_a_broken_page(page, tmp_path):
    path, _ = page
    html = path.read_text().replace("Plotly.react(el,", "Plotly.notReact(el,", 1)
    html = html.replace("</body>", "<script>undefinedFunction();</script></body>", 1)
    result = probe(html, tmp_path)
    assert result["initial"]["drawn"] == 0
    assert any("undefinedFunction" in e for e in result["errors"]), result["errors"]
    assert "Plotly.notReact is not a function" in result["banner"]


def test_screenshot(page, tmp_path):
    path, _ = page
    shot = tmp_path / "dashboard.png"
    run = chromium(["--window-size=1440,2600", "--virtual-time-budget=15000",
                    f"--screenshot={shot}", path.as_uri()], tmp_path / "profile")
    assert shot.exists() and shot.stat().st_size > 50_000, run.stderr[-2000:]
    keep = Path(os.environ.get("SPECSIM_SCREENSHOT_DIR",
                               Path(tempfile.gettempdir()) / "specsim-dashboard"))
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, keep / "dashboard.png")
    shutil.copy(path, keep / "dashboard.html")
    print(f"\ndashboard screenshot: {keep / 'dashboard.png'} (page: {keep / 'dashboard.html'})")
