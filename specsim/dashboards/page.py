"""HTML assembly: one self-contained page (plotly.js inline, works offline) with a bar of
controls and figure cards, written atomically.

The page knows nothing about speculative decoding. It gets :class:`Control` s (select boxes)
and :class:`Slot` s: one figure position whose figure depends on some of the controls, with a
precomputed figure for every combination of their values (``variants``, keyed by the values
joined with ``|`` in the order of ``deps``). A small script swaps figures with
``Plotly.react`` when a control changes. Identical figures are stored once, the shared plotly
template once, numbers are rounded to :data:`DIGITS` significant digits, and the whole data
block travels gzip-compressed in base64 (unpacked in the browser by ``DecompressionStream``),
so that a page with a few hundred figures stays a few MB beside plotly.js's 4.8 MB.
"""
from __future__ import annotations

import base64
import gzip
import html
import json
import math
import re
from dataclasses import dataclass, field

import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

DIGITS = 4


@dataclass
class Control:
    name: str
    label: str
    options: list[tuple[str, str]]   # (value, label)
    default: str
    help: str = ""


@dataclass
class Slot:
    id: str
    deps: tuple[str, ...]
    variants: dict[str, go.Figure | dict]
    caption: str = ""                # HTML (trusted: written by specsim, not by the user)
    wide: bool = False


@dataclass
class Section:
    title: str
    slots: list[Slot]
    intro: str = ""


@dataclass
class Page:
    title: str
    facts: list[tuple[str, str]]            # header lines: (label, text), escaped on output
    controls: list[Control]
    sections: list[Section]
    headline_deps: tuple[str, ...] = ()
    headlines: dict[str, str] = field(default_factory=dict)   # key → HTML
    warning: str = ""                       # e.g. SYNTHETIC trace (HTML)
    notes: list[str] = field(default_factory=list)            # text, escaped
    footer: str = ""                        # text, escaped
    template: go.layout.Template | None = None

    def slots(self) -> list[Slot]:
        return [s for sec in self.sections for s in sec.slots]


# --------------------------------------------------------------------------------------------
# JSON: compact numbers, shared template, deduplicated figures
# --------------------------------------------------------------------------------------------


def compact(obj, digits: int = DIGITS):
    """Round floats to ``digits`` significant digits (never below the units: 16384 stays
    16384), integral floats to ints, NaN/inf to None; numpy values to Python ones."""
    if isinstance(obj, dict):
        return {k: compact(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [compact(v, digits) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return compact(obj.tolist(), digits)
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        if obj == 0:
            return 0
        decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(obj)))))
        x = round(obj, decimals)
        return int(x) if x == int(x) and abs(x) < 2**53 else x
    return obj


def figure_json(fig: go.Figure | dict) -> dict:
    """Plotly JSON of a figure without its template (the page adds the shared one)."""
    d = fig.to_plotly_json() if isinstance(fig, go.Figure) else dict(fig)
    layout = dict(d.get("layout", {}))
    layout.pop("template", None)
    return compact({"data": d.get("data", []), "layout": layout})


def page_data(page: Page) -> dict:
    figures: list[dict] = []
    index: dict[str, int] = {}
    slots = []
    for slot in page.slots():
        variants = {}
        for key, fig in slot.variants.items():
            fj = figure_json(fig)
            text = json.dumps(fj, separators=(",", ":"), sort_keys=True)
            if text not in index:
                index[text] = len(figures)
                figures.append(fj)
            variants[key] = index[text]
        slots.append({"id": slot.id, "deps": list(slot.deps), "variants": variants})
    template = page.template.to_plotly_json() if page.template is not None else {}
    return {
        "controls": [{"name": c.name, "default": c.default} for c in page.controls],
        "slots": slots, "figures": figures, "template": template,
        "headlines": {"deps": list(page.headline_deps), "variants": page.headlines},
    }


