#!/usr/bin/env bash
# usage: tests/passes.sh PYTHON [pytest args...]   (./dev.sh test runs it once the tools are installed)
#
# The suite in two passes (tests/kinds.py, issue 50):
#  1. the tests that do not measure, on four pytest-xdist workers, each module on one (its module fixtures made
#     once, its tests in order): the suite's waits (Prometheus, agents, scripted jobs) overlap;
#  2. the tests marked measures (their oracle is a clock or a CPU share, or they load the CPU on purpose), in
#     one process, with nothing of the suite beside them.
# The arguments go to both passes as given (./dev.sh test tests/x.py::y runs y in the pass of its kind).  A pass
# in which none of the selected tests is of its kind exits 5; only both doing so is "no tests".  Each pass
# prints its 25 slowest tests.  A worker that dies is replaced twice, then the run stops (and fails).
# Four workers by default.  On stop 64's 2-core machine the first pass is CPU-bound (195 % CPU, idle 0.5 %
# with six workers: 930 CPU seconds): more workers only fill the gaps their tests wait in.  With the serial
# pass's bare runs in it, four finished it in 497-501 s, six in 476 s; three, before those runs were in it,
# in 463-503 s, two in 621-659 s.  TEYE_TEST_WORKERS=N: N workers; 1: the first pass in one process too.
# The serial pass's bare runs (a job without teye, compared by output, never by time) are made by the first pass
# into a directory of this invocation's (tests/reference.py), so the serial pass spends its time on what it
# measures.
set -uo pipefail
py=$1
shift
workers=${TEYE_TEST_WORKERS:-4}
par=()
if [ "$workers" -gt 1 ]; then par=(-n "$workers" --dist loadfile --no-loadscope-reorder --max-worker-restart 2); fi
# the serial pass's bare runs, made by the first pass (tests/reference.py): this invocation's, gone after it
refs=$(mktemp -d "${TMPDIR:-/tmp}/teye-references.XXXXXX") || exit 1
trap 'rm -rf "$refs"' EXIT
export TEYE_TEST_REFERENCES=$refs
# each pass's wall time and the CPU seconds it and its children took (bash's time: user + system): on a 2-core
# machine a pass cannot end sooner than its CPU seconds over 2
exec 3>&2 4>&1
pass() {   # pass NAME COMMAND...: runs it, its output where ours goes; sets rc, wall and cpu
    local TIMEFORMAT="%R %U %S" t
    t=$( { time "${@:2}" >&4 2>&3; } 2>&1 )
    rc=$?
    read -r wall user sys <<< "${t//,/.}"
    wall=${wall%.*} cpu=$(( ${user%.*} + ${sys%.*} ))
}
# the first pass lists the files holding tests of the serial kind (tests/kinds.py); given no file or test to
# run, the serial pass collects those, not every file again (3-5 s of a 2-core machine's)
list=(--teye-serial-list="$refs/serial-modules")   # (one word: pytest reads a lone value as a path)
pass parallel "$py" -m pytest --durations=25 --teye-pass=parallel ${par[@]+"${par[@]}"} "${list[@]}" "$@"
rc1=$rc p1="exit $rc in $wall s, $cpu CPU s"
pass serial "$py" -m pytest --durations=25 --teye-pass=serial "${list[@]}" "$@"
rc2=$rc p2="exit $rc in $wall s, $cpu CPU s"
echo "tests/passes.sh: parallel pass ($workers workers) $p1; serial pass $p2" >&2
if [ "$rc1" = 5 ] && [ "$rc2" = 5 ]; then
    echo "tests/passes.sh: pytest collected no tests in either pass: that is a failure, not a pass" >&2
    exit 1
fi
for rc in "$rc1" "$rc2"; do
    if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
exit 0
