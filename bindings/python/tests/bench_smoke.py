# SPDX-License-Identifier: Apache-2.0
"""bindings.python.bench_smoke: the bench script runs and prints its JSON line
(no timing is asserted: the machine is shared). Usage: bench_smoke.py BENCH"""
import json
import subprocess
import sys

out = subprocess.run([sys.argv[1], "--repeats", "1"], check=True, capture_output=True, text=True).stdout
lines = out.strip().splitlines()
assert len(lines) == 1, f"expected one line of JSON, got {out!r}"
got = json.loads(lines[0])
assert set(got) == {"retrieve_gbps", "lookup_us"}, got
assert all(isinstance(v, float) and v > 0 for v in got.values()), got
print(lines[0])
