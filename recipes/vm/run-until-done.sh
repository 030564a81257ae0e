#!/bin/sh
# A bare VM (or any machine without a scheduler): run the training command until it finishes. After a notice the
# trainer checkpoints and exits; this loop starts it again and it resumes. DONE.json in the root means finished.
#
#   recipes/vm/run-until-done.sh /ckpt/run1 python train.py --root /ckpt/run1
#
# On a spot VM the machine itself goes away after the notice: run this from the VM's startup (systemd, below), so a
# replacement VM with the same disk or bucket picks the run up. Run in tests/unit/test_recipes.py.
#
# systemd (/etc/systemd/system/train.service):
#   [Service]
#   ExecStart=/opt/train/recipes/vm/run-until-done.sh /ckpt/run1 python /opt/train/train.py --root /ckpt/run1
#   Restart=on-failure
#   KillMode=control-group  # (the default) SIGTERM to every process of the unit: the trainer hears it too
#   TimeoutStopSec=120      # the window: SIGKILL after that
#   [Install]
#   WantedBy=multi-user.target
set -u
root=$1
shift
attempt=0
until [ -f "$root/DONE.json" ]; do
    attempt=$((attempt + 1))
    echo "run-until-done: attempt $attempt"
    code=0
    preemptible run -- "$@" || code=$?
    case $code in
        0|143) ;;                      # stopped after a notice (checkpoint committed), or finished
        75) sleep 5 ;;                 # the emergency save failed: the previous checkpoint is intact; try again
        *) echo "run-until-done: the trainer failed with exit code $code; not restarting" >&2; exit "$code" ;;
    esac
    [ -f "$root/STOP" ] && { echo "run-until-done: $root/STOP found; stopping"; exit 0; }
done
echo "run-until-done: finished ($root/DONE.json)"
