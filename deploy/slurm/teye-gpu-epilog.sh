#!/bin/sh
# teye GPU allocation epilog: removes the job from the per-GPU files teye-gpu-prolog.sh wrote (a file
# that no longer names any job is deleted).  Runs as root on the GPU node after the job (slurm.conf
# Epilog=...).  Never fails: errors go to syslog and the script exits 0.  A file left behind because
# this did not run is recognised by the agent (the job has no cgroup any more) and not exported.
set -u

[ -r /etc/teye/gpu-prolog.env ] && . /etc/teye/gpu-prolog.env

DIR=${TEYE_GPU_JOB_DIR:-/run/teye/gpu-jobs}
JOB=${SLURM_JOB_ID:-${SLURM_JOBID:-}}

log() { echo "teye-gpu-epilog: job ${JOB:-?}: $*" >&2; logger -t teye-gpu-epilog -- "job ${JOB:-?}: $*" 2>/dev/null || true; }
is_index() { case "$1" in ''|*[!0-9.]*|.*|*.|*.*.*) return 1 ;; esac; }

case "$JOB" in ''|*[!0-9]*) log "no usable SLURM_JOB_ID ('$JOB'): not a number; nothing changed"; exit 0 ;; esac
[ -d "$DIR" ] || exit 0

(
    flock -w 10 9 || { log "cannot lock $DIR/.lock"; exit 0; }
    for f in "$DIR"/*; do
        [ -f "$f" ] || continue
        is_index "${f##*/}" || continue      # only the prolog's files (a GPU index as name)
        grep -qx "$JOB" "$f" 2>/dev/null || continue
        if grep -vx "$JOB" "$f" > "$f.tmp.$$" 2>/dev/null; then
            chmod 644 "$f.tmp.$$" && mv -f "$f.tmp.$$" "$f"
        else
            rm -f "$f.tmp.$$" "$f"            # nothing else in it: the GPU is free
        fi
    done
) 9>"$DIR/.lock"
exit 0
