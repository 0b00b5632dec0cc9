"""The MPIJob launcher's entry (mpirun): wait for the workers' sshd, then exec mpirun."""
