#!/usr/bin/env bash
# The watchdog test script (run_watchdog_test.sh) on a stand-in child (label cpu, no GPU): it
# must time each child from its ready line, so a slow start does not count against the deadline
# (a start of 0.9 s plus 0.3 s to the error passes a 1 s limit), while an error that comes too
# long after the ready line still fails (1.2 s).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export INFOFLOW_WATCHDOG_LIMIT_S=1.0
ok=1
out=$(FAKE_STARTUP_S=0.9 FAKE_AFTER_S=0.3 bash "$here/run_watchdog_test.sh" "$here/fake_watchdog_child.sh" 2>&1)
rc=$?
echo "$out"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: a slow start (0.9 s) before a prompt error (0.3 s) was counted against the limit"
    ok=0
fi
out=$(FAKE_STARTUP_S=0 FAKE_AFTER_S=1.2 bash "$here/run_watchdog_test.sh" "$here/fake_watchdog_child.sh" 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 0 ] || ! echo "$out" | grep -q "FAIL (--watchdog-child): took"; then
    echo "FAIL: an error 1.2 s after the ready line passed a 1 s limit"
    ok=0
fi
[ "$ok" -eq 1 ] && echo "PASS: the watchdog script times from the ready line"
[ "$ok" -eq 1 ]
