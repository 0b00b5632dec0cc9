"""The operator in a cluster: observe (read the API server and storage), act (apply decide's decisions), the
reconcile loop that joins them, what the operator remembers (Memory), the progress watcher, leader election
and metrics, all held by one Runtime that main.py makes. The local runner (local/) is its sibling."""
