# Sourced by the MPI test scripts: how they launch mpirun.
# CI runs as root on 2 cores, so ranks are oversubscribed and root must be allowed.
MPI_FLAGS=(--allow-run-as-root --oversubscribe)
export OMPI_MCA_rmaps_base_oversubscribe=1
# Containers often forbid the cross-memory attach that Open MPI's shared-memory transport
# uses for large messages; plain copies work everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# Seconds since the epoch, with a fraction, for measuring how fast a job ends.
now() { date +%s.%N; }
seconds_since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$1" "$(now)"; }
