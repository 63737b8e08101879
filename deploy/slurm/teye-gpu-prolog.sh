#!/bin/sh
# teye GPU allocation prolog: one file per GPU allocated to the job, naming the job, so the agent sees GPUs
# that were allocated and never used (they have no process).  The directory format is the one
# dcgm-exporter's --hpc-job-mapping-dir reads (file name: the GPU's index, or <index>.<GPU instance id>
# for a MIG instance; content: the job ids holding it, one per line): point both at the same directory and
# one prolog serves both.  See docs/operations.md ("GPU allocation").
#
# slurm.conf (on every GPU node; Prolog runs as root before the job starts):
#   Prolog=/usr/local/libexec/teye/teye-gpu-prolog.sh
#   Epilog=/usr/local/libexec/teye/teye-gpu-epilog.sh
#   PrologFlags=Alloc          (so the prolog runs at allocation, also for jobs that start no step)
#
# The GPUs come from SLURM_JOB_GPUS (the indices Slurm allocated, e.g. "0,1,2,3"; MIG instances as
# "2.1").  It never fails the job: errors go to syslog and the script exits 0.
# Settings (environment, or /etc/teye/gpu-prolog.env): TEYE_GPU_JOB_DIR (default /run/teye/gpu-jobs, the
# agent's allocation.slurm_mapping_dir).
set -u
set -f          # SLURM_JOB_GPUS is split on commas below: a "*" in it must not glob

[ -r /etc/teye/gpu-prolog.env ] && . /etc/teye/gpu-prolog.env

DIR=${TEYE_GPU_JOB_DIR:-/run/teye/gpu-jobs}
JOB=${SLURM_JOB_ID:-${SLURM_JOBID:-}}
GPUS=${SLURM_JOB_GPUS:-}

# every message also goes to stderr (slurmd's log), one line each
log() { echo "teye-gpu-prolog: job ${JOB:-?}: $*" >&2; logger -t teye-gpu-prolog -- "job ${JOB:-?}: $*" 2>/dev/null || true; }
# a GPU index: a number, or <number>.<number> for a MIG instance; nothing else becomes a file name
is_index() { case "$1" in ''|*[!0-9.]*|.*|*.|*.*.*) return 1 ;; esac; }

case "$JOB" in ''|*[!0-9]*) log "no usable SLURM_JOB_ID ('$JOB'): not a number; nothing written"; exit 0 ;; esac
[ -n "$GPUS" ] || exit 0                      # a job without GPUs
mkdir -p "$DIR" 2>/dev/null && chmod 755 "$DIR" 2>/dev/null || { log "cannot create $DIR"; exit 0; }

(
    flock -w 10 9 || { log "cannot lock $DIR/.lock"; exit 0; }
    IFS=,                                       # split on commas only: "1 x" is one (bad) entry
    for gpu in $GPUS; do
        is_index "$gpu" || { log "skipping GPU '$gpu' from SLURM_JOB_GPUS: not a GPU index (N or N.M)"; continue; }
        f="$DIR/$gpu"
        # a GPU shared by jobs (sharding, OverSubscribe) lists each job once
        { [ -f "$f" ] && grep -vx "$JOB" "$f"; echo "$JOB"; } > "$f.tmp.$$" 2>/dev/null &&
            chmod 644 "$f.tmp.$$" && mv -f "$f.tmp.$$" "$f" || { rm -f "$f.tmp.$$"; log "cannot write $f"; }
    done
) 9>"$DIR/.lock"
exit 0
