"""bench/chaos.py's parts: the deployment, the work and people, the faults, the viewers, the
accounting."""
