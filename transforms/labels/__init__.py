"""Where each image goes: its class, split, group and shard, from its relative path alone.
"""
