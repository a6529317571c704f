#!/usr/bin/env python3
"""test_observability -- keeps the shipped Grafana dashboard and Prometheus alerts honest (offline).

Owns the contract between what `kvrouter serve` exports and what deploy/ queries:
deploy/grafana/kvrouter-dashboard.json, deploy/prometheus/kvrouter-rules.yaml and its Prometheus
Operator twin deploy/k8s/kvrouter-alerts.yaml.

Flow: the run starts, once, a real `kvrouter serve` (the binary of --kvrouter) in front of two
`kvrouter sim` workers on 127.0.0.1 ephemeral ports, one of them given `kv_events=ipc://...` so the
precise-mode families exist, sends one completion, reads the admin /metrics page and stops the three
processes by PID (tests/harness/kvrharness.py). That page becomes the catalogue: family name -> type,
label names and label values. Every PromQL expression (dashboard targets and template variables,
rule exprs) goes through a small tokenizer (strings, numbers and durations, identifiers, operators;
`[...]` ranges skipped, `{...}` matchers parsed) that yields the metric names, their matchers and the
grouping labels (by / without / on / ignoring / group_left / group_right). Each metric must be an
exported family (or a histogram's _bucket/_sum/_count, or Prometheus's own `up`), each matcher's
label must exist on that family (plus the target labels job and instance, and le on _bucket), and an
`=` / `=~` value of a label with a fixed value set (state, reason, result, index, path, policy) must
be one the router exports. Also: dashboard structure (schemaVersion, the ${datasource} variable used
by every panel, job/instance variables, unique ids and refIds, grid inside 24 columns, the eight
rows), every alert's severity / summary / description (with a runbook hint) and `for:` duration,
the {{ $labels.X }} of annotations, the alerts the operators asked for, the PrometheusRule's groups
equal to the rule file's, and, when promtool is on PATH (Debian package `prometheus`),
`promtool check rules` and `promtool test rules` on the scenarios of
tests/deploy/kvrouter-rules.scenarios.yaml (synthetic series for which each alert must fire, with
its labels and rendered annotations, or stay silent).

Run: python3 tests/deploy/test_observability.py --kvrouter build/kvrouter (CTest:
script.test_observability); one PASS/FAIL line per test; exit 77 (skipped) when PyYAML is missing.
"""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
import kvrharness as h  # noqa: E402

DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "kvrouter-dashboard.json")
RULES = os.path.join(ROOT, "deploy", "prometheus", "kvrouter-rules.yaml")
SCENARIOS = os.path.join(HERE, "kvrouter-rules.scenarios.yaml")
OPERATOR_RULES = os.path.join(ROOT, "deploy", "k8s", "kvrouter-alerts.yaml")

try:
    import yaml
except ImportError:  # a venv python without Debian's python3-yaml on its path
    sys.path.append("/usr/lib/python3/dist-packages")
    try:
        import yaml
    except ImportError:
        print("SKIP test_observability: PyYAML is not importable (apt-get install python3-yaml)")
        sys.exit(77)

TESTS, test = h.registry()

# Labels every scraped series carries (target labels), whatever the family.
TARGET_LABELS = {"job", "instance"}
# Labels whose values the router always exports in full, so a selector value must be one of them.
FIXED_VALUE_LABELS = {"state", "reason", "result", "index", "path", "policy"}
# Series Prometheus makes itself for each target: name -> labels.
SYNTHETIC = {"up": set(), "scrape_duration_seconds": set(), "scrape_samples_scraped": set()}
ALERTS_ASKED = {"KvrouterDown", "KvrouterNoUsableWorker", "KvrouterWorkerDown", "KvrouterWorkerEjected",
                "KvrouterHighErrorRate", "KvrouterHighTTFB", "KvrouterAdmissionRejecting",
                "KvrouterCachePredictionDrift", "KvrouterKvEventsApproximate",
                "KvrouterConfigReloadFailed", "KvrouterScrapeStale"}
ROWS = ["Traffic", "Latency", "Routing", "Cache", "Workers", "Reliability", "KV events (precise mode)",
        "Process"]
