#!/usr/bin/env bash
# Single-node training under Slurm, one command to submit:
#
#   scripts/train-singlenode.sh CONFIG [NODE] [-- EXTRA ARGS FOR 'dstrain train']
#
# Submits scripts/train.sbatch as a one-node job (on NODE when given: sbatch --nodelist), NPROC
# ranks there; the same preemption handling as scripts/train.sbatch (SIGUSR1 → checkpoint,
# requeue, resume from the config's checkpoint.dir/latest). Environment: see scripts/train.sbatch.
set -euo pipefail
config=${1:?usage: scripts/train-singlenode.sh CONFIG [NODE] [-- EXTRA ARGS]}
shift
node_args=()
if [ $# -gt 0 ] && [ "$1" != "--" ]; then node_args=(--nodelist="$1"); shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC2086
exec sbatch --nodes=1 "${node_args[@]}" ${SBATCH_ARGS:-} "$here/train.sbatch" "$config" 1 -- "$@"
