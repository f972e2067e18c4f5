"""The prefix cache's disk tier: each rank's entries as files that outlive the engine.

engine/diskcache/files.py writes and reads one entry's file (structure.py turns its caches into plain data and
host arrays), tier.py keeps one folder of them as an LRU under a byte cap with a writer thread of its own,
identity.py names the folders and files (model identity, layout, precision, entry). No rank-0 logic here: rank 0's
index decides what is stored and restored, and every rank applies it to its own tier.
"""
