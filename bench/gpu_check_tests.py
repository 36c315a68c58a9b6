#!/usr/bin/env python3
"""The tests labelled gpu of a configured build directory, for bench/gpu_check.sh (standard
library only; tests run under mpiexec are left out: the device machine has no MPI).

    gpu_check_tests.py targets BUILD      the executables they run (built or not), one a line
    gpu_check_tests.py list BUILD SRC     JSON [{name, command, skip_rc, timeout, env}] with the
                                          build dir written {bin} and the source tree {src}
and, on such a list (LIST: its file):
    gpu_check_tests.py plan LIST BIN SRC P1 P2 ...
                                          one shell-quoted line per test whose name contains
                                          P1, then P2, ..., then (for the pattern "+") every test
                                          not listed yet: NAME SKIP_RC TIMEOUT ENV... -- CMD...
                                          with {bin} and {src} replaced by BIN and SRC; "-P"
                                          leaves out the tests whose name contains P
The executables come from CTestTestfile.cmake (ctest names no command for a test whose
executable is not built yet); the list from `ctest --show-only=json-v1` once they are built.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys


def targets(build):
    cmds, labels = {}, {}
    for f in glob.glob(os.path.join(build, "**", "CTestTestfile.cmake"), recursive=True):
        text = open(f).read()
        for m in re.finditer(r'add_test\(\[=\[(.*?)\]=\]\s+(.*?)\)\n', text):
            cmds[m.group(1)] = re.findall(r'"([^"]*)"', m.group(2))
        for m in re.finditer(r'set_tests_properties\(\[=\[(.*?)\]=\]\s+PROPERTIES(.*?)\)\n', text):
            lab = re.search(r'LABELS\s+"([^"]*)"', m.group(2))
            labels[m.group(1)] = lab.group(1).split(";") if lab else []
    out = set()
    for name, cmd in cmds.items():
        if "gpu" not in labels.get(name, []) or any("mpiexec" in c or "mpirun" in c for c in cmd):
            continue
        for c in cmd:
            rest = c[len(build) + 1:]
            if c.startswith(build + "/") and "/" not in rest:
                out.add(rest)
    return sorted(out)


def test_list(build, src):
    res = subprocess.run(["ctest", "-L", "gpu", "--show-only=json-v1"], cwd=build,
                         capture_output=True, text=True, check=True)
    out = []
    for t in json.loads(res.stdout).get("tests", []):
        cmd = t.get("command") or []
        if not cmd or any("mpiexec" in c or "mpirun" in c for c in cmd):
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        out.append({"name": t["name"],
                    "command": [c.replace(build, "{bin}").replace(src, "{src}") for c in cmd],
                    "skip_rc": int(props.get("SKIP_RETURN_CODE", -1)),
                    "timeout": int(float(props.get("TIMEOUT", 300))),
                    "env": props.get("ENVIRONMENT", [])})
    return out


def plan(tests, bin_dir, src, patterns):
    """The tests to run, in the order of the patterns, as shell-quoted lines."""
    done, lines = set(), []
    for pat in patterns:
        if pat.startswith("-"):  # tests run elsewhere: never listed
            done.update(t["name"] for t in tests if pat[1:] in t["name"])
            continue
        for t in tests:
            name = t["name"]
            if name in done or (pat != "+" and pat not in name):
                continue
            done.add(name)
            cmd = [c.replace("{bin}", bin_dir).replace("{src}", src) for c in t["command"]]
            words = [name, str(t["skip_rc"]), str(t["timeout"])] + list(t["env"]) + ["--"] + cmd
            lines.append(" ".join(shlex.quote(w) for w in words))
    return lines


def query(cmd, args):
    if cmd == "plan" and len(args) >= 4:
        return plan(json.load(open(args[0])), args[1], args[2], args[3:])
    sys.exit(__doc__)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "targets":
        print("\n".join(targets(os.path.abspath(sys.argv[2]))))
    elif len(sys.argv) == 4 and sys.argv[1] == "list":
        json.dump(test_list(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])),
                  sys.stdout, indent=1)
    elif len(sys.argv) >= 3:
        for line in query(sys.argv[1], sys.argv[2:]):
            print(line)
    else:
        sys.exit(__doc__)
