"""What the job writes: shard pieces and their assembly, the description files, resume records, the lock and
publishing.
"""
