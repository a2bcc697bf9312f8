"""Time-resolved per-unit counters (links, channels, slices, DMA engines), the contention /
topology / roofline plots, report.html, the trace's counter tracks and the Python API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import archsim
from archsim.api import Result
from archsim.config.load import load_machine
from archsim.errors import InputError
from archsim.report import jsonfmt
from test_cli import cli, one_line_error

RUN = ("--workload", "tiny", "--layers", "1")


@pytest.fixture(scope="module")
def sunway_runs(tmp_path_factory):
    """tiny-sunway decode in both placements, with --out (plots, report, trace)."""
    out = {}
    for placement in ("cross", "private"):
        d = tmp_path_factory.mktemp(placement)
        code = archsim.cli.main(["run", "--hw", "tiny-sunway", *RUN, "--phase", "decode", "--batch", "2",
                                 "--placement", placement, "--out", str(d), "--trace"])
        assert code == 0
        out[placement] = d
    return out


def _matrix(k, fam, name):
    tl = k["timeline"]
    return tl["units"][fam], np.array([[np.nan if v is None else v for v in r] for r in tl["matrices"][name]], float)


def test_unit_rows_end_at_the_kernel_totals():
    """The last cumulative row of every unit equals the block's own end-of-kernel counters."""
    from archsim.engine.machine import TL_COUNTERS
    from archsim.engine.timing import time_kernel
    from archsim.engine.unit_timeline import FAMILY_COUNTERS
    from archsim.isa.examples import load_example, make_args

    machine = load_machine("tiny-gpu")
    args, launch = make_args("vector_add", 0)
    t = time_kernel(load_example("vector_add"), machine, launch, args, window_cycles=256)
    window, rows = t.timeline
    lay = t.timeline_units
    last = rows[-1, len(TL_COUNTERS):]
    links = t.memory["fabric"]["links"]
    fab_cycles = max(t.memory["now_fab"], 1)
    o = lay["links"]["counters"]
    for j, x in enumerate(links):
        assert last[o["busy"] + j] == round(x["util"] * fab_cycles)
        assert last[o["blocked"] + j] == x["blocked_cycles"]
    o = lay["channels"]["counters"]
    for c, rec in enumerate(t.memory["dram"]):
        assert last[o["bytes"] + c] == rec["bytes_read"] + rec["bytes_written"]
        assert last[o["row_hits"] + c] == rec["row_hits"]
        assert last[o["queue_area"] + c] == rec["queue_occupancy_sum"]
    o = lay["l2_slices"]["counters"]
    for s, rec in enumerate(t.memory["l2"]):
        assert last[o["accesses"] + s] == rec["accesses"] and last[o["hits"] + s] == rec["hits"]
    assert set(lay) == {"links", "channels", "l2_slices"} and set(FAMILY_COUNTERS) >= set(lay)
    assert len(rows) > 2 and np.all(np.diff(rows[:, len(TL_COUNTERS):len(TL_COUNTERS) + o["accesses"]], axis=0) >= 0)


def test_matrices_sum_to_the_kernel_totals():
    """Per-window channel GB/s x window seconds adds up to each channel's bytes; link
    utilization x link cycles to its busy cycles (4 significant digits)."""
    r = archsim.run(archsim.load_machine("tiny-gpu"), archsim.load_workload("tiny", layers=1)).record
    m = r["machine"]
    for k in r["kernels"]:
        tl = k["timeline"]
        win = tl["matrix_window_cycles"]
        names, g = _matrix(k, "channels", "channel_gbps")
        n = g.shape[0]
        cyc = np.full(n, float(win))
        cyc[-1] = tl["matrix_end_cycle"] - (n - 1) * win
        assert tl["matrix_end_cycle"] == k["cycles"]  # not sampled: the matrices cover the launch
        got = (g * (cyc / (m["clock_ghz"] * 1e9))[:, None]).sum(axis=0) * 1e9
        want = [mc["gbps"] * k["seconds"] * 1e9 for mc in k["memory_controllers"]]
        assert got == pytest.approx(want, rel=2e-3, abs=64)
        lnames, u = _matrix(k, "links", "link_util")
        ratio = m["fabric_clock_ghz"] / m["clock_ghz"]
        busy = (u * (cyc * ratio)[:, None]).sum(axis=0)
        tot = {x["name"]: x["util"] for x in k["fabric"]["links"]}
        fab = k["cycles"] * ratio
        assert busy == pytest.approx([tot[nm] * fab for nm in lnames], rel=2e-3, abs=3)
        assert n <= 64 and len(tl["matrices"]["link_util"][0]) == len(lnames)


