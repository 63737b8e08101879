#!/bin/sh
# teye job-report epilog: keeps a compact summary of each job's GPU efficiency with the job in Slurm's
# accounting (AdminComment), as Princeton's jobstats does, so `sacct -j ID -o AdminComment%1100` and later
# reports have it without Prometheus.  See docs/report.md ("Slurm epilog").
#
# slurm.conf (on the controller):   EpilogSlurmctld=/usr/local/libexec/teye/teye-epilog.sh
# It never fails the job and never holds it longer than TEYE_EPILOG_TIMEOUT seconds: every error is
# logged to syslog and the script exits 0.
#
# Settings (environment, or /etc/teye/epilog.env, sourced when present):
#   TEYE_PROMETHEUS_URL     the Prometheus that scraped the agents (or report.prometheus_url in TEYE_CONFIG)
#   TEYE_CONFIG             teye config file with report.* keys (default /etc/teye/teye.yml when present)
#   TEYE_EPILOG_TIMEOUT     seconds the report may take (default 20)
#   TEYE_EPILOG_MAX_BYTES   bound of the stored summary (default 1024 bytes)
#   TEYE_BIN                the teye command (default teye)
set -u

[ -r /etc/teye/epilog.env ] && . /etc/teye/epilog.env

JOB=${SLURM_JOB_ID:-${SLURM_JOBID:-}}
TEYE=${TEYE_BIN:-teye}
TIMEOUT=${TEYE_EPILOG_TIMEOUT:-20}
MAXBYTES=${TEYE_EPILOG_MAX_BYTES:-1024}
CONFIG=${TEYE_CONFIG:-/etc/teye/teye.yml}

log() { echo "teye-epilog: job ${JOB:-?}: $*" >&2; logger -t teye-epilog -- "job ${JOB:-?}: $*" 2>/dev/null || true; }

# a job id is a number (an array task as <number>_<number>); anything else is refused before it is used
case "$JOB" in
    ''|*[!0-9_]*|_*|*_|*_*_*) log "no usable SLURM_JOB_ID ('$JOB'): not a number; nothing stored"; exit 0 ;;
esac
case "$TIMEOUT" in ''|*[!0-9]*) TIMEOUT=20 ;; esac
case "$MAXBYTES" in ''|*[!0-9]*) MAXBYTES=1024 ;; esac

# What the job was given, for CPU efficiency and the memory note (absent fields are simply left out).
INFO=$(timeout 5 scontrol show job -o "$JOB" 2>/dev/null || true)
CPUS=$(printf '%s\n' "$INFO" | tr ' ' '\n' | sed -n 's/^NumCPUs=\([0-9][0-9]*\)$/\1/p' | head -n 1)
MEM=$(printf '%s\n' "$INFO" | tr ' ' '\n' | sed -n 's/^MinMemoryNode=\([0-9][0-9.]*[KMGT]\{0,1\}\)$/\1/p' | head -n 1)

set -- report --slurm-job "$JOB" --format summary --max-bytes "$MAXBYTES" --timeout "$TIMEOUT"
[ -n "$CPUS" ] && set -- "$@" --cpus "$CPUS"
[ -n "$MEM" ] && [ "$MEM" != "0" ] && set -- "$@" --mem "$MEM"
[ -r "$CONFIG" ] && set -- "$@" --config "$CONFIG"

# The report's own exit status says what was partial (docs/report.md); the summary carries it as "x".
SUMMARY=$(timeout -k 2 "$TIMEOUT" "$TEYE" "$@" 2>/dev/null)
RC=$?
if [ -z "$SUMMARY" ]; then
    log "teye report gave no summary (exit $RC; 3 Prometheus down, 4 timeout, 5 TLS, 6 auth, 124 killed)"
    SUMMARY="{\"v\":1,\"job\":\"$JOB\",\"err\":$RC}"
fi
# never store more than the bound, whatever the report printed
if [ "$(printf %s "$SUMMARY" | wc -c)" -gt "$MAXBYTES" ]; then
    SUMMARY="{\"v\":1,\"job\":\"$JOB\",\"t\":1}"
fi

if ! timeout 10 sacctmgr -i modify job where jobid="$JOB" set AdminComment="teye1:$SUMMARY" >/dev/null 2>&1; then
    log "sacctmgr could not store the summary"
fi
exit 0