SEVERITIES = {"critical", "warning", "info"}

# PromQL's functions and aggregation operators (prometheus/promql/parser/functions.go, lex.go).
FUNCTIONS = set("""abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil
changes clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
days_in_month deg delta deriv exp floor histogram_count histogram_fraction histogram_quantile
histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase irate label_join
label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month
pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh
sort sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector
year""".split())
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"bool", "and", "or", "unless", "offset", "atan2", "nan", "inf", "NaN", "Inf"}

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])*)
  | (?P<id>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<var>\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}\[\]@:])
""", re.X)
DURATION = re.compile(r"^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?$")


def tokens(expr):
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise AssertionError("cannot tokenize %r at %r" % (expr, expr[pos:pos + 20]))
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def unquote(s):
    """The value of a PromQL string literal (double-quoted strings escape as JSON's do)."""
    return json.loads(s) if s[0] == '"' else s[1:-1]


class Query:
    """What one PromQL expression names: selectors [(metric, [(label, op, value)])], the grouping
    labels and the functions called."""

    def __init__(self, expr):
        self.expr = expr
        self.selectors, self.grouping, self.functions = [], set(), set()
        t = tokens(expr)
        i = 0
        while i < len(t):
            kind, text = t[i]
            nxt = t[i + 1][1] if i + 1 < len(t) else None
            if text == "[":  # range, subquery: durations and Grafana interval variables only
                while t[i][1] != "]":
                    i += 1
            elif kind == "id" and text in GROUPING and nxt == "(":
                i += 2
                while t[i][1] != ")":
                    if t[i][0] == "id":
                        self.grouping.add(t[i][1])
                    i += 1
            elif kind == "id" and text in AGGREGATIONS and nxt in ("(", "by", "without"):
                self.functions.add(text)  # sum (x) by (l), sum by (l) (x)
            elif kind == "id" and nxt == "(" and text not in KEYWORDS:
                assert text in FUNCTIONS or text in AGGREGATIONS, \
                    "%r: unknown function %s()" % (expr, text)
                self.functions.add(text)
            elif kind == "id" and text not in KEYWORDS and text not in GROUPING:
                matchers = []
                if nxt == "{":
                    i, matchers = self._matchers(t, i + 2)
                self.selectors.append((text, matchers))
            elif text == "{":
                raise AssertionError("%r: a selector without a metric name" % expr)
            i += 1

    def _matchers(self, t, i):
        out = []
        while t[i][1] != "}":
            if t[i][1] == ",":
                i += 1
                continue
            (k1, label), (k2, op), (k3, value) = t[i:i + 3]
            assert k1 == "id" and k2 == "op" and k3 == "str", "%r: bad matcher" % self.expr
            out.append((label, op, unquote(value)))
            i += 3
        return i, out

    def labels_available(self, catalogue, grouping=True):
        """The label names this expression's series can carry (with or without the grouping
        labels, which label_replace-free expressions can only take from their selectors)."""
        out = set(TARGET_LABELS) | (self.grouping if grouping else set())
        for name, _ in self.selectors:
            fam = catalogue.resolve(name)
            if fam:
                out |= fam[1]
        return out


class Catalogue:
    """The families of one /metrics page: name -> type, label names, values seen per label."""

    def __init__(self, text):
        self.types, self.labels, self.values = {}, {}, {}
        for line in text.splitlines():
            m = re.match(r"# TYPE (\S+) (\S+)$", line)
            if m:
                self.types[m.group(1)] = m.group(2)
        for (name, labels), _ in h.parse_prom_samples(text).items():
            fam = self._family(name)
            assert fam, "sample %s without a # TYPE line" % name
            self.labels.setdefault(fam, set()).update(k for k, _ in labels)
            for k, v in labels:
                self.values.setdefault((fam, k), set()).add(v)

    def _family(self, name):
        if name in self.types:
            return name
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[:-len(suffix)]
            if name.endswith(suffix) and self.types.get(base) in ("histogram", "summary"):
                return base
        return None

    def resolve(self, name):
        """(family, label names a selector may use) or None when /metrics has no such series."""
        if name in SYNTHETIC:
            return name, SYNTHETIC[name] | TARGET_LABELS
        fam = self._family(name)
        if fam is None:
            return None
        extra = {"le"} if name.endswith("_bucket") and fam != name else set()
        return fam, self.labels.get(fam, set()) | TARGET_LABELS | extra


def check_query(expr, catalogue, where):
    """Every name, matcher and grouping label of expr against the catalogue; returns the Query."""
    q = Query(expr)
    assert q.selectors, "%s: no metric in %r" % (where, expr)
    for name, matchers in q.selectors:
        fam = catalogue.resolve(name)
        assert fam, "%s: %s is not exported by kvrouter serve (%r)" % (where, name, expr)
        family, labels = fam
        for label, op, value in matchers:
            assert label in labels, "%s: %s has no label %r (has %s)" % (
                where, name, label, sorted(labels))
            if label in FIXED_VALUE_LABELS and op in ("=", "=~", "!~", "!=") and "$" not in value:
                seen = catalogue.values.get((family, label), set())
                wanted = value.split("|") if op in ("=~", "!~") else [value]
                for v in wanted:
                    assert re.fullmatch(r"[A-Za-z0-9_/.]+", v), \
                        "%s: %s{%s%s%r}: only plain alternations are checked" % (
                            where, name, label, op, value)
                    assert v in seen, "%s: %s{%s=%r}: the router exports %s only" % (
                        where, name, label, v, sorted(seen))
    avail = q.labels_available(catalogue, grouping=False)
    for label in q.grouping:
        assert label in avail, \
            "%s: grouping label %r is on none of %s" % (where, label, [n for n, _ in q.selectors])
    return q


# ---------------------------------------------------------------------------- the real /metrics

STATE = {}


@contextlib.contextmanager
def real_metrics():
    """Starts serve + two sims (one with kv_events), reads /metrics once, stops them by PID."""
    scratch = tempfile.mkdtemp(prefix="kvr-obs-")
    try:
        with h.Cleanup() as c:
            s0 = c.add(h.Sim())
            s1 = c.add(h.Sim())
            r = c.add(h.Router([s0, "%s,kv_events=ipc://%s/w1.ev" % (s1.url, scratch)], *h.FAST))
            resp = h.request(r.port, "POST", "/v1/chat/completions", h.chat_body())
            assert resp.status == 200, (resp.status, resp.body[:200])
            STATE["text"] = r.metrics_text()
        STATE["catalogue"] = Catalogue(STATE["text"])
        yield
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def catalogue():
    assert "catalogue" in STATE, "the router's /metrics page could not be read"
    return STATE["catalogue"]


def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def alerts():
    for g in load_yaml(RULES)["groups"]:
        for r in g["rules"]:
            yield g["name"], r


# ---------------------------------------------------------------------------- tests


@test(timeout=10)
def test_catalogue_has_the_precise_mode_families():
    cat = catalogue()
    for fam in ("kvrouter_worker_state", "kvrouter_request_errors_total",
                "kvrouter_worker_kv_index_mode", "kvrouter_kv_events_skipped_total",
                "kvrouter_time_to_first_byte_seconds", "process_open_fds", "kvrouter_build_info"):
        assert fam in cat.types, "%s missing from /metrics" % fam
    assert cat.types["kvrouter_time_to_first_byte_seconds"] == "histogram"
    assert cat.labels["kvrouter_worker_kv_index_mode"] == {"worker", "mode"}
    print("  /metrics: %d families" % len(cat.types))


@test(timeout=10)
def test_tokenizer_finds_names_matchers_and_grouping():
    q = Query('histogram_quantile(0.95, sum by (job, le) '
              '(rate(a_bucket{x="1",y=~"$v|b"}[$__rate_interval])))'
              ' / ignoring(z) b offset 5m > 1e-3 and on (w) c{s!="u"}[5m:1m]')
    assert [n for n, _ in q.selectors] == ["a_bucket", "b", "c"], q.selectors
    assert q.selectors[0][1] == [("x", "=", "1"), ("y", "=~", "$v|b")]
    assert q.grouping == {"job", "le", "z", "w"}
    assert q.functions == {"histogram_quantile", "sum", "rate"}
    for bad in ('rated(x[5m])', '{job="a"}'):
        try:
            Query(bad)
        except AssertionError:
            continue
        raise AssertionError("accepted %r" % bad)


@test(timeout=10)
def test_checker_rejects_what_the_router_does_not_export():
    cat = catalogue()
    for bad, why in [('kvrouter_requests_totl', "not exported"),
                     ('kvrouter_worker_state{status="up"}', "has no label"),
                     ('kvrouter_worker_state{state="broken"}', "exports"),
                     ('sum by (reason) (kvrouter_requests_total)', "grouping label"),
                     ('kvrouter_requests_total_bucket', "not exported")]:
        try:
            check_query(bad, cat, "probe")
        except AssertionError as e:
            assert why in str(e), (bad, str(e))
            continue
        raise AssertionError("accepted %r" % bad)
    check_query('rate(kvrouter_request_duration_seconds_bucket{le="0.1",job="x"}[5m])', cat, "probe")


@test(timeout=10)
def test_dashboard_structure():
    d = dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    vars_ = {v["name"]: v for v in d["templating"]["list"]}
    assert vars_["datasource"]["type"] == "datasource" and vars_["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert vars_[name]["type"] == "query" and vars_[name]["datasource"]["uid"] == "${datasource}"
    ids = set()
    for p in panels(d):
        assert p.get("title"), "a panel without title: %r" % p.get("id")
        assert p["id"] not in ids, "panel id %d twice" % p["id"]
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, (p["title"], g)
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], "%s: no query" % p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), "%s: refIds %s" % (p["title"], refs)
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert 'job=~"$job"' in t["expr"] and 'instance=~"$instance"' in t["expr"], \
                "%s: %r ignores the job/instance variables" % (p["title"], t["expr"])
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ROWS, rows