def _script_json(obj) -> str:
    """JSON safe inside a <script> element: every '<' escaped, so nothing can close it."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c")


def _data_element(obj, compress: bool) -> str:
    """The page's data as a script element: gzip + base64 (deterministic: no timestamp), or
    plain JSON with ``compress=False``."""
    if not compress:
        return f'<script type="application/json" id="dashboard-data">{_script_json(obj)}</script>'
    raw = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    packed = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
    return (f'<script type="application/octet-stream" id="dashboard-data" '
            f'data-encoding="gzip+base64">{packed}</script>')


def unpack_page_data(page_html: str) -> dict:
    """The data a rendered page carries (for tests and tools): the inverse of render_page."""
    m = re.search(r'<script type="application/(json|octet-stream)" id="dashboard-data"'
                  r'[^>]*>(.*?)</script>', page_html, re.S)
    if m is None:
        raise ValueError("not a specsim dashboard page")
    if m.group(1) == "json":
        return json.loads(m.group(2))
    return json.loads(gzip.decompress(base64.b64decode(m.group(2))))


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

CSS = """
:root { --ink: #1d1d1f; --muted: #5f6368; --line: #e3e3e6; --bg: #f6f7f9; --accent: #1f6fb4; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 Inter, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif; }
header { background: white; border-bottom: 1px solid var(--line); padding: 18px 28px 14px; }
header h1 { margin: 0 0 6px; font-size: 21px; font-weight: 650; }
.facts { display: flex; flex-wrap: wrap; gap: 4px 26px; color: var(--muted); font-size: 13px; }
.facts b { color: var(--ink); font-weight: 600; }
.warning { margin: 12px 0 0; padding: 9px 14px; border-radius: 6px; background: #fff4d6;
  border: 1px solid #f0c24b; color: #6b4a00; font-size: 13px; }
.warning strong { letter-spacing: .04em; }
.controls { position: sticky; top: 0; z-index: 10; background: rgba(255,255,255,.97);
  border-bottom: 1px solid var(--line); padding: 10px 28px; display: flex; flex-wrap: wrap;
  align-items: center; gap: 10px 22px; box-shadow: 0 1px 4px rgba(0,0,0,.04); }
.controls label { font-size: 12px; color: var(--muted); display: flex; align-items: center;
  gap: 7px; }
.controls select { font: inherit; font-size: 13px; color: var(--ink); padding: 4px 8px;
  border: 1px solid #c9cbd1; border-radius: 5px; background: white; }
#headline { flex: 1 1 420px; font-size: 13px; text-align: right; }
#headline .bad { color: #b2182b; font-weight: 600; }
main { padding: 6px 28px 28px; max-width: 1560px; margin: 0 auto; }
section h2 { font-size: 15px; font-weight: 650; margin: 22px 0 2px; }
section p.intro { margin: 0 0 10px; color: var(--muted); font-size: 13px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr)); gap: 16px; }
.card { background: white; border: 1px solid var(--line); border-radius: 8px;
  padding: 10px 12px 12px; min-width: 0; }
.card.wide { grid-column: 1 / -1; }
.card .fig { width: 100%; min-height: 460px; }
.card p.caption { margin: 6px 4px 0; color: var(--muted); font-size: 12.5px; }
.card .failed { color: #b2182b; padding: 30px; }
#errors { display: none; margin: 10px 28px; padding: 9px 14px; border-radius: 6px;
  background: #fde2e1; border: 1px solid #e08a86; color: #7a1c17; font-size: 13px; }
footer { color: var(--muted); font-size: 12px; padding: 0 28px 24px; max-width: 1560px;
  margin: 0 auto; }
ul.notes { margin: 10px 0 0; padding-left: 18px; color: var(--muted); font-size: 12.5px; }
"""

# Errors are collected from the very first script on and shown in a banner (and kept in
# window.specsimErrors for tests), so that a broken page never looks merely empty.
ERROR_HOOK = """
window.specsimErrors = [];
(function () {
  function show(msg) {
    window.specsimErrors.push(String(msg));
    var box = document.getElementById('errors');
    if (box) { box.style.display = 'block';
      box.textContent = 'This page hit an error; some figures may be missing: ' +
        window.specsimErrors.join(' | '); }
  }
  window.specsimShowError = show;
  window.addEventListener('error', function (e) { show(e.message || e); });
  window.addEventListener('unhandledrejection', function (e) { show(e.reason); });
})();
"""

APP = """
(function () {
  // the figure data is gzip-compressed JSON in base64 (a fifth of the size of plain JSON)
  function loadData() {
    var el = document.getElementById('dashboard-data');
    if (el.getAttribute('data-encoding') !== 'gzip+base64')
      return Promise.resolve(JSON.parse(el.textContent));
    if (typeof DecompressionStream === 'undefined')
      return Promise.reject(new Error('this browser cannot decompress the figure data ' +
                                      '(DecompressionStream): use a browser from 2023 or later'));
    var bin = atob(el.textContent.trim()), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(stream).text().then(JSON.parse);
  }
  loadData().then(start).catch(function (err) {
    window.specsimShowError(err && err.message ? err.message : err);
  });
  function start(DASH) {
  var CONFIG = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ['lasso2d', 'select2d', 'autoScale2d'],
                toImageButtonOptions: {format: 'png', scale: 2}};
  var state = {};
  DASH.controls.forEach(function (c) {
    var el = document.getElementById('control-' + c.name);
    state[c.name] = el ? el.value : c.default;
    if (el) el.addEventListener('change', function () { state[c.name] = el.value; render(); });
  });
  function keyOf(deps) { return deps.map(function (d) { return state[d]; }).join('|'); }
  function clone(x) { return JSON.parse(JSON.stringify(x)); }
  function regimeMarker(layout) {
    var m = layout.meta && layout.meta.regime;
    if (!m) return;
    var ib = m.batches.map(String).indexOf(state.batch);
    var ic = m.contexts.map(String).indexOf(state.context);
    if (ib < 0 || ic < 0) return;
    layout.shapes = (layout.shapes || []).concat([{type: 'rect', xref: 'x', yref: 'y',
      x0: ic - 0.5, x1: ic + 0.5, y0: ib - 0.5, y1: ib + 0.5,
      line: {color: '#111', width: 2.5, dash: 'dot'}, fillcolor: 'rgba(0,0,0,0)'}]);
  }
  function render() {
    DASH.slots.forEach(function (slot) {
      var el = document.getElementById(slot.id);
      var i = slot.variants[keyOf(slot.deps)];
      try {
        if (i === undefined) throw new Error('no figure for ' + keyOf(slot.deps));
        var fig = clone(DASH.figures[i]);
        fig.layout.template = DASH.template;
        regimeMarker(fig.layout);
        Plotly.react(el, fig.data, fig.layout, CONFIG);
      } catch (err) {
        window.specsimShowError(slot.id + ': ' + (err && err.message ? err.message : err));
      }
    });
    var h = document.getElementById('headline');
    if (h) h.innerHTML = DASH.headlines.variants[keyOf(DASH.headlines.deps)] || '';
  }
  render();
  document.body.setAttribute('data-rendered', 'true');
  }
})();
"""


def _controls_html(controls: list[Control]) -> str:
    parts = []
    for c in controls:
        opts = "".join(
            f'<option value="{html.escape(v)}"{" selected" if v == c.default else ""}>'
            f"{html.escape(label)}</option>" for v, label in c.options)
        title = f' title="{html.escape(c.help)}"' if c.help else ""
        parts.append(f'<label{title}>{html.escape(c.label)} <select id="control-{c.name}" '
                     f'name="{c.name}">{opts}</select></label>')
    return "".join(parts)


def _card_html(slot: Slot) -> str:
    cls = "card wide" if slot.wide else "card"
    caption = f'<p class="caption">{slot.caption}</p>' if slot.caption else ""
    return f'<div class="{cls}"><div class="fig" id="{slot.id}"></div>{caption}</div>'


def render_page(page: Page, compress: bool = True) -> str:
    data = page_data(page)
    facts = "".join(f"<span>{html.escape(label)} <b>{html.escape(text)}</b></span>"
                    for label, text in page.facts)
    warning = f'<div class="warning">{page.warning}</div>' if page.warning else ""
    if page.notes:
        warning += ('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>"
                                                   for n in page.notes) + "</ul>")
    sections = []
    for sec in page.sections:
        intro = f'<p class="intro">{sec.intro}</p>' if sec.intro else ""
        cards = "".join(_card_html(s) for s in sec.slots)
        sections.append(f"<section><h2>{html.escape(sec.title)}</h2>{intro}"
                        f'<div class="grid">{cards}</div></section>')
    footer = f"<footer>{html.escape(page.footer)}</footer>" if page.footer else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="specsim; plotly.py {plotly.__version__}">
<title>{html.escape(page.title)}</title>
<style>{CSS}</style>
<script>{ERROR_HOOK}</script>
</head>
<body>
<header><h1>{html.escape(page.title)}</h1><div class="facts">{facts}</div>{warning}</header>
<div class="controls">{_controls_html(page.controls)}<div id="headline"></div></div>
<div id="errors"></div>
<main>{''.join(sections)}</main>
{footer}
<script type="text/javascript">{get_plotlyjs()}</script>
{_data_element(data, compress)}
<script>{APP}</script>
</body>
</html>
"""


