#!/usr/bin/env bash
# Launched by mpirun once per rank: rank 1 writes its pid to PIDFILE (so a test can kill or
# stop it), then every rank becomes COMMAND (exec keeps the pid).
# usage: rank_wrapper.sh PIDFILE COMMAND [ARGS...]
pidfile=$1
shift
if [[ ${OMPI_COMM_WORLD_RANK:-} == 1 ]]; then echo $$ >"$pidfile"; fi
exec "$@"