def test_private_placement_leaves_the_ring_between_groups_idle(sunway_runs):
    """The figure of the issue on tiny-sunway: cross placement loads the ring links between core
    groups, private placement never touches them."""
    busiest = {}
    for placement, d in sunway_runs.items():
        r = json.loads((d / "result.json").read_text())
        mx = 0.0
        for k in r["kernels"]:
            names, u = _matrix(k, "links", "link_util")
            ring = [i for i, n in enumerate(names) if " ring cg" in n]
            assert ring, names
            mx = max(mx, float(np.nanmax(u[:, ring])))
        busiest[placement] = mx
    assert busiest["private"] == 0.0 and busiest["cross"] > 0.2


def test_out_dir_has_every_plot_and_a_self_contained_report(sunway_runs):
    d = sunway_runs["cross"]
    for f in ("kernels.png", "timeline.png", "contention.png", "topology.png", "roofline.png"):
        assert (d / f).stat().st_size > 5000, f
    page = _parse(d / "report.html")
    assert page.images >= 5 and page.external == 0
    r = json.loads((d / "result.json").read_text())
    assert page.rows == len(r["kernels"]) + 1  # the kernel table: a header row and one per kernel
    assert "tiny-sunway" in page.text
    tr = json.loads((d / "trace.json").read_text())
    names = {e["name"] for e in tr["traceEvents"] if e["ph"] == "C"}
    assert any(n.endswith(" util") for n in names) and any(n.startswith("mc0") and n.endswith("queue") for n in names)


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images = self.external = self.rows = 0
        self.text = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images += 1
            self.external += not a.get("src", "").startswith("data:image/png;base64,")
        if tag in ("script", "link") or (tag == "a" and a.get("href", "").startswith("http")):
            self.external += 1
        if tag == "tr":
            self.rows += 1

    def handle_data(self, data):
        self.text += data


def _parse(path):
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_compare_report_shows_the_machines_side_by_side(capsys, tmp_path):
    out = tmp_path / "cmp"
    code, _, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", *RUN, "--phase", "decode",
                       "--out", str(out))
    assert code == 0, err
    for m in ("tiny-gpu", "tiny-sunway"):
        for base in ("kernels", "contention", "topology"):
            assert (out / f"{base}-{m}.png").exists()
    assert (out / "compare.png").exists() and (out / "roofline.png").exists()
    page = _parse(out / "report.html")
    assert page.images >= 8 and page.external == 0 and "tiny-gpu" in page.text and "tiny-sunway" in page.text


def test_plot_of_a_record_without_unit_counters_draws_the_rest(capsys, tmp_path, sunway_runs):
    r = json.loads((sunway_runs["cross"] / "result.json").read_text())
    for k in r["kernels"]:
        for key in ("units", "matrices", "matrix_window_cycles"):
            k["timeline"].pop(key)
    f = tmp_path / "old.json"
    f.write_text(json.dumps(r))
    code, text, err = cli(capsys, "plot", str(f))
    assert code == 0
    assert (tmp_path / "kernels.png").exists() and (tmp_path / "report.html").exists()
    assert not (tmp_path / "contention.png").exists()
    assert "not drawn: contention.png" in err and "Traceback" not in err


def test_plot_of_a_partial_record_says_what_was_not_drawn(capsys, tmp_path):
    f = tmp_path / "r.json"
    code, _, _ = cli(capsys, "run", "--hw", "tiny-gpu", *RUN, "--max-cycles", "10", "--json", str(f))
    assert code == 3
    code, text, err = cli(capsys, "plot", str(f), "--out", str(tmp_path / "p"))
    assert code == 0 and "not drawn" in err and "Traceback" not in err
    assert not list((tmp_path / "p").glob("*.png"))  # nothing blank


