#!/usr/bin/env python3
"""test_deploy_manifests -- offline checks of what deploy/ ships for production.

Owns the packaging contract, not the router's behaviour: parses every YAML document of
deploy/k8s/kvrouter.yaml (PyYAML; Debian's python3-yaml) and checks the Pod Security "restricted"
fields, the probes (/livez liveness, /health readiness), the image reference (registry, tag, not
latest), resources, the shutdown timeline (preStop sleep + the router's 10 s grace <=
terminationGracePeriodSeconds), the admin token Secret mount and --admin-token-file, the
PodDisruptionBudget, the NetworkPolicy (admin port only from selected pods), the ServiceMonitor
(admin /metrics, bearer token from the same Secret), and that the objects refer to each other
coherently (selectors, named ports, ConfigMap, listen ports). Every flag passed to `kvrouter serve`
(StatefulSet args, systemd ExecStart) and every ConfigMap key must exist in `kvrouter serve --help`,
--admin-token-file and its JSON key admin_token_file included. Also deploy/k8s/Dockerfile (numeric
USER, EXPOSE of both ports, OCI labels, Debian 12 stages; its build stage installs with
`deploy/install-deps.sh --build-only` and configures with -DBUILD_TESTING=OFF), deploy/install-deps.sh
(its arrays parsed: the build-only list holds no browser, Selenium, clang, Node/npm or cmocka
package and is a subset of the full list; `--list` prints exactly those lists; an unknown flag is
one line and a non-zero exit), /.dockerignore (excludes .git, build*, results; keeps what the
Dockerfile needs) and deploy/kvrouter.service (hardening directives, ExecReload by SIGHUP, and when
systemd-analyze is installed, `systemd-analyze security --offline=true` exposure <= 2.0). No
cluster, no network, nothing installed.

Run: python3 tests/deploy/test_deploy_manifests.py --kvrouter build/kvrouter
(CTest: script.test_deploy_manifests); one PASS/FAIL line per test, exit 1 when one failed, exit 77
(skipped) when PyYAML is not importable (apt-get install python3-yaml).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MANIFEST = os.path.join(ROOT, "deploy", "k8s", "kvrouter.yaml")
DOCKERFILE = os.path.join(ROOT, "deploy", "k8s", "Dockerfile")
DOCKERIGNORE = os.path.join(ROOT, ".dockerignore")
UNIT = os.path.join(ROOT, "deploy", "kvrouter.service")
INSTALL_DEPS = os.path.join(ROOT, "deploy", "install-deps.sh")
# Substrings no package of the image's build stage may hold: test tooling (the dashboard's browser
# and its driver, the fuzzing compiler, the schema check's Node.js/npm, the unit tests' cmocka).
TEST_ONLY_PACKAGE_WORDS = ("chromium", "selenium", "clang", "npm", "nodejs", "cmocka")
SHUTDOWN_GRACE_S = 10  # router/serve.c SHUTDOWN_GRACE_MS, hard-coded
RESTRICTED_VOLUME_TYPES = {"configMap", "secret", "emptyDir", "projected", "downwardAPI",
                           "persistentVolumeClaim", "ephemeral", "csi"}

try:
    import yaml
except ImportError:  # pragma: no cover
    print("SKIP test_deploy_manifests: PyYAML is not importable (apt-get install python3-yaml)")
    sys.exit(77)

ARGS = None
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


# ---------------------------------------------------------------------------- helpers


def docs():
    with open(MANIFEST) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(kind, name=None):
    found = [d for d in docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, "expected one %s %s, found %d" % (kind, name or "", len(found))
    return found[0]


def pod_spec():
    return one("StatefulSet", "kvrouter")["spec"]["template"]["spec"]


def container():
    cs = pod_spec()["containers"]
    assert len(cs) == 1, cs
    return cs[0]


def pod_labels():
    return one("StatefulSet", "kvrouter")["spec"]["template"]["metadata"]["labels"]


def selects(match_labels, labels):
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


def container_port(name_or_number):
    for p in container()["ports"]:
        if name_or_number in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    raise AssertionError("no container port %r" % (name_or_number,))


def serve_help():
    r = subprocess.run([ARGS.kvrouter, "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def help_flags(help_text):
    return set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, re.M))


def help_json_keys(help_text):
    return set(re.findall(r"JSON: ([a-z_.]+)\)", help_text))


def binary_version():
    r = subprocess.run([ARGS.kvrouter, "--version"], capture_output=True, text=True, timeout=30)
    m = re.match(r"^kvrouter (\S+) \(commit \S+\)$", r.stdout.strip())
    assert r.returncode == 0 and m, (r.returncode, r.stdout, r.stderr)
    return m.group(1)


def flags_in(words):
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def config_json():
    return json.loads(one("ConfigMap", "kvrouter-config")["data"]["config.json"])


def leaf_keys(obj, prefix=""):
    for k, v in obj.items():
        path = prefix + k
        if isinstance(v, dict) and k != "policy_params":
            yield from leaf_keys(v, path + ".")
        else:
            yield path


def unit_directives():
    out = {}
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";", "[")):
                continue
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def dockerfile_lines():
    with open(DOCKERFILE) as f:
        text = f.read().replace("\\\n", " ")
    return [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]


def dockerfile_stages():
    """{stage name (or its FROM index): [its instruction lines]}."""
    stages, cur = {}, None
    for l in dockerfile_lines():
        words = l.split()
        if words[0].upper() == "FROM":
            name = words[3] if len(words) >= 4 and words[2].upper() == "AS" else str(len(stages))
            cur = stages.setdefault(name, [])
        elif cur is not None:
            cur.append(l)
    return stages


def shell_arrays(path):
    """Every `NAME=(word ...)` assignment of a bash script, in order, as (NAME, [words]), with
    "${OTHER[@]}" replaced by OTHER's words as last assigned above it. Comments inside the
    parentheses are dropped; words are split as the shell splits them (shlex)."""
    import shlex
    with open(path) as f:
        text = f.read()
    out, last = [], {}
    for m in re.finditer(r"^[ \t]*([A-Za-z_][A-Za-z0-9_]*)=\(([^)]*)\)", text, re.M):
        words = []
        for w in shlex.split(m.group(2), comments=True):
            ref = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}", w)
            if ref:
                assert ref.group(1) in last, "%s refers to %s before it is set" % (m.group(1), w)
                words += last[ref.group(1)]
            else:
                assert "$" not in w, "cannot expand %r in %s" % (w, m.group(1))
                words.append(w)
        out.append((m.group(1), words))
        last[m.group(1)] = words
    return out


def install_deps_lists():
    """(build-only packages, full packages) from install-deps.sh's arrays: build-only is
    BUILD_PACKAGES; the full mode installs BUILD_PACKAGES, TEST_PACKAGES and NODE_PACKAGES."""
    arrays = {}
    for name, words in shell_arrays(INSTALL_DEPS):
        arrays.setdefault(name, words)
    for name in ("BUILD_PACKAGES", "TEST_PACKAGES", "NODE_PACKAGES"):
        assert arrays.get(name), "install-deps.sh has no array %s" % name
    build = arrays["BUILD_PACKAGES"]
    full = arrays["BUILD_PACKAGES"] + arrays["TEST_PACKAGES"] + arrays["NODE_PACKAGES"]
    return build, full


def install_deps(*flags):
    return subprocess.run(["bash", INSTALL_DEPS] + list(flags), capture_output=True, text=True,
                          timeout=60)


def dockerignore_patterns():
    with open(DOCKERIGNORE) as f:
        return [l.strip() for l in f if l.strip() and not l.strip().startswith("#")]


def ignore_regex(pattern):
    """Docker's .dockerignore matching (Go filepath.Match per path, `**` any number of folders),
    close enough for the patterns used here; a match also excludes everything below."""
    p = pattern.strip("/")
    rx, i = "", 0
    while i < len(p):
        if p.startswith("**", i):
            rx += ".*"
            i += 2
        elif p[i] == "*":
            rx += "[^/]*"
            i += 1
        elif p[i] == "?":
            rx += "[^/]"
            i += 1
        else:
            rx += re.escape(p[i])
            i += 1
    return re.compile("^" + rx + "(/.*)?$")


def ignored(path):
    out = False
    for pat in dockerignore_patterns():
        neg = pat.startswith("!")
        if ignore_regex(pat[1:] if neg else pat).match(path):
            out = not neg
    return out


# ---------------------------------------------------------------------------- Kubernetes


@test
def test_all_documents_parse_with_expected_kinds():
    kinds = sorted((d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in docs())
    want = [("apps/v1", "StatefulSet", "kvrouter"),
            ("monitoring.coreos.com/v1", "ServiceMonitor", "kvrouter"),
            ("networking.k8s.io/v1", "NetworkPolicy", "kvrouter"),
            ("policy/v1", "PodDisruptionBudget", "kvrouter"),
            ("v1", "ConfigMap", "kvrouter-config"),
            ("v1", "Service", "kvrouter"),
            ("v1", "Service", "kvrouter-admin"),
            ("v1", "Service", "kvrouter-peers")]
    assert kinds == sorted(want), kinds
    for d in docs():
        assert "namespace" not in d["metadata"], "objects follow the namespace applied into"
        assert d["kind"] != "Secret", "the admin token Secret is created by the operator, not shipped"


@test
def test_pod_security_restricted():
    spec, c = pod_spec(), container()
    psc, csc = spec["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True
    for sc in (psc, csc):
        for k in ("runAsUser", "runAsGroup"):
            if k in sc:
                assert isinstance(sc[k], int) and sc[k] > 0, (k, sc[k])
        if "seccompProfile" in sc:
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", sc["seccompProfile"]
    assert isinstance(psc["runAsUser"], int) and psc["runAsUser"] == 65532
    assert psc["runAsGroup"] == 65532
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc["allowPrivilegeEscalation"] is False
    assert csc.get("privileged", False) is False
    assert csc["capabilities"]["drop"] == ["ALL"] and not csc["capabilities"].get("add")
    assert csc["readOnlyRootFilesystem"] is True
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(k), k
    assert not any(p.get("hostPort") for p in c["ports"])
    for v in spec["volumes"]:
        kinds = set(v) - {"name"}
        assert kinds <= RESTRICTED_VOLUME_TYPES, v
    assert spec.get("automountServiceAccountToken") is False


@test
def test_writable_tmp_is_an_emptydir():
    vols = {v["name"]: v for v in pod_spec()["volumes"]}
    tmp = [m for m in container()["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1 and "emptyDir" in vols[tmp[0]["name"]], tmp
    for m in container()["volumeMounts"]:
        if "emptyDir" not in vols[m["name"]]:
            assert m.get("readOnly") is True, m


@test
def test_probes_livez_and_health():
    c = container()
    live, ready = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
    assert live["path"] == "/livez", live
    assert ready["path"] == "/health", ready
    for p in (live, ready):
        container_port(p["port"])
    # The public listener has no token; probes stay off the admin API.
    assert container_port(live["port"]) == container_port("http")
    assert container_port(ready["port"]) == container_port("http")


@test
def test_image_pinned_and_pull_policy():
    c = container()
    image = c["image"]
    m = re.match(r"^([a-z0-9.-]+\.[a-z]+(:\d+)?)/([A-Za-z0-9._/-]+)/kvrouter:([A-Za-z0-9._-]+)$", image)
    assert m, "image must be REGISTRY/OWNER/kvrouter:TAG, got %r" % image
    assert m.group(4) != "latest", image
    assert m.group(4) == binary_version(), "image tag %s, binary %s" % (m.group(4), binary_version())
    assert c["imagePullPolicy"] == "IfNotPresent"


@test
def test_resources_requests_and_limits():
    r = container()["resources"]
    for part in ("requests", "limits"):
        assert "cpu" in r[part] and "memory" in r[part], (part, r[part])


@test
def test_shutdown_timeline():
    spec, c = pod_spec(), container()
    pre = c["lifecycle"]["preStop"]
    if "sleep" in pre:
        sleep_s = int(pre["sleep"]["seconds"])
    else:
        cmd = pre["exec"]["command"]
        assert os.path.basename(cmd[0]) == "sleep" and len(cmd) == 2, cmd
        sleep_s = int(cmd[1])
    assert sleep_s >= 5, "preStop must cover endpoint propagation (>= 5 s), got %d" % sleep_s
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= sleep_s + SHUTDOWN_GRACE_S, (grace, sleep_s)
    assert grace <= sleep_s + SHUTDOWN_GRACE_S + 15, "no point waiting far past the router's grace"
    sts = one("StatefulSet", "kvrouter")["spec"]
    s = sts["updateStrategy"]
    assert s["type"] == "RollingUpdate", s
    assert s["rollingUpdate"]["maxUnavailable"] < sts["replicas"], \
        "a rollout must not empty the front door"


@test
def test_admin_token_secret_mounted_and_passed():
    spec, c = pod_spec(), container()
    secrets = [v for v in spec["volumes"] if "secret" in v]
    assert len(secrets) == 1, secrets
    vol = secrets[0]
    assert vol["secret"]["secretName"] == "kvrouter-admin-token"
    items = vol["secret"]["items"]
    assert [i["key"] for i in items] == ["token"], items
    mount = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert len(mount) == 1 and mount[0].get("readOnly") is True, mount
    path = mount[0]["mountPath"].rstrip("/") + "/" + items[0]["path"]
    args = c["args"]
    i = args.index("--admin-token-file")
    assert args[i + 1] == path, (args, path)
    mode = vol["secret"].get("defaultMode", 0o644)
    assert mode & 0o007 == 0, "token must not be world-readable (mode %o)" % mode
    # Group-readable needs fsGroup = the runtime gid so uid 65532 can read it.
    if not mode & 0o004:
        assert spec["securityContext"].get("fsGroup") == spec["securityContext"]["runAsGroup"]


@test
def test_serve_flags_exist():
    known = help_flags(serve_help())
    c = container()
    assert c["args"][0] == "serve", c["args"]
    cmd = c.get("command", [])
    for flag in flags_in(c["args"] + cmd):
        assert flag in known, "kvrouter serve has no %s" % flag
    exec_start = unit_directives()["ExecStart"][0].split()
    assert exec_start[1] == "serve", exec_start
    for flag in flags_in(exec_start):
        assert flag in known, "kvrouter serve has no %s" % flag
    assert "--admin-token-file" in c["args"] and "--admin-token-file" in exec_start


@test
def test_admin_token_file_in_serve_help():
    """The flag both deployments pass, and its JSON key, are the binary's own (src/core/config.c's
    option table), with the admin API's bearer token as what they mean."""
    help_text = serve_help()
    assert "--admin-token-file" in help_flags(help_text), "kvrouter serve has no --admin-token-file"
    assert "admin_token_file" in help_json_keys(help_text), "no JSON key admin_token_file"
    entry = help_text[help_text.index("--admin-token-file"):]
    entry = entry[:entry.index("(JSON: admin_token_file)")]
    assert "Bearer" in entry, entry


