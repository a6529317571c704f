#!/usr/bin/env python3
"""The admin listener's live dashboard (GET /dashboard, src/serve/dashboard.c + src/serve/dashboard.html) in a
real headless browser: Debian's Chromium driven through chromedriver by python3-selenium, against a
real `kvrouter serve` with two `kvrouter sim` workers and an admin token that reads need too.

Over plain HTTP first (no browser): /dashboard answers 200 text/html without a token, with a CSP
naming a fresh nonce and no external source, the page holds no URL of another host; / redirects to
it; another method is a 405; the admin JSON the page reads needs the token.

In the browser: the page loads with no request off the admin origin (performance.getEntries()) and
no console error; without a token it shows the router's 401 message; with the token the workers
table shows both workers and their state; requests sent through the proxy raise the decision count
of the current policy; a wrong token makes a policy switch show the 401 message and the policy
stays (checked from Python); the right token switches it (checked from Python), and the new
policy's decision count rises. With --admin-open-reads the page reads without a token and asks
for none, and the switch still needs the token. A data-parallel server (a sim with
--data-parallel-size 2 given as --worker URL,dp_size=2) shows one row per rank, its URL cell
naming the rank.

Exit 77 (CTest: skipped) when chromium, chromedriver or python3-selenium is missing, after the
HTTP checks above ran and passed (a failure there still fails the test):

    python3 tests/router/test_dashboard.py --kvrouter build/kvrouter [-k NAME] [-v]
"""

import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, AdminToken, Cleanup, Router, Sim  # noqa: E402

TESTS, test = h.registry()
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    # loopback only: no background traffic, and no name but 127.0.0.1 resolves
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-default-apps", "--disable-extensions", "--no-pings",
    "--disable-domain-reliability", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


