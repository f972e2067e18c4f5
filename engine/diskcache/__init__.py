"""The prefix cache's disk tier: one folder of entry files per rank (stand-in until the disk-files branch lands)."""
