"""A traced 2-rank run of the tiny model, read back by real tools: the merged trace and the ranks'
files are validated against a JSON schema of the Trace Event Format (trace_event_schema.json, with
the jsonschema package) and checked for every phase and for spans that nest per thread; the HTML run
report is rendered by headless Chromium (Debian's chromium, installed by scripts/setup --test),
whose screenshot must show the charts and whose DOM must map every chart point back to the value
in metrics.jsonl through the axes the page draws."""

import json
import math
import os
import shutil
import subprocess
from html.parser import HTMLParser

import jsonschema
import pytest
from PIL import Image

import reflib

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = {"step", "data", "forward", "backward", "comm", "optimizer", "checkpoint", "eval"}
CHROMIUM_TIMEOUT = 90


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("traced") / "run")
    reflib.run(["launch", "--nproc", "2", reflib.TINY, "--trace"] + reflib.tiny_run_overrides(out),
               cwd=reflib.REPO, timeout=300)
    return out


@pytest.fixture(scope="module")
def schema():
    with open(os.path.join(HERE, "trace_event_schema.json"), encoding="utf-8") as f:
        s = json.load(f)
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def complete_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def thread_names(trace):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_trace_files_are_valid_trace_event_format(run_dir, schema):
    trace_dir = os.path.join(run_dir, "trace")
    assert sorted(os.listdir(trace_dir)) == ["rank-0.json", "rank-1.json", "trace.json"]
    for name in os.listdir(trace_dir):
        schema.validate(load(os.path.join(trace_dir, name)))
    # The schema is not vacuous: a complete event without its duration is refused.
    broken = load(os.path.join(trace_dir, "trace.json"))
    del complete_events(broken)[0]["dur"]
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(broken)


def test_every_rank_traces_every_phase_and_labels_its_buckets(run_dir):
    trace = load(os.path.join(run_dir, "trace", "trace.json"))
    names = thread_names(trace)
    events = complete_events(trace)
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        assert PHASES <= {e["cat"] for e in mine}, f"rank {rank}: {sorted({e['cat'] for e in mine})}"
        tracks = {names.get((rank, e["tid"])) for e in mine}
        assert {"main", "comm", "data prefetch"} <= tracks
        # Collectives run on the communicator's thread, each labelled with its gradient bucket.
        reduce = [e for e in mine if e["name"] == "reduce_scatter"]
        assert reduce and all(names[(rank, e["tid"])] == "comm" for e in reduce)
        assert all("bucket" in e["args"] and e["args"]["bytes_sent"] > 0 for e in reduce)
        steps = [e for e in mine if e["cat"] == "step"]
        assert [e["args"]["step"] for e in steps] == list(range(1, 13))
    assert min(e["ts"] for e in events) == 0  # rebased onto the run's first event


def test_spans_nest_on_each_thread(run_dir):
    trace = load(os.path.join(run_dir, "trace", "trace.json"))
    by_track = {}
    for e in complete_events(trace):
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track, events in by_track.items():
        stack = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"], \
                    f"{track}: {e['name']} overlaps {parent['name']} without nesting"
            if e["cat"] in ("data", "forward", "backward", "optimizer") and e["name"] != "collate":
                assert any(p["cat"] == "step" for p in stack), f"{track}: {e['name']} outside a step"
            stack.append(e)


def test_trace_merge_command_rebuilds_the_merged_trace(run_dir, tmp):
    out = os.path.join(tmp, "merged.json")
    r = reflib.run(["trace", "merge", run_dir, "-o", out], timeout=60)
    assert "2 rank(s)" in r.stdout
    key = lambda e: (e["pid"], e["tid"], e["name"], e["ts"], e["dur"])
    want = sorted(map(key, complete_events(load(os.path.join(run_dir, "trace", "trace.json")))))
    assert sorted(map(key, complete_events(load(out)))) == want
    r = reflib.run(["trace", "merge", tmp], timeout=60, check=False)
    assert r.returncode == 2 and os.path.join(tmp, "trace") in r.stdout


# --- the report ------------------------------------------------------------------------------


def chromium(*args):
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: scripts/setup --test installs Debian's chromium"
    profile = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dstrain-chromium-{os.getpid()}")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}"] + list(args)
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=CHROMIUM_TIMEOUT, check=True).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class ChartReader(HTMLParser):
    """Each chart's scale, series points and ticks, from the DOM Chromium built."""

    def __init__(self):
        super().__init__()
        self.charts = {}
        self.chart = None
        self.tick = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "figure" and "chart" in classes:
            self.chart = self.charts.setdefault(a["id"], {"series": {}, "ticks": []})
        elif tag == "g" and "plot" in classes:
            for k in ("x-domain", "x-range", "y-domain", "y-range"):
                self.chart[k] = [float(v) for v in a["data-" + k].split()]
        elif tag == "polyline" and "series" in classes:
            self.chart["series"][a["data-key"]] = [tuple(map(float, p.split(",")))
                                                   for p in a["points"].split()]
        elif tag == "g" and "tick" in classes:
            self.tick = {"axis": a["data-axis"]}
            self.chart["ticks"].append(self.tick)
        elif tag == "line" and self.tick is not None:
            self.tick["pos"] = float(a["x1"] if self.tick["axis"] == "x" else a["y1"])

    def handle_data(self, data):
        if self.tick is not None and data.strip():
            self.tick["label"] = float(data.strip())
            self.tick = None


