"""Beam transforms for image-to-TFRecord conversion, and the plain functions they call."""
