"""The lab: probes and investigations outside the papers (see lab/LOG.md)."""
