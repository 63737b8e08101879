#!/bin/sh
# Slurm TaskProlog: zero-code training phases for every task on this node (docs/zero-code.md).
#
#   slurm.conf:  TaskProlog=/etc/slurm/teye-taskprolog.sh
#   install:     install -m 0755 deploy/slurm/taskprolog.sh /etc/slurm/teye-taskprolog.sh
#
# slurmstepd runs this as the job's user, in the task's environment, before each task, and
# applies the "export NAME=value" lines it prints (literally: no shell expansion).  It prints
# PYTHONPATH with teye's site directory (installed by deploy/install.sh) in front of the
# task's own PYTHONPATH.  A job opts out with `export TEYE_AUTO=0` (sbatch --export or its script):
# the directory is still on the path, and its sitecustomize does nothing but run the next one.
# The job name is taken from SLURM_JOB_ID (+ step, array ids) unless TEYE_TRAIN_JOB is set.
TEYE_SITE=${TEYE_SITE:-/opt/teye/site}

[ -f "$TEYE_SITE/sitecustomize.py" ] || exit 0        # teye not installed here: change nothing
case ":${PYTHONPATH:-}:" in
    *":$TEYE_SITE:"*) exit 0 ;;                         # already on (e.g. a nested step)
esac
echo "export PYTHONPATH=$TEYE_SITE${PYTHONPATH:+:$PYTHONPATH}"