@test(timeout=10)
def test_dashboard_queries_name_exported_metrics_and_labels():
    cat, shown, n = catalogue(), set(), 0
    for p in panels(dashboard()):
        for t in p.get("targets", []):
            q = check_query(t["expr"], cat, "panel %r" % p["title"])
            shown |= {cat.resolve(name)[0] for name, _ in q.selectors}
            n += 1
    for v in dashboard()["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
        assert m, "variable %s: %r" % (v["name"], v["definition"])
        q = check_query(m.group(1), cat, "variable " + v["name"])
        assert m.group(2) in q.labels_available(cat), v["definition"]
    unshown = sorted(f for f in cat.types if f.startswith("kvrouter_") and f not in shown)
    print("  %d queries checked; kvrouter families not on the dashboard: %s" % (n, unshown or "none"))


def annotation_labels(text):
    return re.findall(r"\$labels\.(\w+)", text)


@test(timeout=10)
def test_alerts_are_complete_and_name_exported_metrics():
    cat, names = catalogue(), []
    for group, r in alerts():
        name = r.get("alert")
        assert name and "record" not in r, "%s: a rule without alert name" % group
        names.append(name)
        where = "alert %s" % name
        q = check_query(r["expr"], cat, where)
        assert DURATION.match(r["for"]) and r["for"], "%s: for %r" % (where, r["for"])
        assert r["labels"]["severity"] in SEVERITIES, "%s: severity %r" % (where, r["labels"])
        ann = r["annotations"]
        assert ann.get("summary") and ann.get("description"), "%s: summary/description" % where
        assert "Runbook:" in ann["description"], "%s: no runbook hint" % where
        avail = q.labels_available(cat)
        for label in annotation_labels(ann["summary"] + ann["description"]):
            assert label in avail, "%s: annotation uses $labels.%s, not on %s" % (
                where, label, sorted(avail))
    assert len(names) == len(set(names)), "alert names repeat: %s" % names
    missing = ALERTS_ASKED - set(names)
    assert not missing, "alerts missing: %s" % sorted(missing)
    for g in load_yaml(RULES)["groups"]:
        assert DURATION.match(g.get("interval", "1m")), g["name"]


@test(timeout=10)
def test_prometheus_rule_equals_the_rule_file():
    with open(OPERATOR_RULES) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    assert len(docs) == 1, "expected one document in %s" % OPERATOR_RULES
    pr = docs[0]
    assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["kind"] == "PrometheusRule"
    assert pr["metadata"]["name"] == "kvrouter"
    assert pr["metadata"]["labels"]["app.kubernetes.io/name"] == "kvrouter"
    assert pr["spec"]["groups"] == load_yaml(RULES)["groups"], \
        "PrometheusRule spec.groups differs from %s: copy it again" % RULES
    # The job matcher must be the job the ServiceMonitor of kvrouter.yaml produces (its Service).
    with open(os.path.join(ROOT, "deploy", "k8s", "kvrouter.yaml")) as f:
        manifest = [d for d in yaml.safe_load_all(f) if d]
    sm = [d for d in manifest if d["kind"] == "ServiceMonitor"][0]
    want = sm["spec"]["selector"]["matchLabels"]
    svc = [d for d in manifest if d["kind"] == "Service"
           and want.items() <= d["metadata"].get("labels", {}).items()]
    assert len(svc) == 1, "the ServiceMonitor selects %d Services" % len(svc)
    for _, r in alerts():
        for job in re.findall(r'job="([^"]*)"', r["expr"]):
            assert job == svc[0]["metadata"]["name"], "%s: job %r" % (r["alert"], job)


def promtool():
    return os.environ.get("KVR_PROMTOOL") or shutil.which("promtool")


def run_promtool(*args):
    p = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "promtool %s: %s%s" % (" ".join(args), p.stdout, p.stderr)
    return p.stdout


def test_promtool_check_rules():
    out = run_promtool("check", "rules", RULES)
    n = sum(1 for _ in alerts())
    assert "SUCCESS: %d rules found" % n in out, out


def promtool_unit_tests():
    """The scenarios as one promtool unit-test file (the rule file by absolute path)."""
    rules = {r["alert"]: r for _, r in alerts()}
    tests = []
    for sc in load_yaml(SCENARIOS):
        rule = rules[sc["alert"]]
        exp = []
        for a in sc["fires"]:
            desc = rule["annotations"]["description"]
            for k, v in a["labels"].items():
                desc = desc.replace("{{ $labels.%s }}" % k, v)
            assert "{{" not in desc, "%s: description template beyond $labels: %r" % (sc["alert"], desc)
            exp.append({"exp_labels": dict(a["labels"], severity=rule["labels"]["severity"]),
                        "exp_annotations": {"summary": a["summary"], "description": desc}})
        tests.append({"interval": "1m",
                      "input_series": [{"series": k, "values": v} for k, v in sc["series"].items()],
                      "alert_rule_test": [{"eval_time": sc["at"], "alertname": sc["alert"],
                                           "exp_alerts": exp}]})
    return {"rule_files": [RULES], "evaluation_interval": "1m", "tests": tests}


def test_promtool_unit_tests():
    scenarios = load_yaml(SCENARIOS)
    for name in {r["alert"] for _, r in alerts()}:
        kinds = {bool(sc["fires"]) for sc in scenarios if sc["alert"] == name}
        assert kinds == {True, False}, "%s: want a firing and a silent scenario" % name
    with tempfile.TemporaryDirectory(prefix="kvr-obs-promtool-") as d:
        path = os.path.join(d, "kvrouter-rules.test.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(promtool_unit_tests(), f, sort_keys=False)
        out = run_promtool("test", "rules", path)
    assert "SUCCESS" in out, out
    print("  promtool test rules: %d scenarios" % len(scenarios))


if __name__ == "__main__":
    if promtool():
        for fn in (test_promtool_check_rules, test_promtool_unit_tests):
            fn.timeout = 60
            TESTS.append(fn)
    else:
        print("SKIP promtool checks: promtool is not on PATH "
              "(Debian package prometheus, or KVR_PROMTOOL)")
    sys.exit(h.run(TESTS, description=__doc__, around=real_metrics))
