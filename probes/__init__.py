"""What the machine is: topology probes (filled by the probes work)."""
