"""What the job reads: the listing of the input folder, manifests, metadata files, an existing dataset's sources,
duplicates.
"""