def test_plot_kernel_option(capsys, tmp_path, sunway_runs):
    d = sunway_runs["cross"]
    code, _, err = cli(capsys, "plot", str(d), "--out", str(tmp_path), "--kernel", "no-such-kernel")
    assert code == 2 and "--kernel" in one_line_error(err) and "qkv" in err
    code, _, err = cli(capsys, "plot", str(d), "--out", str(tmp_path), "--kernel", "qkv")
    assert code == 0 and (tmp_path / "topology.png").exists()


def test_micro_out_writes_its_plots(capsys, tmp_path):
    code, _, err = cli(capsys, "micro", "bandwidth", "--hw", "tiny-gpu", "--param", "footprint_mib=1",
                       "--out", str(tmp_path))
    assert code == 0, err
    assert (tmp_path / "micro.json").exists() and (tmp_path / "contention.png").exists()
    code, text, _ = cli(capsys, "plot", str(tmp_path / "micro.json"), "--out", str(tmp_path / "again"))
    assert code == 0 and (tmp_path / "again" / "report.html").exists()


def test_python_api(tmp_path):
    m = archsim.load_machine("tiny-gpu", set={"dram.channel_gbps": 40})
    assert m.dram.channel_gbps == 40
    wl = archsim.load_workload("tiny", phase="decode", batch=2, layers=1)
    r = archsim.run(m, wl)
    df = r.kernels
    assert list(df["name"]) == [k["name"] for k in r.record["kernels"]]
    assert df["cycles"].sum() == sum(k["cycles"] for k in r.record["kernels"])
    assert r.plot_roofline(tmp_path / "roof.png").stat().st_size > 5000
    assert r.report(tmp_path / "rep").exists()
    c = archsim.compare([m, archsim.load_machine("tiny-sunway")], wl)
    assert set(c.kernels["machine"]) == {"tiny-gpu", "tiny-sunway"}
    with pytest.raises(InputError):
        archsim.load_workload("tiny", heads=3)
    with pytest.raises(InputError):
        archsim.run(m, wl, speed=2)


_scalars = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False), st.none(),
                     st.booleans(), st.text(max_size=12))
_docs = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                     max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_docs)
def test_json_text_round_trips(doc):
    assert json.loads(jsonfmt.dumps(doc)) == doc


# strings without quotes or backslashes: the regex rule below misreads an escaped quote as a
# string's end (the writer keeps such a list indented; test_json_text_keeps_the_rule_on_odd_values)
_plain = st.text(alphabet=st.characters(blacklist_characters='"\\'), max_size=12)
_plain_docs = st.recursive(st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False),
                                     st.none(), st.booleans(), _plain),
                           lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                   st.dictionaries(_plain, inner, max_size=4)), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_plain_docs)
def test_json_text_is_the_indented_dump_with_flat_lists(doc):
    assert jsonfmt.dumps(doc) == _indented_with_flat_lists(doc)


# the writer's rule, applied to json.dumps's own indented text: every list of scalars on one line
_FLAT_LIST = re.compile(r'\[\s*((?:(?:-?[\d.eE+-]+|null|true|false|"[^"\[\]{}\n]*")\s*,\s*)*'
                        r'(?:-?[\d.eE+-]+|null|true|false|"[^"\[\]{}\n]*"))\s*\]')


def _indented_with_flat_lists(obj) -> str:
    text = json.dumps(obj, indent=2)
    return _FLAT_LIST.sub(lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)