def browser_stack():
    """(webdriver, Service, By, Select, chromium, chromedriver), or a string saying what is
    missing. Debian's python3-selenium lives in the system's dist-packages, which a Python of the
    same version from elsewhere (pyenv) does not search."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        sys.path.append("/usr/lib/python3/dist-packages")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select
    except ImportError as e:
        return "python3-selenium is needed (%s)" % e
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        return "chromium and chromedriver are needed (found chromium=%s chromedriver=%s)" % (
            chromium, driver)
    return webdriver, Service, By, Select, chromium, driver


def start_cluster(c, tok):
    sims = [c.add(Sim()) for _ in range(2)]
    r = c.add(Router(sims, *FAST, *tok.flags, "--policy", "kv_aware"))
    h.wait_for(lambda: all(w["state"] == "up" for w in admin_get(r, "/admin/workers", tok)
                           ["workers"]), 5, "both workers up")
    return sims, r


def admin_get(r, path, tok):
    resp = h.request(r.admin_port, "GET", path, headers=tok.headers)
    assert resp.status == 200, (path, resp.status, resp.body[:300])
    return resp.json()


def send_requests(r, n):
    for i in range(n):
        resp = h.request(r.port, "POST", "/v1/chat/completions",
                         h.chat_body("dashboard check %d: " % (i % 2) + "lorem ipsum " * 40),
                         timeout=10)
        assert resp.status == 200, (resp.status, resp.body[:300])


# ---- HTTP (no browser) --------------------------------------------------------------------------

@test(timeout=60)
def test_page_over_http():
    with Cleanup() as c:
        tok = c.add(AdminToken())
        _, r = start_cluster(c, tok)
        resp = h.request(r.admin_port, "GET", "/dashboard")  # no token: the page itself is open
        assert resp.status == 200, (resp.status, resp.body[:300])
        assert resp.header("content-type") == "text/html; charset=utf-8", resp.header(
            "content-type")
        csp = resp.header("content-security-policy")
        m = re.fullmatch(r"default-src 'none'; script-src 'nonce-([0-9a-f]{32})'; "
                         r"style-src 'nonce-\1'; connect-src 'self'; img-src data:; "
                         r"base-uri 'none'; form-action 'none'; frame-ancestors 'none'", csp or "")
        assert m, csp
        nonce = m.group(1)
        body = resp.text()
        assert body.count('nonce="%s"' % nonce) == 2, "the style and the script carry the nonce"
        assert "{{nonce}}" not in body
        urls = re.findall(r"(?i)\b(?:https?:)?//[a-z0-9.\[\]:-]+", body)
        assert not urls, "URLs in the page: %r" % urls
        assert resp.header("x-content-type-options") == "nosniff"
        assert resp.header("cache-control") == "no-store"
        again = h.request(r.admin_port, "GET", "/dashboard")
        assert nonce not in again.header("content-security-policy"), "a fresh nonce per response"
        head = h.request(r.admin_port, "HEAD", "/dashboard")
        assert head.status == 200 and head.body == b"", (head.status, head.body[:100])
        root = h.request(r.admin_port, "GET", "/")
        assert root.status == 302 and root.header("location") == "/dashboard", (
            root.status, root.header("location"))
        post = h.request(r.admin_port, "POST", "/dashboard", {"x": 1}, headers=tok.headers)
        assert post.status == 405 and "GET" in post.header("allow"), post.status
        h.assert_openai_error(post, 405)
        # the data the page reads stays behind the token
        for path in ("/admin/workers", "/admin/policy"):
            h.assert_openai_error(h.request(r.admin_port, "GET", path), 401)
        w = admin_get(r, "/admin/workers", tok)
        assert set(w["cache_index"]) >= {"blocks", "entries", "bytes", "evictions"}, w
        assert set(w["workers"][0]["cached"]) == {
            "prompt_tokens", "predicted_cached_tokens", "usage_prompt_tokens",
            "usage_predicted_cached_tokens", "usage_cached_tokens"}, w["workers"][0]
        p = admin_get(r, "/admin/policy", tok)
        assert set(p["decisions_by_policy"]) == {a["name"] for a in p["available"]}, p


# ---- browser ------------------------------------------------------------------------------------

class Browser:
    """A headless Chromium (Cleanup protocol: kill() quits it and removes its profile)."""

    def __init__(self, stack):
        webdriver, Service, self.By, self.Select, chromium, driver = stack
        self.profile = tempfile.mkdtemp(prefix="kvr-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for f in CHROMIUM_FLAGS + ["--user-data-dir=" + self.profile]:
            opts.add_argument(f)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.d = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
        self.d.set_page_load_timeout(15)
        self.d.set_script_timeout(10)

    def kill(self):
        try:
            self.d.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def text(self, elem_id):
        return self.d.find_element(self.By.ID, elem_id).text

    def wait(self, pred, what, timeout=8):
        return h.wait_for(pred, timeout, what, interval=0.1)

    def severe_logs(self):
        return [e for e in self.d.get_log("browser") if e["level"] == "SEVERE"]

    # The page replaces its table rows on every poll, so each table is read in one script call
    # (an element found in one call may be gone by the next: a stale reference).
    def rows(self, table):
        """[[data-url or data-policy, [cell texts]]] of a table's body, read atomically."""
        return self.d.execute_script(
            "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))"
            ".map(tr => [tr.dataset.url || tr.dataset.policy,"
            " Array.from(tr.cells).map(td => td.textContent)]);", table)

    def worker_rows(self):
        """{url: state} of the workers table."""
        return {url: cells[2] for url, cells in self.rows("workers")}

    def cached_rows(self):
        """{url: [prompt, predicted cached, actual cached tokens]} of the cached table."""
        return {url: [int(t.replace(",", "")) for t in cells[1:4]]
                for url, cells in self.rows("cached")}

    def cached_sources(self):
        """{url: source column} of the cached table."""
        return {url: cells[-1] for url, cells in self.rows("cached")}

    def decisions(self, policy):
        """The decision count the page shows for policy, None when it has no row."""
        got = {name: int(cells[1].replace(",", "")) for name, cells in self.rows("decisions")}
        return got.get(policy)

    def use_token(self, token):
        box = self.d.find_element(self.By.ID, "token")
        box.clear()
        box.send_keys(token)
        self.d.find_element(self.By.ID, "token-save").click()

    def switch_policy(self, name):
        self.Select(self.d.find_element(self.By.ID, "policy-select")).select_by_value(name)
        self.d.find_element(self.By.ID, "policy-apply").click()


