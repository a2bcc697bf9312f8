"""``report.html``: one self-contained page (images inlined as data: URIs, no scripts, no links
out) with a run's header, its kernel table and every plot; a compare shows the machines side by
side."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from archsim.report.files import write_text
from archsim.report.roofline import kernel_bound
from archsim.report.tables import top_stall

CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:13px;
margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f0f0f0}
td.n,th.n{text-align:left}.side{display:flex;gap:1em;flex-wrap:wrap}.side>div{flex:1;min-width:420px}
img{max-width:100%;border:1px solid #ddd;margin:.3em 0}.note{color:#a33;font-size:13px}
h2{margin-top:1.4em;border-bottom:1px solid #ddd}"""


def _e(x) -> str:
    return html.escape(str(x))


def img_tag(path: Path) -> str:
    """A PNG inlined as a data: URI."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{_e(Path(path).stem)}" src="data:image/png;base64,{data}">'


def _header(r: dict) -> str:
    m, w, t = r["machine"], r.get("workload", {}), r.get("total", {})
    scen = ", ".join(f"{k} {_e(v)}" for k, v in w.items() if k != "name" and not isinstance(v, (dict, list)))
    status = "" if r.get("complete", True) else ' <span class="note">(partial: the run stopped early)</span>'
    return (f"<p><b>{_e(m['name'])}</b> ({_e(m.get('family', ''))}, {m.get('cores', '?')} cores at "
            f"{m.get('clock_ghz', '?')} GHz, DRAM {m.get('peak_dram_gbps', 0):,.0f} GB/s) running "
            f"<b>{_e(w.get('name', ''))}</b>: {scen}{status}</p>"
            f"<p>total {t.get('seconds', 0) * 1e3:,.3f} ms, {t.get('cycles', 0):,} cycles, "
            f"{t.get('tflops', 0):,.2f} TFLOP/s; simulated in {r.get('sim', {}).get('wall_seconds', 0):,.1f} s</p>")


def _kernel_table(r: dict) -> str:
    rows = ["<tr><th class=n>kernel</th><th>count</th><th>cycles</th><th>time (us)</th><th>TFLOP/s</th>"
            "<th>DRAM GB/s</th><th>bound (share of peak)</th><th>link util max</th><th>top stall</th>"
            "<th>sampled (error)</th></tr>"]
    for k in r.get("kernels", []):
        samp = f"yes ({k.get('sample_error_est', 0):.1%})" if k.get("sampled") else "no"
        rows.append(f"<tr><td class=n>{_e(k['name'])}</td><td>{k.get('count', 1)}</td><td>{k['cycles']:,}</td>"
                    f"<td>{k['seconds'] * 1e6:,.1f}</td><td>{k.get('tflops', 0):.2f}</td>"
                    f"<td>{k.get('bandwidth_gbps', {}).get('dram', 0):,.1f}</td><td>{_e(kernel_bound(k, r))}</td>"
                    f"<td>{k.get('fabric', {}).get('link_util_max', 0):.2f}</td>"
                    f"<td>{_e(top_stall(k))}</td><td>{samp}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def write_report(doc: dict, results: list[dict], images: list[Path], missing: list[str], path: Path) -> Path:
    """The page for one result or a comparison (``results``: the timed results in it)."""
    by_name = {Path(p).name: Path(p) for p in images if Path(p).suffix == ".png"}
    multi = doc.get("schema") == "archsim.compare/1"
    w = results[0].get("workload", {})
    title = (f"archsim: {w.get('name', '')} {w.get('phase', '')} on "
             + (" vs ".join(r["machine"]["name"] for r in results)))
    parts = [f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{CSS}</style>"
             f"</head><body><h1>{_e(title)}</h1>"]
    if missing:
        parts.append("".join(f'<p class="note">not drawn: {_e(x)}</p>' for x in missing))
    sfx = (lambda r: f"-{r['machine']['name']}") if multi else (lambda r: "")
    if multi and "compare.png" in by_name:
        parts.append("<h2>comparison</h2>" + img_tag(by_name["compare.png"]))
    parts.append('<h2>runs</h2><div class="side">')
    for r in results:
        parts.append(f"<div><h3>{_e(r['machine']['name'])}</h3>{_header(r)}{_kernel_table(r)}</div>")
    parts.append("</div>")
    if "roofline.png" in by_name:
        parts.append("<h2>roofline</h2>" + img_tag(by_name["roofline.png"]))
    for base, head in (("kernels", "kernel times and stalls"), ("timeline", "timeline"),
                       ("contention", "memory contention over time"), ("topology", "fabric topology")):
        imgs = [(r, by_name.get(f"{base}{sfx(r)}.png")) for r in results]
        if not any(p for _, p in imgs):
            continue
        parts.append(f"<h2>{head}</h2>")
        if multi:
            parts.append('<div class="side">' + "".join(
                f"<div><h3>{_e(r['machine']['name'])}</h3>{img_tag(p) if p else ''}</div>" for r, p in imgs) + "</div>")
        else:
            parts.append(img_tag(imgs[0][1]))
    parts.append("</body></html>")
    write_text(path, "\n".join(parts))
    return path
