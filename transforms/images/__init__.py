"""Converting images: decode, orient, resize, encode, on the fast core or Pillow, and their statistics.
"""
