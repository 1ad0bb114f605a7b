"""report.html in a real browser: Debian's headless Chromium opens the file (file://, no server) of a
concurrency sweep and of a two-run `kvplan report` comparison, and the test checks what it rendered:

* the DOM after parsing (``--dump-dom``): the six charts html.py draws, in order, each an SVG in the
  SVG namespace inside its figure, none "no data";
* the layout (a copy of the page with a measuring script appended, its results dumped with the DOM):
  every series a path with finite coordinates inside the plot, one dot per point, higher values drawn
  higher, the legend above the plot, no two labels overlapping, nothing outside its chart or the page;
* the onsets, predicted and measured, in the table and as vertical lines named in the legend;
* the pixels (``--screenshot``): every chart's area has the series colours and is not blank;
* the network: the page asked for nothing (Resource Timing, and Chromium's own net log), with a
  control page that does fetch proving both checks see requests.

Skipped, with the reason, only when /usr/bin/chromium is absent and KVPLAN_REQUIRE_BROWSER is unset
(or 0); with KVPLAN_REQUIRE_BROWSER=1 (CI) a missing browser fails the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

from kvplan.bench.outputs.html import COLOURS, ONSET_COLOURS, SLO_COLOUR

CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_BROWSER = os.environ.get("KVPLAN_REQUIRE_BROWSER", "") not in ("", "0")
TIMEOUT_S = 60
WINDOW = (1200, 4000)  # CSS px = screenshot px (device scale factor 1)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists() and not REQUIRE_BROWSER,
    reason="/usr/bin/chromium is not installed (apt-get install chromium); set KVPLAN_REQUIRE_BROWSER=1 to fail instead")

# The charts html.py draws, in order (titles = the SVGs' aria-labels), and the series each has per run.
CHARTS = {
    "TTFT vs load (ms)": ["p50", "p99"],
    "ITL per token vs load (ms)": ["p50", "p99"],
    "E2E vs load (ms)": ["p50", "p99"],
    "Throughput and goodput vs load (output tok/s)": ["throughput", "goodput"],
    "KV cache fill vs load (%)": ["measured peak", "predicted"],
    "Preemptions vs load": ["preemptions"],
}
ONSET_CHARTS = {"TTFT vs load (ms)", "KV cache fill vs load (%)", "Preemptions vs load"}  # vertical lines
# A single run's page then draws the server's scraped figures over the run's time, points end to end.
SWEEP = [1, 2, 4, 8]
TIMELINE = {
    "KV cache usage over time (%)": ["KV usage"],
    "Requests over time": ["running", "waiting"],
    "Preemptions over time (run total)": ["preemptions"],
    # ... and its TTFT distribution, a line per load (requests.jsonl)
    "TTFT distribution by load": [f"concurrency {c}" for c in SWEEP],
}
SVG_NS = "http://www.w3.org/2000/svg"

# Appended to a copy of the page: once it has loaded, measures what Chromium laid out and writes it into
# the DOM as JSON, which --dump-dom prints. The report itself has no script; this one only reads.
PROBE = r"""<script>
addEventListener("load", () => {
  const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const text = (el) => (el ? el.textContent : null);
  const attr = (el, name) => (el ? el.getAttribute(name) || "" : null);
  let out;
  try {
    const charts = [...document.querySelectorAll("svg")].map((svg) => ({
      label: svg.getAttribute("aria-label"),
      parent: svg.parentElement.tagName.toLowerCase(),
      in_charts: !!svg.closest("div.charts"),
      box: box(svg),
      ns: svg.namespaceURI,
      foreign: [...svg.querySelectorAll("*")].filter((e) => e.namespaceURI !== svg.namespaceURI).map((e) => e.tagName),
      tags: [...new Set([...svg.querySelectorAll("*")].map((e) => e.tagName))],
      title: text(svg.querySelector("text.t")),
      frame: box(svg.querySelector("rect.frame")),
      texts: [...svg.querySelectorAll("text")].map((t) => ({s: t.textContent, box: box(t), legend: !!t.closest("g.legend")})),
      legend: [...svg.querySelectorAll("g.legend")].map((g) => ({
        s: text(g.querySelector("text")), colour: attr(g.querySelector("line"), "stroke"),
        dash: attr(g.querySelector("line"), "stroke-dasharray"), box: box(g)})),
      paths: [...svg.querySelectorAll("path")].map((p) => ({
        d: p.getAttribute("d"), colour: p.getAttribute("stroke"), computed: getComputedStyle(p).stroke,
        dash: attr(p, "stroke-dasharray"), length: p.getTotalLength(), box: box(p)})),
      dots: [...svg.querySelectorAll("circle")].map((c) => ({
        colour: c.getAttribute("fill"), title: text(c.querySelector("title")), box: box(c)})),
      vlines: [...svg.querySelectorAll(":scope > line[stroke-dasharray]:not(.target)")].map((l) => ({
        colour: l.getAttribute("stroke"), dash: l.getAttribute("stroke-dasharray"),
        name: text(l.querySelector("title")), box: box(l)})),
      targets: [...svg.querySelectorAll(":scope > line.target")].map((l) => ({
        colour: l.getAttribute("stroke"), dash: l.getAttribute("stroke-dasharray"),
        name: text(l.querySelector("title")), box: box(l)})),
    }));
    out = {
      charts,
      empty: document.querySelectorAll("figure .empty").length,
      page: {width: innerWidth, scroll_width: document.documentElement.scrollWidth},
      resources: performance.getEntriesByType("resource").map((e) => e.name),
      runs: [...(document.querySelector("table") || {rows: []}).rows].map((r) => [...r.cells].map((c) => c.textContent)),
    };
  } catch (e) {
    out = {probe_error: String((e && e.stack) || e)};
  }
  const pre = document.createElement("pre");
  pre.id = "kvplan-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


# ----------------------------------------------------------------------------------------- browser


@pytest.fixture(scope="module", autouse=True)
def _browser():
    if not CHROMIUM.exists():  # only reached with KVPLAN_REQUIRE_BROWSER set (else the module is skipped)
        pytest.fail(f"KVPLAN_REQUIRE_BROWSER is set but {CHROMIUM} is missing (apt-get install chromium)")


def chromium(url: str, *args: str) -> tuple[str, str, list[str]]:
    """Run headless Chromium on ``url`` with a fresh profile, bounded by TIMEOUT_S (then killed, with
    every process it started: it runs in its own session). Returns stdout, stderr and the URLs the page
    asked the network for (from Chromium's net log)."""
    with tempfile.TemporaryDirectory(prefix="kvplan-chromium-") as tmp:
        profile, netlog = Path(tmp) / "profile", Path(tmp) / "netlog.json"
        profile.mkdir()
        cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", "--force-device-scale-factor=1", "--hide-scrollbars",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", "--enable-logging=stderr", "--v=0",
               f"--log-net-log={netlog}", *args, url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group this call started, by its id
            out, err = proc.communicate()
            pytest.fail(f"chromium did not finish {url} in {TIMEOUT_S} s; stderr:\n{err[-3000:]}")
        assert proc.returncode == 0, f"chromium exited {proc.returncode}; stderr:\n{err[-3000:]}"
        return out, err, page_requests(netlog)


def page_requests(netlog: Path) -> list[str]:
    """The URLs a page asked the network stack for (Chromium's own background requests carry no
    initiator: "not an origin"; a page's carry its origin, "null" for file://)."""
    data = json.loads(netlog.read_text())
    start = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in data["events"]
            if e["type"] == start and "url" in e.get("params", {}) and e["params"].get("initiator") != "not an origin"]


def probe_data(dom: str) -> dict:
    import html

    found = re.search(r'<pre id="kvplan-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe script did not run"
    data = json.loads(html.unescape(found.group(1)))
    assert "probe_error" not in data, f"the page broke the probe: {data.get('probe_error')}"
    return data


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "net::ERR" in line or "Failed to load resource" in line or ":CONSOLE" in line]


class _Urls(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [f"{tag} {k}={v}" for k, v in attrs
                      if k in ("src", "href", "srcset", "data", "poster", "action", "xlink:href") and v]


def render(html: Path, tmp: Path) -> dict:
    """What Chromium made of ``html``: its measured layout, its DOM, its screenshot, its requests."""
    text = html.read_text(encoding="utf-8")
    assert text.count("</body>") == 1
    parser = _Urls()
    parser.feed(text)
    assert parser.urls == [], parser.urls  # nothing to load: no src, href, ... at all
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text

    probe = tmp / f"{html.stem}-probe.html"
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom, err, requests = chromium(probe.as_uri(), "--dump-dom")
    layout = probe_data(dom)
    requests += layout["resources"]
    errors = console_errors(err)

    png = tmp / f"{html.stem}.png"
    _, err2, requests2 = chromium(html.as_uri(), f"--screenshot={png}")
    requests += requests2
    errors += console_errors(err2)
    assert png.is_file() and png.stat().st_size > 10_000, err2[-3000:]
    return {"layout": layout, "dom": dom, "png": png, "requests": requests, "errors": errors}


# ----------------------------------------------------------------------------------------- runs


def _fake_metrics(b: FakeBehaviour, blocks: int):
    """/metrics of a pool of ``blocks`` blocks of 32 tokens (one is vLLM's null block) where each
    request (prompt 100 + output 40) is admitted with 4 blocks: KV fill grows with the requests in
    flight, those that do not fit wait, and beyond one more the counter of preemptions grows."""
    state = {"preempted": 0}
    fit = (blocks - 1) // 4

    def text(scrape: int) -> str:
        f = b.in_flight
        state["preempted"] += max(0, f - fit - 1)
        labels = '{engine="0",model_name="fake"}'
        return "".join([
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {min(f, fit)}.0\n",
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} {max(0, f - fit)}.0\n",
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{labels} {min(1.0, 4 * f / (blocks - 1)):.3f}\n",
            f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{labels} {state['preempted']}.0\n",
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{num_gpu_blocks="{blocks}",block_size="32"}} 1.0\n'])

    return text


def _sweep(out: Path, token_gap_s: float, blocks: int) -> Path:
    b = FakeBehaviour(first_token_delay_s=0.02, token_gap_s=token_gap_s)
    b.metrics_text = _fake_metrics(b, blocks)
    with FakeServer(b) as srv:
        proc = subprocess.run(kvplan_cmd(
            "--url", srv.url, "--sweep", ",".join(map(str, SWEEP)), "--requests-per-stream", "2",
            "--prompt", "100", "--output", "40", "--slo", "ttft_p99=1s,e2e_p99=10s", "--scrape-interval", "0.05",
            "--no-warmup", "--out", str(out), "--json"), capture_output=True, text=True, env=bench_env(), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = out.iterdir()
    return run


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A concurrency sweep's report.html as `kvplan bench` wrote it, and `kvplan report`'s comparison
    of it with a slower second run on a larger pool (copied to named folders: the legend names the runs
    by folder)."""
    tmp = tmp_path_factory.mktemp("browser")
    fast, slow = _sweep(tmp / "fast", 0.004, 17), _sweep(tmp / "slow", 0.008, 21)
    a, b = tmp / "compare" / "run-fast", tmp / "compare" / "run-slow"
    shutil.copytree(fast, a)
    shutil.copytree(slow, b)
    compare = tmp / "compare.html"
    proc = subprocess.run([sys.executable, "-m", "kvplan", "report", str(a), str(b), "--html", str(compare)],
                          capture_output=True, text=True, env=bench_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((fast / "summary.json").read_text())
    return {"sweep": (fast / "report.html", summary), "compare": (compare, ["run-fast", "run-slow"]), "tmp": tmp}


@pytest.fixture(scope="module")
def sweep_page(reports):
    html, summary = reports["sweep"]
    return render(html, reports["tmp"]), summary


@pytest.fixture(scope="module")
def compare_page(reports):
    html, names = reports["compare"]
    return render(html, reports["tmp"]), names


# ----------------------------------------------------------------------------------------- checks


def _overlap(a, b, slack=0.5) -> bool:
    return a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack


def _inside(inner, outer, slack=1.0) -> bool:
    return (inner[0] >= outer[0] - slack and inner[1] >= outer[1] - slack
            and inner[2] <= outer[2] + slack and inner[3] <= outer[3] + slack)


def _centre(b):
    return (b[0] + b[2]) / 2, (b[1] + b[3]) / 2


def _hex(colour: str) -> tuple[int, int, int]:
    c = colour.lstrip("#")
    c = "".join(ch * 2 for ch in c) if len(c) == 3 else c
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def check_charts(page: dict, runs: list[str], many: bool) -> list[dict]:
    """Everything every report must show; returns the charts' layouts in order."""
    layout = page["layout"]
    assert page["requests"] == [], f"the page made requests: {page['requests']}"
    assert page["errors"] == [], page["errors"]
    assert layout["empty"] == 0, "a chart says no data"
    timeline = [] if many else list(TIMELINE)
    assert page["dom"].count("<svg") == len(CHARTS) + len(timeline)  # the DOM after parsing: no chart lost or split
    assert [c["label"] for c in layout["charts"]] == list(CHARTS) + timeline
    for c in layout["charts"][len(CHARTS):]:
        check_timeline(c)
    charts = layout["charts"][:len(CHARTS)]
    assert layout["page"]["scroll_width"] <= layout["page"]["width"], "the page is wider than the window"
    for c in charts:
        name = c["label"]
        assert c["ns"] == SVG_NS and c["foreign"] == [] and c["parent"] == "figure" and c["in_charts"], name
        assert set(c["tags"]) <= {"text", "rect", "line", "path", "circle", "title", "g"}, (name, c["tags"])
        assert c["title"] == name
        w, h = c["box"][2] - c["box"][0], c["box"][3] - c["box"][1]
        assert w == pytest.approx(560, abs=1) and 250 <= h <= 450, (name, w, h)
        assert c["box"][2] <= WINDOW[0] and c["box"][3] <= WINDOW[1], (name, c["box"])
        frame = c["frame"]

        # series: the expected ones, each a path of finite coordinates inside the plot, one dot a point
        expected = [(f"{r} {s}" if many else s, COLOURS[i]) for i, r in enumerate(runs) for s in CHARTS[name]]
        assert sorted(p["colour"] for p in c["paths"]) == sorted(col for _, col in expected), name
        for p in c["paths"]:
            nums = re.findall(r"[-+\w.]+", p["d"].replace("M", " ").replace("L", " ").replace(",", " "))
            coords = [float(v) for v in nums]
            assert coords and all(v == v and abs(v) != float("inf") for v in coords), (name, p["d"])
            assert len(coords) == 2 * len(SWEEP), (name, p["d"])  # one vertex per load
            xs = coords[0::2]
            assert xs == sorted(xs) and len(set(xs)) == len(xs), (name, p["d"])
            assert p["length"] > 50 and _inside(p["box"], frame, slack=2), (name, p)
            assert p["computed"] == "rgb({}, {}, {})".format(*_hex(p["colour"])), (name, p["computed"])
        assert len(c["dots"]) == len(SWEEP) * len(expected), name
        for d in c["dots"]:
            assert _inside(d["box"], frame, slack=4), (name, d)
        # Within a series a higher value is drawn higher, when it differs by more than 2% (the dots' titles are
        # rounded) and by more than 1% of the axis: a closer pair can round to the same pixel (coordinates are
        # written to 0.1 px). The y axis runs from 0 to above the highest point or SLO target, so an SLO line far
        # above the points shrinks them: 188 and 192 ms under a 10 s target were 0.09 px apart and drew on one
        # tenth of a pixel; 4.4 and 4.5 ms on an axis that also held another run's 500 ms did too, once.
        values = [float(d["title"].split("-> ")[1].replace(",", "")) for d in c["dots"]]
        targets = [float(t["name"].split("<= ")[1].split(" ")[0].replace(",", "")) for t in c["targets"]]
        span = max(values + targets)
        for col in {col for _, col in expected}:
            for series in {d["title"].split(":")[0] for d in c["dots"] if d["colour"] == col}:
                dots = [(float(d["title"].split("-> ")[1].replace(",", "")), _centre(d["box"])[1])
                        for d in c["dots"] if d["colour"] == col and d["title"].split(":")[0] == series]
                for (v1, y1), (v2, y2) in zip(sorted(dots), sorted(dots)[1:]):
                    if v2 - v1 > 0.01 * span and v2 > v1 * 1.02 + 1e-9:
                        assert y2 < y1, (name, series, dots)

        # legend: one entry per series and vertical line, named, in its colour and dash, above the plot
        assert sorted((e["s"], e["colour"]) for e in c["legend"] if e["colour"] in COLOURS) == sorted(expected), name
        want_dash = {s: ("6 3" if s.endswith(("p99", "goodput", "predicted")) else "") for s, _ in expected}
        for e in c["legend"]:
            assert e["box"][3] <= frame[1] + 0.5, ("legend over the plot", name, e)
            if e["s"] in want_dash:
                assert e["dash"] == want_dash[e["s"]], (name, e)
        assert {(v["name"], v["colour"], v["dash"]) for v in c["vlines"] + c["targets"]} == {
            (e["s"], e["colour"], e["dash"]) for e in c["legend"] if e["colour"] not in COLOURS}, name
        # SLO targets: horizontal lines across the plot, at their value on the y axis among the points
        for t in c["targets"]:
            assert t["colour"] == SLO_COLOUR and t["name"].startswith("SLO "), (name, t)
            assert _inside(t["box"], frame, slack=2) and t["box"][3] - t["box"][1] <= 3, (name, t)
            assert t["box"][2] - t["box"][0] >= 0.95 * (frame[2] - frame[0]), (name, t)
            target = float(t["name"].split("<= ")[1].split(" ")[0].replace(",", ""))
            y = _centre(t["box"])[1]
            for d in c["dots"]:
                v = float(d["title"].split("-> ")[1].replace(",", ""))
                if v > target * 1.02:
                    assert _centre(d["box"])[1] < y, ("a point above its SLO drawn below it", name, d, t)
                elif v < target / 1.02:
                    assert _centre(d["box"])[1] > y, ("a point under its SLO drawn above it", name, d, t)
        for v in c["vlines"]:
            assert _inside(v["box"], frame, slack=2), (name, v)
        xs = sorted(_centre(v["box"])[0] for v in c["vlines"])
        assert all(b - a >= 1.5 for a, b in zip(xs, xs[1:])), ("one onset line hides another", name, xs)

        # labels: inside the chart, none over another
        texts = c["texts"]
        assert len(texts) >= 8, name
        for t in texts:
            assert t["s"].strip() and _inside(t["box"], c["box"]), ("label outside its chart", name, t)
        clashes = [(a["s"], b["s"]) for i, a in enumerate(texts) for b in texts[i + 1:] if _overlap(a["box"], b["box"])]
        assert clashes == [], (name, clashes)
        for t in texts:
            if t["legend"]:
                continue
            for d in c["dots"]:  # tick and axis labels sit outside the plot: no dot under them
                assert not _overlap(t["box"], d["box"], slack=1), (name, t["s"], d["title"])
    for a, b in zip(charts, charts[1:]):
        assert not _overlap(a["box"], b["box"]), ("charts overlap", a["label"], b["label"])
    return charts


def check_timeline(c: dict) -> None:
    """A chart over the run's time: its series, each a path of finite coordinates inside the plot going forward in
    time, every scrape a dot; its marks (the measured onsets' points) vertical, inside, named in the legend."""
    name, frame = c["label"], c["frame"]
    assert c["ns"] == SVG_NS and c["foreign"] == [] and c["title"] == name
    assert sorted(e["s"] for e in c["legend"] if e["colour"] in COLOURS) == sorted(TIMELINE[name]), name
    assert len(c["paths"]) == len(TIMELINE[name]), name
    for p in c["paths"]:
        coords = [float(v) for v in re.findall(r"[-+\w.]+", p["d"].replace("M", " ").replace("L", " ").replace(",", " "))]
        xs = coords[0::2]
        assert len(xs) >= 2 and all(v == v and abs(v) != float("inf") for v in coords), (name, p["d"])
        assert xs == sorted(xs) and _inside(p["box"], frame, slack=2), (name, p["d"])
    for d in c["dots"]:
        assert _inside(d["box"], frame, slack=4), (name, d)
    assert {(v["name"], v["colour"], v["dash"]) for v in c["vlines"]} == {
        (e["s"], e["colour"], e["dash"]) for e in c["legend"] if e["colour"] not in COLOURS}, name
    for v in c["vlines"]:
        assert v["name"].startswith("measured ") and v["name"].endswith(" begins"), (name, v)
        assert _inside(v["box"], frame, slack=2) and v["box"][2] - v["box"][0] <= 3, (name, v)


def check_pixels(page: dict, charts: list[dict], colours: list[str]) -> dict[str, int]:
    from PIL import Image

    with Image.open(page["png"]) as img:
        assert img.size == WINDOW, img.size
        rgb = img.convert("RGB")
    everything = rgb.getcolors(maxcolors=1 << 24)
    assert len(everything) > 50, f"only {len(everything)} colours: a blank page"
    seen = {}
    for c in charts:
        region = rgb.crop(tuple(round(v) for v in c["box"]))
        counts = {rgb_: n for n, rgb_ in region.getcolors(maxcolors=1 << 24)}
        total = sum(counts.values())
        white = counts.get((255, 255, 255), 0)
        assert white < 0.97 * total, (c["label"], "nearly blank", white, total)
        assert len(counts) > 20, (c["label"], len(counts))
        for col in colours:
            n = counts.get(_hex(col), 0)
            assert n >= 20, (c["label"], f"series colour {col}: {n} px")
            seen[f"{c['label']} {col}"] = n
    return seen


def test_sweep_report_renders_every_chart(sweep_page):
    page, summary = sweep_page
    charts = check_charts(page, ["run"], many=False)
    check_pixels(page, charts, [COLOURS[0]])
    assert [p["concurrency"] for p in summary["points"]] == SWEEP
    assert all(p["status"] == "ok" for p in summary["points"])
    # the run's SLOs (--slo ttft_p99=1s,e2e_p99=10s) on the charts of their metrics, and on no other
    targets = {c["label"]: [t["name"] for t in c["targets"]] for c in charts}
    assert targets["TTFT vs load (ms)"] == ["SLO ttft p99 <= 1,000 ms"]
    assert targets["E2E vs load (ms)"] == ["SLO e2e p99 <= 10,000 ms"]
    assert all(not names for label, names in targets.items() if not label.startswith(("TTFT", "E2E")))
    # the capacity table, planner beside engine, as the browser laid it out
    assert "KV capacity: planner vs engine" in page["dom"]


def test_sweep_report_shows_onsets_predicted_and_measured(sweep_page):
    page, summary = sweep_page
    pred, measured = summary["prediction"], summary["measured"]
    # the pool of 16 blocks: 4 requests of 4 blocks fit, and grow to 5 each: predicted both at 4
    assert (pred["first_kv_wait"], pred["first_preemption"]) == (4, 4)
    wait, preempt = measured["first_kv_wait"]["first"], measured["first_preemption"]["first"]
    assert wait in SWEEP and preempt in SWEEP and wait > 4 and preempt > 4, measured  # the fake: more than 4, 5

    def shown(m):
        return str(m["first"]) if m.get("exact", True) else f"<= {m['first']}"

    want = {("predicted KV wait 4", ONSET_COLOURS[0], "6 4"), ("predicted preemption 4", ONSET_COLOURS[1], "6 4"),
            (f"measured KV wait {shown(measured['first_kv_wait'])}", ONSET_COLOURS[0], "2 2"),
            (f"measured preemption {shown(measured['first_preemption'])}", ONSET_COLOURS[1], "2 2")}
    for c in page["layout"]["charts"][:len(CHARTS)]:
        lines = {(v["name"], v["colour"], v["dash"]) for v in c["vlines"]}
        assert lines == (want if c["label"] in ONSET_CHARTS else set()), c["label"]
        if c["label"] in ONSET_CHARTS:
            # each line stands at its load, on the dots measured there
            dots = {float(d["title"].split(": ")[1].split(" ->")[0]): _centre(d["box"])[0] for d in c["dots"]}
            loads = {"predicted KV": 4, "predicted preemption": 4, "measured KV": wait, "measured preemption": preempt}
            for v in c["vlines"]:
                load = loads[" ".join(v["name"].split()[:2])]
                assert _centre(v["box"])[0] == pytest.approx(dots[load], abs=2.5), (c["label"], v, load)
    # the table of onsets, as the browser parsed it
    head, row = page["layout"]["runs"]
    cells = dict(zip(head, row))
    assert cells["first KV waitpredicted / measured"] == f"4 / {shown(measured['first_kv_wait'])}"
    assert cells["first preemptionpredicted / measured"] == f"4 / {shown(measured['first_preemption'])}"
    from PIL import Image

    with Image.open(page["png"]) as img:  # the onset lines are drawn, in their colours
        counts = {c: n for n, c in img.convert("RGB").getcolors(maxcolors=1 << 24)}
    assert all(counts.get(_hex(col), 0) >= 50 for col in ONSET_COLOURS), [counts.get(_hex(c), 0) for c in ONSET_COLOURS]


def test_comparison_renders_every_chart_for_both_runs(compare_page):
    page, names = compare_page
    charts = check_charts(page, names, many=True)
    check_pixels(page, charts, COLOURS[:2])
    assert all(c["vlines"] == [] for c in charts)  # onsets differ per run: the table has them
    assert page["dom"].count("<h2>") == 2 and all(f"{n}: points" in page["dom"] for n in names)


def test_the_network_checks_see_a_page_that_fetches(tmp_path):
    """The control: a page with external resources is caught by both the net log and Resource Timing
    (which lists only the loads that ended: .invalid names fail at once, with or without a network)."""
    page = tmp_path / "fetches.html"
    page.write_text('<!DOCTYPE html><html><head><link rel="stylesheet" href="https://example.invalid/x.css"></head>'
                    '<body><img src="http://example.invalid/x.png">' + PROBE + "</body></html>")
    dom, _, requests = chromium(page.as_uri(), "--dump-dom")
    assert {"https://example.invalid/x.css", "http://example.invalid/x.png"} <= set(requests)
    layout = probe_data(dom)
    assert {"https://example.invalid/x.css", "http://example.invalid/x.png"} <= set(layout["resources"])


def test_a_real_cpu_engine_run_shows_every_element(tmp_path):
    """Issue 27's goal: report.html of a real CPU-engine run (the README's showcase, kept in docs/: its summary and
    each point's TTFTs) shows every element a team reviews, present and not empty, in the browser: the charts
    against the load with the onsets, the SLO targets (an SLO applied to the kept run), the run over time, the TTFT
    distribution, the capacity table and the one warning list."""
    from kvplan.bench.outputs.html import html_report
    from kvplan.bench.results import BenchSummary

    root = Path(__file__).resolve().parents[2] / "docs"
    summary = BenchSummary.model_validate_json((root / "bench-cpu-sweep.json").read_text())
    summary = summary.model_copy(update={"slo": {"ttft_p99": 0.5, "e2e_p99": 1.0}})
    ttfts = {int(k): v for k, v in json.loads((root / "bench-cpu-sweep-ttft.json").read_text()).items()}
    page_file = tmp_path / "report.html"
    page_file.write_text(html_report([summary], ttfts=ttfts))
    page = render(page_file, tmp_path)
    assert page["requests"] == [] and page["errors"] == [] and page["layout"]["empty"] == 0
    charts = {c["label"]: c for c in page["layout"]["charts"]}
    assert list(charts) == list(CHARTS) + [label for label in TIMELINE]
    for label, c in charts.items():  # every chart drew its series, each a path with points
        assert c["paths"] and c["dots"], label
    assert {t["name"] for t in charts["TTFT vs load (ms)"]["targets"]} == {"SLO ttft p99 <= 500 ms"}
    assert {t["name"] for t in charts["E2E vs load (ms)"]["targets"]} == {"SLO e2e p99 <= 1,000 ms"}
    onsets = {v["name"] for v in charts["TTFT vs load (ms)"]["vlines"]}
    assert {"predicted KV wait 9", "measured KV wait 9"} <= onsets, onsets
    assert any(v["name"].startswith("measured preemption") for v in charts["Preemptions over time (run total)"]["vlines"])
    assert len(charts["TTFT distribution by load"]["paths"]) == len(summary.points) == len(ttfts)  # a line per load
    dom = page["dom"]
    assert "KV capacity: planner vs engine" in dom and "Over time" in dom and "Latency distribution" in dom
    assert dom.count('<ul class="warn">') <= 1 and '<p class="warn">' not in dom