def to_data(chart, axis, pixel):
    (d0, d1), (p0, p1) = chart[axis + "-domain"], chart[axis + "-range"]
    return d0 + (pixel - p0) / (p1 - p0) * (d1 - d0)


def pixel_tolerance(chart, axis):
    """One hundredth of a pixel (the points' rounding) in data units, plus float slack."""
    (d0, d1), (p0, p1) = chart[axis + "-domain"], chart[axis + "-range"]
    return 0.006 * abs((d1 - d0) / (p1 - p0)) + 1e-9 * max(abs(d0), abs(d1))


def metric_series(run_dir):
    series = {}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            for k, v in record.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and math.isfinite(v):
                    series.setdefault(k, []).append((record["step"], v))
    return series


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("report") / "report.html")
    r = reflib.run(["report", run_dir, "-o", out], timeout=60)
    assert r.stdout.strip() == out
    return out


def test_report_written_by_the_run_is_the_one_the_command_writes(run_dir, report):
    with open(os.path.join(run_dir, "report.html"), encoding="utf-8") as a, \
            open(report, encoding="utf-8") as b:
        assert a.read() == b.read()


def test_report_charts_map_back_to_metrics_jsonl(run_dir, report):
    reader = ChartReader()
    reader.feed(chromium("--dump-dom", "file://" + report))
    charts = reader.charts
    assert set(charts) == {"chart-loss", "chart-lr", "chart-throughput", "chart-memory"}
    metrics = metric_series(run_dir)
    expected = {"chart-loss": ["train/loss", "eval/loss"], "chart-lr": ["lr"],
                "chart-throughput": ["tokens_per_s"],
                "chart-memory": sorted(k for k in metrics if k.startswith("memory/"))}
    for chart_id, keys in expected.items():
        chart = charts[chart_id]
        assert sorted(chart["series"]) == sorted(keys), chart_id
        tx, ty = pixel_tolerance(chart, "x"), pixel_tolerance(chart, "y")
        for key in keys:
            drawn = [(to_data(chart, "x", px), to_data(chart, "y", py))
                     for px, py in chart["series"][key]]
            want = metrics[key]
            assert len(drawn) == len(want) and len(want) >= 2, (chart_id, key)
            for (x, y), (step, value) in zip(drawn, want):
                assert abs(x - step) <= tx and abs(y - value) <= ty, \
                    f"{chart_id} {key}: drawn ({x}, {y}), metrics.jsonl ({step}, {value})"
        # The axes people read agree with the scale the points were mapped through.
        for tick in chart["ticks"]:
            got = to_data(chart, tick["axis"], tick["pos"])
            assert abs(got - tick["label"]) <= pixel_tolerance(chart, tick["axis"]) * 2, tick
        assert sum(t["axis"] == "y" for t in chart["ticks"]) >= 3


def count_near(image, rgb, tol=40):
    return sum(n for n, c in image.getcolors(maxcolors=1 << 20)
               if all(abs(a - b) <= tol for a, b in zip(c[:3], rgb)))


def test_report_renders_its_charts_in_chromium(report, tmp):
    png = os.path.join(tmp, "report.png")
    chromium(f"--screenshot={png}", "--window-size=1400,2600", "file://" + report)
    image = Image.open(png).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20)
    background = max(colors)[1]
    assert background == (255, 255, 255)
    drawn = sum(n for n, c in colors if c != background)
    assert drawn > 0.03 * image.width * image.height, f"only {drawn} non-background pixels"
    assert len(colors) > 100, f"{len(colors)} distinct colours: nothing much was drawn"
    # Each palette colour of the series (train loss, eval loss, the memory curves) is on screen.
    for hex_color in ("#1f77b4", "#ff7f0e", "#2ca02c"):
        rgb = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        assert count_near(image, rgb) > 150, f"{hex_color} is (almost) not on the screenshot"


def test_report_of_a_bad_run_dir_exits_2_naming_the_file(tmp):
    r = reflib.run(["report", tmp], timeout=60, check=False)
    assert r.returncode == 2 and os.path.join(tmp, "metrics.jsonl") in r.stdout, r.stdout
    with open(os.path.join(tmp, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write('{"step": 1, "train/loss": 2.5}\n{"train/loss": 2.0}\n')
    r = reflib.run(["report", tmp], timeout=60, check=False)
    assert r.returncode == 2 and "metrics.jsonl:2:" in r.stdout, r.stdout
    assert not os.path.exists(os.path.join(tmp, "report.html"))