def browser_test(stack):
    with Cleanup() as c:
        tok = c.add(AdminToken())
        sims, r = start_cluster(c, tok)
        b = c.add(Browser(stack))
        origin = "http://127.0.0.1:%d" % r.admin_port

        # Without a token the page loads but its reads are refused: it shows the 401 message.
        b.d.get(origin + "/")
        assert b.d.current_url == origin + "/dashboard", b.d.current_url
        b.wait(lambda: b.d.find_element(b.By.ID, "auth").is_displayed(), "the 401 panel")
        msg = b.text("auth-msg")
        assert msg.startswith("HTTP 401: ") and "Authorization: Bearer" in msg, msg

        # With the token: both workers and their state.
        b.use_token(tok.token)
        urls = {s.url: "up" for s in sims}
        b.wait(lambda: b.worker_rows() == urls, "both workers up in the table")
        assert not b.d.find_element(b.By.ID, "auth").is_displayed()

        # A fresh load with the token kept in sessionStorage: no console error, no request that
        # left the admin origin (the page's own URL and its fetches only).
        b.d.get_log("browser")  # drop what the 401s above logged
        b.d.refresh()
        b.wait(lambda: b.worker_rows() == urls, "the table after a reload")
        time.sleep(1.5)  # at least one more poll
        errors = b.severe_logs()
        assert not errors, "console errors: %r" % errors
        names = b.d.execute_script(
            "return performance.getEntries().map(e => e.name)"
            ".filter(n => /^[a-z][a-z0-9+.-]*:/i.test(n));")
        assert any(n.endswith("/admin/workers") for n in names), names
        off = [n for n in names if not n.startswith(origin + "/")]
        assert not off, "requests off the admin origin: %r" % off
        assert set(b.cached_rows()) == set(urls), b.cached_rows()

        # Requests through the proxy raise the current policy's decision count on the page.
        assert b.text("policy-name") == "kv_aware"
        before = b.wait(lambda: b.decisions("kv_aware") is not None and [b.decisions("kv_aware")],
                        "the decisions table")[0]
        want = admin_get(r, "/admin/policy", tok)["decisions_by_policy"]["kv_aware"]
        assert before == want, (before, want)
        send_requests(r, 6)
        b.wait(lambda: b.decisions("kv_aware") >= before + 6, "decisions +6 on the page")
        # and the predicted-vs-actual table shows the router's figures for each worker
        want = {w["url"]: [w["cached"][k] for k in ("usage_prompt_tokens",
                                                     "usage_predicted_cached_tokens",
                                                     "usage_cached_tokens")]
                for w in admin_get(r, "/admin/workers", tok)["workers"]}
        assert sum(v[0] for v in want.values()) > 0, want
        b.wait(lambda: b.cached_rows() == want, "the cached table equal to /admin/workers")
        # the sims report prompt_tokens_details: every worker that answered is on the usage source
        srcs = {w["url"]: w["cached_tokens"]["source"]
                for w in admin_get(r, "/admin/workers", tok)["workers"]}
        assert "usage" in srcs.values() and b.cached_sources() == srcs, (srcs,
                                                                          b.cached_sources())

        # A wrong token: the switch is refused with the 401 message, the policy stays.
        b.use_token("not-the-admin-token-0000000000")
        b.switch_policy("round_robin")
        b.wait(lambda: "HTTP 401" in b.text("policy-msg"), "the 401 message of the switch")
        msg = b.text("policy-msg")
        assert msg.startswith("not switched: HTTP 401: ") and "Bearer" in msg, msg
        assert admin_get(r, "/admin/policy", tok)["policy"] == "kv_aware"

        # The right token: the switch happens.
        b.use_token(tok.token)
        b.wait(lambda: b.worker_rows() == urls, "the table back with the right token")
        b.switch_policy("round_robin")
        b.wait(lambda: b.text("policy-msg") == "policy is now round_robin", "the switch message")
        assert admin_get(r, "/admin/policy", tok)["policy"] == "round_robin"
        b.wait(lambda: b.text("policy-name") == "round_robin", "the page showing round_robin")
        kv_aware = b.decisions("kv_aware")
        send_requests(r, 2)
        b.wait(lambda: b.decisions("round_robin") == 2, "round_robin's decisions on the page")
        assert b.decisions("kv_aware") == kv_aware, (b.decisions("kv_aware"), kv_aware)
        severe = [e for e in b.severe_logs() if "401" not in e["message"]]
        assert not severe, "console errors other than the expected 401s: %r" % severe


