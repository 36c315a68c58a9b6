#!/usr/bin/env python3
"""The tests labelled gpu of a configured build directory, for bench/gpu_check.sh (standard
library only; tests run under mpiexec are left out: the device machine has no MPI).

    gpu_check_tests.py targets BUILD      the executables they run (built or not), one a line
    gpu_check_tests.py list BUILD SRC     JSON [{name, command, skip_rc, timeout, env}] with the
                                          build dir written {bin} and the source tree {src}
The executables come from CTestTestfile.cmake (ctest names no command for a test whose
executable is not built yet); the list from `ctest --show-only=json-v1` once they are built.
"""
import glob
import json
import os
import re
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "targets":
        print("\n".join(targets(os.path.abspath(sys.argv[2]))))
    elif len(sys.argv) == 4 and sys.argv[1] == "list":
        json.dump(test_list(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])),
                  sys.stdout, indent=1)
    else:
        sys.exit(__doc__)