def test_json_text_keeps_the_rule_on_odd_values():
    """Non-finite numbers, strings with quotes or brackets, and keys that are not strings: written
    as json.dumps writes them, and a list holding any of the first two not joined."""
    doc = {"t": [[1, 2.5, None], [True, "a b"]], "s": ['say "x"', "y"], "n": [float("nan"), 1], "b": ["a[b", "c"],
           1: {}, None: [], 2.5: (1, 2)}
    text = jsonfmt.dumps(doc)
    assert text == _indented_with_flat_lists(doc)
    assert '[1, 2.5, null]' in text and '"null": []' in text and '"2.5": [1, 2]' in text
    assert jsonfmt.dumps(['"]']) == '[\n  "\\"]"\n]'          # a quote then a bracket: kept indented


@pytest.mark.skipif(not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")),
                    reason="no headless browser on this machine")
def test_report_renders_in_a_headless_browser(sunway_runs, tmp_path):
    b = next(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b))
    shot = tmp_path / "page.png"
    subprocess.run([b, "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}",
                    (sunway_runs["cross"] / "report.html").as_uri()], check=True, timeout=120)
    assert shot.stat().st_size > 10000


def test_clock_conversion_is_exact_at_any_run_length():
    """Window boundaries convert to a clock domain's cycles exactly (no int64 overflow, no rounding
    of the parts), so a sample inside a skip-ahead jump counts the cycles stepping would have."""
    import random

    from archsim.engine.unit_timeline import cycles_before

    rnd = random.Random(7)
    for _ in range(3000):
        t, r = rnd.randrange(0, 1 << 43), rnd.randrange(1, 1 << 34)
        assert int(cycles_before(np.int64(t), np.int64(r))) == t * r >> 32


def test_unit_matrices_are_the_same_with_skip_ahead_on_or_off(monkeypatch):
    """Sunway: DMA, ring and mesh; the blocked cycles of skipped gaps are counted up to each boundary."""
    import archsim.micro as MI
    from archsim.engine import timing

    m = load_machine("tiny-sunway")
    a = MI.run_micro("bandwidth", m, {"footprint_mib": 0.25})
    orig = timing.time_kernel
    monkeypatch.setattr(MI, "time_kernel", lambda *x, **kw: orig(*x, **dict(kw, skip=False)))
    b = MI.run_micro("bandwidth", m, {"footprint_mib": 0.25})
    ka, kb = a.kernels[0], b.kernels[0]
    assert ka["skipped_cycles"] > 0 and kb["skipped_cycles"] == 0
    assert ka["timeline"]["units"] == kb["timeline"]["units"] and ka["timeline"]["matrices"] == kb["timeline"]["matrices"]
    assert any(v for row in ka["timeline"]["matrices"]["link_blocked"] for v in row)


def test_records_are_valid_json_and_counts_are_integers(sunway_runs):
    text = (sunway_runs["cross"] / "result.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    r = json.loads(text)
    k = max(r["kernels"], key=lambda k: k["cycles"])
    assert all(isinstance(v, int) for row in k["timeline"]["matrices"]["link_blocked"] for v in row)


def test_topology_of_a_fabric_it_cannot_draw_says_so(capsys, tmp_path, sunway_runs):
    r = json.loads((sunway_runs["cross"] / "result.json").read_text())
    for k in r["kernels"]:
        for x in k["fabric"]["links"]:
            x["name"] = x["name"].replace("ring", "bus")
    f = tmp_path / "other.json"
    f.write_text(json.dumps(r))
    code, _, err = cli(capsys, "plot", str(f))
    assert code == 0 and "not drawn: topology.png" in err and "neither a ring" in err
    assert (tmp_path / "roofline.png").exists() and "failed" not in err


def test_functional_and_empty_results_say_why_nothing_was_drawn(capsys, tmp_path):
    f = tmp_path / "fn.json"
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", *RUN, "--mode", "functional", "--json", str(f))
    assert code == 0, err
    code, _, err = cli(capsys, "plot", str(f), "--out", str(tmp_path / "p"))
    assert code == 0 and "functional run has no timing" in err
    r = Result(json.loads(f.read_text()))
    with pytest.raises(InputError):
        r.report(tmp_path / "q")
    with pytest.raises(InputError, match="sample-waves"):
        archsim.run(archsim.load_machine("tiny-gpu"), archsim.load_workload("tiny"), waves=2)

