# SPDX-License-Identifier: Apache-2.0
"""kdnd.monitoring: server/monitoring's alert rules and Grafana dashboard
against a running kdnd.

- `promtool check rules` and `promtool test rules` (the alerts' unit tests);
- a kdnd with a host and a disk tier and KV events, two engines sharing KV
  through it (`kdn demo --remote --node`), and a real Prometheus server
  scraping it every second;
- every series the dashboard and the rules name is on kdnd's page, and
  every panel's query returns data from that Prometheus.

    monitoring_test.py KDN KDND SOURCE_DIR
Skips (exit 77) without promtool or prometheus, unless KDN_REQUIRE_PROMTOOL=1.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

kdn, kdnd, src = sys.argv[1:4]
mon = os.path.join(src, "server", "monitoring")


def fail(why):
    print("FAIL:", why)
    sys.exit(1)


for tool in ("promtool", "prometheus"):
    if shutil.which(tool) is None:
        if os.environ.get("KDN_REQUIRE_PROMTOOL") == "1":
            fail(tool + " is not installed (scripts/setup installs the prometheus package)")
        print("SKIPPED:", tool, "is not installed")
        sys.exit(77)

for args in (["check", "rules", "kdnd-alerts.yml"], ["test", "rules", "kdnd-alerts.test.yml"]):
    r = subprocess.run(["promtool"] + args, cwd=mon, capture_output=True, text=True)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail("promtool " + " ".join(args))

# The queries: each panel's targets, and each rule's expression.
board = json.load(open(os.path.join(mon, "kdnd-grafana.json")))
queries = [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]
rules = open(os.path.join(mon, "kdnd-alerts.yml")).read()
names = set(re.findall(r"\b((?:kdn|process)_[a-z0-9_]+)", rules + json.dumps(queries)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


work = tempfile.mkdtemp(prefix="kdn-monitoring-")
procs = []
try:
    for name in ("team", "ops"):
        subprocess.run([kdnd, "token", "new", "--file", os.path.join(work, name + ".token")], check=True,
                       stdout=subprocess.DEVNULL)
    with open(os.path.join(work, "ops.token")) as f:
        ops_token = f.read().strip()
    metrics_port = free_port()
    os.makedirs(os.path.join(work, "disk"))
    config = os.path.join(work, "kdnd.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
listen = ["unix:{work}/kdnd.sock"]
metrics = "127.0.0.1:{metrics_port}"
kv_events = "tcp://127.0.0.1:{free_port()}"
prefill_us_per_token = 150.0
[[tier]]
kind = "host"
capacity = "1MiB"
write_through = true
[[tier]]
kind = "disk"
capacity = "64MiB"
path = "{work}/disk"
[[token]]
token_file = "team.token"
namespaces = ["team"]
[[token]]
token_file = "ops.token"
stats = true
""")
    os.chmod(config, 0o600)
    ready = os.path.join(work, "ready")
    procs.append(subprocess.Popen([kdnd, "--config", config, "--ready-file", ready]))
    for _ in range(600):
        if os.path.exists(ready) and os.path.getsize(ready) > 0:
            break
        time.sleep(0.1)
    else:
        fail("kdnd did not start")

    prom_port = free_port()
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{mon}/kdnd-alerts.yml"]
scrape_configs:
  - job_name: kdnd
    authorization: {{type: Bearer, credentials_file: "{work}/ops.token"}}
    static_configs: [{{targets: ["127.0.0.1:{metrics_port}"]}}]
""")
    procs.append(subprocess.Popen(["prometheus", "--config.file=" + os.path.join(work, "prometheus.yml"),
                                   "--storage.tsdb.path=" + os.path.join(work, "tsdb"),
                                   "--web.listen-address=127.0.0.1:%d" % prom_port, "--log.level=warn"]))

    # Traffic: two engines share KV through the node, twice (a second
    # scrape sees the counters move, so rate() has something to say).
    for _ in range(2):
        r = subprocess.run([kdn, "demo", "--remote", "--node", "unix:" + work + "/kdnd.sock", "--token-file",
                            os.path.join(work, "team.token"), "--namespace", "team", "--repeats", "1", "--steps", "4"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            fail("kdn demo --remote --node exited %d" % r.returncode)
        time.sleep(3)

    scrape = urllib.request.Request("http://127.0.0.1:%d/metrics" % metrics_port,
                                    headers={"Authorization": "Bearer " + ops_token})
    page = urllib.request.urlopen(scrape, timeout=10).read().decode()
    families = set(re.findall(r"^# TYPE (\S+) ", page, re.M))
    missing = sorted(n for n in names if re.sub(r"_(bucket|sum|count)$", "", n) not in families)
    if missing:
        fail("named by the dashboard or the rules, not on kdnd's page: " + ", ".join(missing))
    print("every one of the %d series named is on the page" % len(names))

    def query(expr):
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (prom_port, urllib.parse.urlencode({"query": expr}))
        body = json.load(urllib.request.urlopen(url, timeout=10))
        if body.get("status") != "success":
            fail("Prometheus refused %r: %s" % (expr, body))
        return body["data"]["result"]

    # Until Prometheus has scraped the traffic (at most ~20 s).
    deadline = time.time() + 30
    empty = []
    while True:
        empty = []
        for title, expr in queries:
            e = expr.replace('{instance=~"$instance"}', "")
            if not query(e):
                empty.append("%s: %s" % (title, e))
        if not empty or time.time() > deadline:
            break
        time.sleep(2)
    if empty:
        fail("panel queries with no data from a scrape of a running kdnd:\n  " + "\n  ".join(empty))
    print("all %d panel queries return data" % len(queries))
    # Usage is labelled by the namespace's name in the token file and a model fingerprint.
    usage = query('kdn_usage_load_hit_tokens_total{namespace="team"}')
    if not usage or not usage[0]["metric"].get("model", "").startswith("fp:") or float(usage[0]["value"][1]) <= 0:
        fail("no kdn_usage_load_hit_tokens_total for namespace team and a model fingerprint: %r" % usage)
    print("usage of namespace team, model %s: %s tokens served" % (usage[0]["metric"]["model"], usage[0]["value"][1]))
    hit = query("kdn_lookup_hit_ratio")
    print("kdn_lookup_hit_ratio on the scrape:", hit[0]["value"][1] if hit else None)
    print("passed")
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(work, ignore_errors=True)