@test
def test_config_keys_exist():
    known = help_json_keys(serve_help())
    assert "workers" in known and "metrics_scrape.interval_ms" in known, known
    cfgs = {"ConfigMap": config_json()}
    with open(os.path.join(ROOT, "deploy", "config.example.json")) as f:
        cfgs["config.example.json"] = json.load(f)
    for where, cfg in cfgs.items():
        for key in leaf_keys(cfg):
            assert key in known, "%s: unknown config key %s" % (where, key)


@test
def test_config_ports_match_container_and_services():
    cfg = config_json()
    pub_host, pub_port = cfg["listen"].rsplit(":", 1)
    adm_host, adm_port = cfg["admin_listen"].rsplit(":", 1)
    assert container_port("http") == int(pub_port)
    assert container_port("admin") == int(adm_port)
    # The admin Service and Prometheus reach the pod address, not the pod's loopback.
    assert adm_host == "0.0.0.0" and pub_host == "0.0.0.0", cfg
    vols = {v["name"]: v for v in pod_spec()["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
    args = container()["args"]
    cfg_path = args[args.index("--config") + 1]
    vol = vols[mounts[os.path.dirname(cfg_path)]]
    assert vol["configMap"]["name"] == "kvrouter-config"


@test
def test_services_select_the_pod():
    labels = pod_labels()
    dep = one("StatefulSet", "kvrouter")
    assert selects(dep["spec"]["selector"]["matchLabels"], labels)
    pub, adm = one("Service", "kvrouter"), one("Service", "kvrouter-admin")
    for svc, port_name in ((pub, "http"), (adm, "admin")):
        assert selects(svc["spec"]["selector"], labels), svc["metadata"]["name"]
        ports = svc["spec"]["ports"]
        assert [p["targetPort"] for p in ports] == [port_name], ports
        container_port(port_name)
    assert adm["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert "admin" not in [p["targetPort"] for p in pub["spec"]["ports"]]


@test
def test_replicas_peer_each_other_and_read_kv_events():
    """Several replicas: each peer URL names a StatefulSet pod through the headless Service on the
    admin port (one entry per replica), and every worker has its KV-event endpoints."""
    sts = one("StatefulSet", "kvrouter")["spec"]
    assert sts["replicas"] >= 2, sts["replicas"]
    peers_svc = one("Service", "kvrouter-peers")["spec"]
    assert sts["serviceName"] == "kvrouter-peers"
    assert peers_svc["clusterIP"] == "None" and peers_svc.get("publishNotReadyAddresses") is True
    assert selects(peers_svc["selector"], pod_labels())
    cfg = config_json()
    want = ["http://kvrouter-%d.kvrouter-peers:%d" % (i, container_port("admin"))
            for i in range(sts["replicas"])]
    assert cfg["peers"] == want, (cfg["peers"], want)
    for w in cfg["workers"]:
        assert isinstance(w, dict) and w["kv_events"].startswith("tcp://"), w
        assert w["kv_replay"].startswith("tcp://"), w


@test
def test_pod_disruption_budget():
    pdb = one("PodDisruptionBudget", "kvrouter")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels())
    spec = pdb["spec"]
    assert ("minAvailable" in spec) != ("maxUnavailable" in spec), spec
    replicas = one("StatefulSet", "kvrouter")["spec"]["replicas"]
    if "minAvailable" in spec:
        assert isinstance(spec["minAvailable"], int) and 1 <= spec["minAvailable"] <= replicas


@test
def test_network_policy_admin_port_only_from_ops_and_monitoring():
    np = one("NetworkPolicy", "kvrouter")
    spec = np["spec"]
    assert selects(spec["podSelector"]["matchLabels"], pod_labels())
    assert "Ingress" in spec["policyTypes"]
    admin_port = container_port("admin")
    public_rules, admin_rules = [], []
    for rule in spec["ingress"]:
        ports = rule.get("ports")
        assert ports, "a rule without ports opens every port: %r" % rule
        nums = {container_port(p["port"]) for p in ports}
        if admin_port in nums:
            admin_rules.append(rule)
            assert nums == {admin_port}, "admin port shares a rule with other ports"
        else:
            public_rules.append(rule)
    assert len(admin_rules) == 1 and public_rules, spec["ingress"]
    peers = admin_rules[0].get("from")
    assert peers, "admin port open to everyone"
    for peer in peers:
        assert "ipBlock" not in peer, peer
        ps = peer.get("podSelector")
        assert ps and ps.get("matchLabels"), "each admin peer must name pod labels: %r" % peer
        if "namespaceSelector" in peer:
            assert peer["namespaceSelector"].get("matchLabels"), "any namespace: %r" % peer
    # Public port: reachable from this namespace (the ingress controller's too, if one exists).
    pub_peers = [p for r in public_rules for p in r.get("from", [])]
    assert any(p.get("podSelector") == {} and "namespaceSelector" not in p for p in pub_peers), pub_peers


@test
def test_service_monitor_scrapes_admin_metrics_with_token():
    sm = one("ServiceMonitor", "kvrouter")
    adm, pub = one("Service", "kvrouter-admin"), one("Service", "kvrouter")
    sel = sm["spec"]["selector"]["matchLabels"]
    assert selects(sel, adm["metadata"]["labels"]), (sel, adm["metadata"]["labels"])
    assert not selects(sel, pub["metadata"].get("labels", {})), "would scrape the public Service"
    eps = sm["spec"]["endpoints"]
    assert len(eps) == 1, eps
    ep = eps[0]
    assert ep["port"] in [p["name"] for p in adm["spec"]["ports"]]
    assert ep["path"] == "/metrics"
    if "authorization" in ep:
        assert ep["authorization"].get("type", "Bearer") == "Bearer"
        cred = ep["authorization"]["credentials"]
    else:
        cred = ep["bearerTokenSecret"]
    vol = [v for v in pod_spec()["volumes"] if "secret" in v][0]["secret"]
    assert cred == {"name": vol["secretName"], "key": vol["items"][0]["key"]}, cred
    # Annotation-based scraping carries no token: it would only collect 401s.
    annotations = one("StatefulSet", "kvrouter")["spec"]["template"]["metadata"].get("annotations", {})
    assert "prometheus.io/scrape" not in annotations, annotations


# ---------------------------------------------------------------------------- image


@test
def test_dockerfile():
    lines = dockerfile_lines()
    froms = [l.split()[1] for l in lines if l.upper().startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage build expected: %r" % froms
    assert all(re.match(r"^debian:12(-slim)?$", f) for f in froms), froms
    users = [l.split()[1] for l in lines if l.upper().startswith("USER ")]
    assert users and re.match(r"^\d+(:\d+)?$", users[-1]), users
    uid = int(users[-1].split(":")[0])
    assert uid != 0 and uid == pod_spec()["securityContext"]["runAsUser"], (uid, users)
    exposed = set()
    for l in lines:
        if l.upper().startswith("EXPOSE "):
            exposed |= {int(p.split("/")[0]) for p in l.split()[1:]}
    assert exposed >= {container_port("http"), container_port("admin")}, exposed
    labels = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", " ".join(lines)))
    for k in ("title", "version", "revision", "source", "created", "description"):
        assert "org.opencontainers.image." + k in labels, (k, labels)
    assert any(l.startswith("ENTRYPOINT") and "kvrouter" in l for l in lines)
    args = {m.group(1): m.group(2) for m in
            (re.match(r"^ARG (\w+)=(\S+)$", l) for l in lines) if m}
    assert args.get("VERSION") == binary_version(), args


@test
def test_dockerfile_build_stage_installs_build_only():
    """The image's build stage installs only what the build needs and configures without the tests
    (whose CMakeLists wants cmocka, which --build-only does not install)."""
    stages = dockerfile_stages()
    assert "build" in stages, "no stage named build: %r" % list(stages)
    runs = [l for l in stages["build"] if l.upper().startswith("RUN ")]
    installs = [l for l in runs if "install-deps.sh" in l]
    assert installs, "the build stage never runs deploy/install-deps.sh: %r" % runs
    for l in installs:
        assert "--build-only" in l.split(), "install-deps.sh without --build-only: %s" % l
    # Nothing else in the stage brings the full install back (deploy/build.sh runs the full one).
    for l in runs:
        assert "build.sh" not in l and "run-tests.sh" not in l, l
    configures = [l for l in runs if re.search(r"\bcmake\s+(-S|-B)", l)]
    assert configures, "no cmake configure in the build stage: %r" % runs
    for l in configures:
        assert "-DBUILD_TESTING=OFF" in l, "configured with the tests on (cmocka needed): %s" % l
    # The packages are installed before the sources are copied, so a source change reuses them.
    copy_all = [i for i, l in enumerate(stages["build"]) if re.match(r"^COPY\s+\.\s", l)]
    first_install = stages["build"].index(installs[0])
    assert copy_all and first_install < copy_all[0], stages["build"]


@test
def test_install_deps_build_only_list():
    build, full = install_deps_lists()
    for want in ("build-essential", "cmake", "pkg-config", "node-llhttp", "libuv1-dev",
                 "libcurl4-openssl-dev", "libxxhash-dev", "libcjson-dev", "libzmq3-dev",
                 "libmsgpack-dev"):
        assert want in build, "build-only list lacks %s: %r" % (want, build)
    for p in build:
        for word in TEST_ONLY_PACKAGE_WORDS:
            assert word not in p, "build-only list holds %s (test tooling)" % p
    assert len(set(build)) == len(build), build
    assert set(build) <= set(full), "not in the full list: %r" % sorted(set(build) - set(full))
    # The full list keeps the test tooling the default mode has always installed.
    for want in ("libcmocka-dev", "clang", "libclang-rt-14-dev", "chromium", "chromium-driver",
                 "python3-selenium", "nodejs", "npm"):
        assert want in full, "full list lacks %s" % want


@test
def test_install_deps_modes_use_those_lists():
    """--list prints what each mode would install (nothing is installed), and it is the arrays
    parsed above; an unknown flag is refused in one line before anything runs."""
    build, full = install_deps_lists()
    r = install_deps("--build-only", "--list")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == build, (r.stdout, build)
    r = install_deps("--list")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == full, (r.stdout, full)
    r = install_deps("--no-such-flag")
    assert r.returncode != 0 and r.stdout == "", (r.returncode, r.stdout)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "--no-such-flag" in lines[0], r.stderr


@test
def test_dockerignore():
    pats = dockerignore_patterns()
    for want in (".git", "build*", "results", "bench/results"):
        assert want in pats, (want, pats)
    for path in (".git/HEAD", "build/kvrouter", "build-asan/x", "results/a.json",
                 "bench/results/study/x.md", "tests/router/__pycache__/x.pyc"):
        assert ignored(path), "%s is sent to the daemon" % path
    # What the build stage needs must stay in the context.
    for path in ("CMakeLists.txt", "deploy/build.sh", "deploy/install-deps.sh",
                 "deploy/config.example.json", "src/core/router.c", "router/serve.c",
                 "policies", "bench", "tests/CMakeLists.txt"):
        assert not ignored(path), "%s is excluded but the build needs it" % path
    for l in dockerfile_lines():
        if l.upper().startswith("COPY ") and "--from" not in l:
            src = l.split()[1]
            if src != ".":
                assert os.path.exists(os.path.join(ROOT, src)) and not ignored(src), src


# ---------------------------------------------------------------------------- systemd


@test
def test_systemd_unit_hardening():
    d = unit_directives()
    assert d.get("ExecReload") == ["/bin/kill -HUP $MAINPID"], d.get("ExecReload")
    assert d.get("DynamicUser") == ["yes"] or (d.get("User") and d["User"][0] != "root"), d.get("User")
    want = {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
            "PrivateDevices": "yes", "NoNewPrivileges": "yes", "MemoryDenyWriteExecute": "yes",
            "LockPersonality": "yes", "RestrictNamespaces": "yes", "ProtectKernelTunables": "yes",
            "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
            "ProtectControlGroups": "yes", "RestrictRealtime": "yes", "CapabilityBoundingSet": "",
            "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "KillSignal": "SIGTERM"}
    for k, v in want.items():
        assert d.get(k, [None])[-1] == v, (k, d.get(k), v)
    assert "@system-service" in d["SystemCallFilter"], d["SystemCallFilter"]
    assert re.match(r"^0?0[0-7]7$", d["UMask"][0]), d["UMask"]
    assert int(d["TimeoutStopSec"][0]) > SHUTDOWN_GRACE_S, d["TimeoutStopSec"]
    # The admin token given as a credential: the file the flag names is the credential loaded.
    cred = d["LoadCredential"][0].split(":", 1)[0]
    exec_start = d["ExecStart"][0].split()
    path = exec_start[exec_start.index("--admin-token-file") + 1]
    assert path in ("%d/" + cred, "${CREDENTIALS_DIRECTORY}/" + cred), (path, cred)


@test
def test_systemd_analyze_security_score():
    exe = shutil.which("systemd-analyze")
    if not exe:
        print("  (systemd-analyze not installed: score not measured)")
        return
    r = subprocess.run([exe, "security", "--offline=true", UNIT], capture_output=True, text=True,
                       timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    if not m:  # older systemd without --offline
        print("  (systemd-analyze security --offline unsupported: %s)" % r.stderr.strip()[:120])
        return
    score = float(m.group(1))
    print("  systemd-analyze security: %.1f" % score)
    assert score <= 2.0, "exposure %.1f > 2.0" % score


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", default=os.path.join(ROOT, "build", "kvrouter"))
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    ARGS = ap.parse_args()
    failed = ran = 0
    for fn in TESTS:
        if ARGS.k not in fn.__name__:
            continue
        ran += 1
        t0 = time.monotonic()
        try:
            fn()
            print("PASS %-58s %6.2fs" % (fn.__name__, time.monotonic() - t0), flush=True)
        except Exception as e:
            failed += 1
            print("FAIL %-58s %s: %s" % (fn.__name__, type(e).__name__, e), flush=True)
            traceback.print_exc()
    print("%d passed, %d failed" % (ran - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