def open_reads_test(stack):
    """--admin-open-reads: the page shows everything without a token and asks for none, but the
    switch still needs it."""
    with Cleanup() as c:
        tok = c.add(AdminToken())
        sims = [c.add(Sim()) for _ in range(2)]
        r = c.add(Router(sims, *FAST, *tok.flags, "--admin-open-reads", "true"))
        b = c.add(Browser(stack))
        b.d.get("http://127.0.0.1:%d/dashboard" % r.admin_port)
        urls = {s.url: "up" for s in sims}
        b.wait(lambda: b.worker_rows() == urls, "both workers up without a token")
        assert not b.d.find_element(b.By.ID, "auth").is_displayed()
        assert not b.severe_logs(), b.severe_logs()
        before = admin_get(r, "/admin/policy", tok)["policy"]
        other = "least_load" if before != "least_load" else "round_robin"
        b.switch_policy(other)
        b.wait(lambda: "HTTP 401" in b.text("policy-msg"), "the 401 message of the switch")
        assert b.text("policy-msg").startswith("not switched: HTTP 401: "), b.text("policy-msg")
        assert admin_get(r, "/admin/policy", tok)["policy"] == before
        assert not b.d.find_element(b.By.ID, "auth").is_displayed()  # reads still work
        b.use_token(tok.token)
        b.switch_policy(other)
        b.wait(lambda: b.text("policy-msg") == "policy is now " + other, "the switch message")
        assert admin_get(r, "/admin/policy", tok)["policy"] == other


def dp_ranks_test(stack):
    """A data-parallel server (kvrouter sim --data-parallel-size 2, --worker URL,dp_size=2): one
    row per rank in both tables, keyed by the rank's key, its URL cell naming the rank."""
    with Cleanup() as c:
        s = c.add(Sim("--data-parallel-size", 2))
        r = c.add(Router([s.url + ",dp_size=2"], *FAST))
        b = c.add(Browser(stack))
        b.d.get("http://127.0.0.1:%d/dashboard" % r.admin_port)
        keys = {s.url + "#dp=0": "up", s.url + "#dp=1": "up"}
        b.wait(lambda: b.worker_rows() == keys, "one row per rank")
        cells = {k: v[1] for k, v in b.rows("workers")}
        assert cells[s.url + "#dp=0"] == s.url + " (rank 0 of 2)", cells
        assert cells[s.url + "#dp=1"] == s.url + " (rank 1 of 2)", cells
        assert set(b.cached_rows()) == set(keys), b.cached_rows()
        assert not b.severe_logs(), b.severe_logs()


def main():
    stack = browser_stack()
    if isinstance(stack, str):
        status = h.run(TESTS)
        if status != 0:
            return status
        print("SKIP: browser tests: %s (apt-get install chromium chromium-driver "
              "python3-selenium)" % stack)
        return 77

    @test(timeout=120)
    def test_dashboard_in_chromium():
        browser_test(stack)

    @test(timeout=120)
    def test_dashboard_open_reads():
        open_reads_test(stack)

    @test(timeout=120)
    def test_dashboard_dp_ranks():
        dp_ranks_test(stack)

    return h.run(TESTS)


if __name__ == "__main__":
    sys.exit(main())
